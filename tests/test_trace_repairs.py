"""Defects that real Kineto traces carry, injected into a real one (the V100 ResNet-50 trace of
tests/data/kineto_resnet50) as the public reports describe them, read whole and streamed:

- ``ts: 0, dur: 0`` kernels (pytorch/kineto#109): read as they were, the trace's span, GPU idle
  time and the time outside regions became 1.6e9 s;
- stream events running seconds past later work on their stream (AMD-AGI/Hyperloom#1116: seven
  events made 62% of a trace's GPU time): the GPU was "94% busy".

The clean trace must trip neither repair: 8,772 real kernels, none changed."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from cuvil_pgc.trace._repairs import clip_overruns
from cuvil_pgc.trace.schema import Kind
from tests.test_stream import _load as load_streamed_or_whole

TRACE = Path(__file__).resolve().parent / "data" / "kineto_resnet50" / \
    "resnet50_num_workers_0_worker0.1623143089861.pt.trace.json.gz"

real_trace = pytest.mark.skipif(not TRACE.is_file(), reason=f"the real trace is missing ({TRACE})")


def _doc() -> dict:
    return json.loads(gzip.open(TRACE).read())


def _load(doc: dict, tmp_path: Path, monkeypatch, streamed: bool):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(doc))
    return load_streamed_or_whole(path, monkeypatch, streamed, chunk=1 << 20)


def _kernels(trace) -> tuple[int, float, float]:
    """(kernel rows, their summed duration in µs, the span of all rows in µs)."""
    ev = trace.events
    k = ev["kind"] == 2
    return int(k.sum()), float(ev["dur"][k].sum()), float((ev["ts"] + ev["dur"]).max() - ev["ts"].min())


def _warnings(trace) -> list[str]:
    return [w for s in trace.sources for w in s.warnings]


@pytest.mark.slow
@real_trace
@pytest.mark.parametrize("streamed", [False, True])
def test_the_clean_real_trace_is_not_repaired(tmp_path, monkeypatch, streamed):
    trace = _load(_doc(), tmp_path, monkeypatch, streamed)
    assert _kernels(trace)[0] == 8772
    assert not any("ts 0" in w or "hold two later events" in w for w in _warnings(trace)), _warnings(trace)


@pytest.mark.slow
@real_trace
@pytest.mark.parametrize("streamed", [False, True])
def test_kernels_kineto_wrote_at_ts_0_are_left_out_and_counted(tmp_path, monkeypatch, streamed):
    clean = _kernels(_load(_doc(), tmp_path, monkeypatch, False))
    doc = _doc()
    zeroed = 0
    for i, e in enumerate(doc["traceEvents"]):
        if str(e.get("cat")).lower() == "kernel" and i % 300 == 0:
            e["ts"], e["dur"] = 0, 0
            zeroed += 1
    trace = _load(doc, tmp_path, monkeypatch, streamed)
    kernels, _, span = _kernels(trace)
    assert kernels == 8772 - zeroed and span == pytest.approx(clean[2], rel=1e-6)
    assert any(w.startswith(f"{zeroed} events at ts 0 with no duration") for w in _warnings(trace)), _warnings(trace)


@pytest.mark.slow
@real_trace
@pytest.mark.parametrize("streamed", [False, True])
def test_kernels_running_seconds_past_their_stream_are_cut_at_the_next_start(tmp_path, monkeypatch, streamed):
    clean = _kernels(_load(_doc(), tmp_path, monkeypatch, False))
    doc = _doc()
    hit = [i for i, e in enumerate(doc["traceEvents"]) if str(e.get("cat")).lower() == "kernel"][5000:5003]
    for i in hit:                                   # three in a row, each 3.4 s long
        doc["traceEvents"][i]["dur"] = 3_400_000.0
    trace = _load(doc, tmp_path, monkeypatch, streamed)
    kernels, busy, span = _kernels(trace)
    assert kernels == 8772 and span == pytest.approx(clean[2], rel=1e-6)
    assert busy == pytest.approx(clean[1], rel=0.01)          # cut at the next start: about what they ran
    assert any(w.startswith("3 GPU events hold two later events of their stream whole") for w in _warnings(trace))


def _stream_cols(*spans, tid=None):
    n = len(spans)
    return {"kind": np.full(n, Kind.KERNEL, dtype=np.uint8), "pid": np.zeros(n, np.int64),
            "tid": np.array(tid if tid is not None else [7] * n, np.int64),
            "ts": np.array([a for a, _ in spans], float), "dur": np.array([b - a for a, b in spans], float)}


def test_only_an_event_holding_two_later_ones_of_its_stream_for_seconds_is_cut():
    s = 1e6                                                    # µs
    pdl = _stream_cols((0, 10 * s), (5 * s, 15 * s), (15 * s, 20 * s), (20 * s, 30 * s))   # PDL: kept
    assert clip_overruns(pdl) == (0, 0.0) and pdl["dur"].tolist() == [10 * s, 10 * s, 5 * s, 10 * s]
    one = _stream_cols((0, 18 * s), (5 * s, 15 * s), (15 * s, 20 * s))         # holds one later event whole: kept
    assert clip_overruns(one) == (0, 0.0)
    broken = _stream_cols((0, 100 * s), (10 * s, 20 * s), (30 * s, 40 * s), (50 * s, 60 * s))
    assert clip_overruns(broken) == (1, 90 * s) and broken["dur"].tolist() == [10 * s] * 4
    apart = _stream_cols((0, 100 * s), (10 * s, 20 * s), (30 * s, 40 * s), (50 * s, 60 * s), tid=[7, 8, 9, 10])
    assert clip_overruns(apart) == (0, 0.0)                    # other streams
    branch = _stream_cols((0, 2000), (10, 20), (30, 40), (50, 60))    # a graph's parallel branch, 2 ms: kept
    assert clip_overruns(branch) == (0, 0.0)
