"""Streaming large Kineto files chunk by chunk gives exactly what reading them whole gives."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import _stream, load_trace, reader
from tests.test_kineto_generations import GEN, RESNET_FILES
from tests.test_reader_invariants import DATA

CASES = [DATA / "kineto_gpu" / "gpu_two_regions.json", DATA / "kineto_cpu" / "cpu_annotated.json.gz",
         GEN / "torch18_capitalised.json", GEN / "ns_flows.json", GEN / "profiler_range.json",
         GEN / "gpu_figures.json", *RESNET_FILES[:1]]


def _load(path: Path, monkeypatch, stream: bool, chunk: int = 700):
    used: list[bool] = []
    real = reader._load_streamed

    def spy(*args):
        got = real(*args)
        used.append(got is not None)
        return got

    with monkeypatch.context() as m:
        m.setattr(_stream, "STREAM_MIN_BYTES", 0 if stream else 1 << 62)
        m.setattr(_stream, "CHUNK_BYTES", chunk)
        m.setattr(reader, "_load_streamed", spy)
        trace = load_trace(path)
    assert used == [stream] or not stream and used == [False]
    return trace


def _view(trace) -> dict:
    """The trace with interned indices resolved, so interning order does not matter."""
    def named(i: int):
        return trace.strings[int(i)] if i >= 0 else None

    def ident(i: int):
        return trace.strings[-2 - int(i)] if i < -1 else int(i)

    ev = trace.events
    out = {k: v for k, v in ev.items() if k not in ("name", "region", "pid", "tid")}
    out["name"] = [named(i) for i in ev["name"]]
    out["region"] = [named(i) for i in ev["region"]]
    out["pid"] = [ident(i) for i in ev["pid"]]
    out["tid"] = [ident(i) for i in ev["tid"]]
    out["args"] = {r: trace.args[r] for r in trace.args}
    out["counters"] = [(trace.strings[n], t, v) for n, t, v in zip(*(trace.counters[k] for k in ("name", "ts", "value")),
                                                                   strict=True)]
    src = trace.sources[0]
    out["source"] = (src.format, src.rank, src.notes, src.warnings, {k: v for k, v in src.metadata.items()})
    return out


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_streamed_equals_whole(path: Path, monkeypatch) -> None:
    whole, streamed = _view(_load(path, monkeypatch, False)), _view(_load(path, monkeypatch, True))
    assert whole.keys() == streamed.keys()
    for key in whole:
        a, b = whole[key], streamed[key]
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=key)
        else:
            assert a == b, key


def test_a_cut_inside_a_string_is_retried(tmp_path: Path, monkeypatch) -> None:
    doc = json.loads((GEN / "gpu_figures.json").read_text())
    for e in doc["traceEvents"]:
        e["name"] += ' }, {"ph": "X"} ' * 3       # boundary look-alikes inside strings
    path = tmp_path / "tricky.json"
    path.write_text(json.dumps(doc, indent=1))
    whole, streamed = _view(_load(path, monkeypatch, False)), _view(_load(path, monkeypatch, True, chunk=300))
    assert whole["name"] == streamed["name"] and whole["args"] == streamed["args"]


def test_damaged_streamed_file_reports_like_a_whole_one(tmp_path: Path, monkeypatch) -> None:
    text = (GEN / "gpu_figures.json").read_text()
    path = tmp_path / "cut.json"
    path.write_text(text[: len(text) * 2 // 3])
    with pytest.raises(TraceError) as whole:
        _load(path, monkeypatch, False)
    with monkeypatch.context() as m, pytest.raises(TraceError) as streamed:
        m.setattr(_stream, "STREAM_MIN_BYTES", 0)
        m.setattr(_stream, "CHUNK_BYTES", 200)
        load_trace(path)
    assert str(whole.value) == str(streamed.value) and "truncated" in str(streamed.value)
