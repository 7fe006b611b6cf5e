"""Streaming large Kineto files chunk by chunk gives exactly what reading them whole gives."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import _stream, load_trace, reader
from tests.test_kineto_generations import GEN, RESNET_FILES
from tests.test_reader_invariants import DATA

CASES = [DATA / "kineto_gpu" / "gpu_two_regions.json", DATA / "kineto_cpu" / "cpu_annotated.json.gz",
         DATA / "kineto_cpu" / "with_stack.json.gz",       # module calls as regions (test_profiler_module_regions)
         GEN / "torch18_capitalised.json", GEN / "ns_flows.json", GEN / "profiler_range.json",
         GEN / "gpu_figures.json", *RESNET_FILES[:1],
         DATA / "kineto_real" / "kineto_h100_cuda_sync.json"]     # rebased µs (trace._clock)


def _load(path: Path, monkeypatch, stream: bool, chunk: int = 700):
    used: list[bool] = []
    real = reader._load_streamed

    def spy(*args):
        got = real(*args)
        used.append(got is not None)
        return got

    with monkeypatch.context() as m:
        m.setenv("CUVIL_READ_WORKERS", "0")       # the sequential streamer (test_parallel_* fork workers)
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


def test_an_array_of_blanks_is_read_whole_before_the_stream_gathers_it(tmp_path: Path, monkeypatch) -> None:
    """A gzip of 12 MB holding 12 GB of blanks inside its event array: the stream gathered blocks
    looking for an event boundary, copying all it held at each (hours); past ``MAX_EVENT_BYTES``
    without one it gives the file to the whole-file reader, whose size limit (`analyze` said so in
    7 s) or its "no events" names it."""
    path = tmp_path / "blank.json"
    path.write_text('{"traceEvents":[' + " " * 200_000 + "]}")
    whole = _view(_load(path, monkeypatch, False))
    read: list[int] = []
    real = _stream._blocks

    def counted(*args):
        for block in real(*args):
            read.append(len(block))
            yield block

    with monkeypatch.context() as m:
        m.setenv("CUVIL_READ_WORKERS", "0")
        m.setattr(_stream, "STREAM_MIN_BYTES", 0)
        m.setattr(_stream, "CHUNK_BYTES", 1000)
        m.setattr(_stream, "MAX_EVENT_BYTES", 5000)
        m.setattr(_stream, "_blocks", counted)
        streamed = _view(load_trace(path))
    assert whole["source"] == streamed["source"] and whole["name"] == streamed["name"] == []
    assert 5 <= len(read) <= 8         # gathered just past the limit, not to the file's end (200 blocks)


_PARALLEL_CHILD = """
import pickle, sys
from cuvil_pgc.trace import _parallel, _stream, load_trace
from tests.test_stream import _view
_stream.STREAM_MIN_BYTES, _stream.CHUNK_BYTES = 0, int(sys.argv[1].split(":")[0])
used = []
real = _parallel.read_parallel
def spy(*args):
    try:
        got = real(*args)
    except _parallel.StreamFallback:
        used.append(False)
        raise
    used.append(got is not None)
    return got
_parallel.read_parallel = spy
if sys.argv[1].endswith(":kill"):      # a worker dies on its second piece
    real_piece = _parallel._read_piece
    calls = []
    def dying(*args):
        calls.append(1)
        if len(calls) == 2:
            import os
            os._exit(3)
        return real_piece(*args)
    _parallel._read_piece = dying
views = []
for path in sys.argv[2:]:
    used.clear()
    if sys.argv[1].endswith(":progress"):     # under a live progress display, as the CLI on a terminal
        import io, threading
        from rich.console import Console
        from cuvil_pgc.viewer.progress import stage_progress
        console = Console(file=io.StringIO(), force_terminal=True)
        with stage_progress(1, console=console, enabled=True) as progress:
            assert threading.active_count() > 1          # the display's refresh thread
            with progress.stage("loading"):
                trace = load_trace(path)
            assert threading.active_count() > 1          # started again after the fork
    else:
        trace = load_trace(path)
    views.append((_view(trace), list(used)))
sys.stdout.buffer.write(pickle.dumps(views))
"""


def _parallel_views(paths: list[Path], chunk: int | str) -> list[tuple[dict, list[bool]]]:
    """Each file loaded by forked readers in a fresh process (a process with no other thread, as the
    CLI's is), with its view and whether the parallel reader produced it."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-c", _PARALLEL_CHILD, str(chunk), *map(str, paths)], cwd=root,
                          capture_output=True, env={**__import__("os").environ, "CUVIL_READ_WORKERS": "2"},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return pickle.loads(proc.stdout)


def test_parallel_read_equals_whole(monkeypatch, tmp_path) -> None:
    """Plain files read by two forked workers in several pieces give exactly the whole-file trace;
    gzip files are read by the sequential streamer (and, decompressed, in parallel: the real
    ResNet-50 trace among them)."""
    import gzip

    plain = [tmp_path / p.name.removesuffix(".gz") for p in CASES if p.name.endswith(".gz")]
    for path in plain:
        path.write_bytes(gzip.decompress((next(c for c in CASES if c.name == path.name + ".gz")).read_bytes()))
    cases = CASES + plain
    got = _parallel_views(CASES, chunk=700) + _parallel_views(plain, chunk=4 << 20)   # 9 pieces of a 35 MB trace
    for path, (view, used) in zip(cases, got, strict=True):
        assert used == [not path.name.endswith(".gz")], path.name
        whole = _view(_load(path, monkeypatch, False))
        assert whole.keys() == view.keys()
        for key in whole:
            a, b = whole[key], view[key]
            if isinstance(a, np.ndarray):
                np.testing.assert_array_equal(a, b, err_msg=f"{path.name}: {key}")
            else:
                assert a == b, f"{path.name}: {key}"


def test_parallel_read_falls_back_when_a_cut_lands_inside_a_string(tmp_path: Path, monkeypatch) -> None:
    doc = json.loads((GEN / "gpu_figures.json").read_text())
    for e in doc["traceEvents"]:
        e["name"] += ' }, {"ph": "X"} ' * 40      # boundary look-alikes wherever a piece is cut
    path = tmp_path / "tricky.json"
    path.write_text(json.dumps(doc, indent=1))
    [(view, used)] = _parallel_views([path], chunk=300)
    assert used == [False]                        # a worker's decode failed: the sequential streamer read it
    whole = _view(_load(path, monkeypatch, False))
    assert whole["name"] == view["name"] and whole["args"] == view["args"]


def test_parallel_read_pauses_a_progress_display_for_the_fork(monkeypatch) -> None:
    """The CLI's progress display runs a refresh thread on terminals; it stops for the moment of the
    fork (a fork copies no other thread) and starts again, so large traces are still read in parallel."""
    path = GEN / "gpu_figures.json"
    [(view, used)] = _parallel_views([path], chunk="300:progress")
    assert used == [True]
    whole = _view(_load(path, monkeypatch, False))
    assert whole["name"] == view["name"] and whole["args"] == view["args"]


def test_parallel_read_falls_back_when_a_worker_dies(monkeypatch) -> None:
    path = GEN / "gpu_figures.json"
    [(view, used)] = _parallel_views([path], chunk="300:kill")
    assert used == [False]
    whole = _view(_load(path, monkeypatch, False))
    assert whole["name"] == view["name"] and whole["args"] == view["args"]


def test_parallel_pieces_are_cut_at_event_boundaries(tmp_path: Path) -> None:
    from cuvil_pgc.trace import _parallel

    events = [{"ph": "X", "name": f"op{i}", "ts": i, "dur": 1, "pid": 1, "tid": 1} for i in range(200)]
    path = tmp_path / "t.json"
    text = json.dumps({"traceEvents": events}, indent=2)
    path.write_text(text)
    start = text.index("[") + 1
    ranges = _parallel.piece_ranges(str(path), start, len(text), 500)
    assert len(ranges) > 5 and ranges[-1][1:] == (-1, True)
    decoded = []
    for first, end, last in ranges:
        body = text[first:] if last else text[first:end]
        decoded += json.loads("[" + body + ("" if last else "]"))[:len(events)] if not last else \
            json.loads('{"traceEvents": [' + body)["traceEvents"]
    assert decoded == events                      # every event once, in order


def test_a_dead_reading_worker_is_a_fallback_not_an_error(tmp_path: Path) -> None:
    """Sending a piece to a worker that died (a broken pipe) falls back to the sequential reader
    instead of failing the load (waiting on one: test_parallel_read_falls_back_when_a_worker_dies)."""
    from cuvil_pgc.trace import _parallel
    from cuvil_pgc.trace._chunks import StreamFallback

    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "a", "ts": 1, "dur": 1, "pid": 1, "tid": 1}]}))
    with _parallel._Workers(1) as pool:
        pool.procs[0].kill()
        pool.procs[0].join()
        with pytest.raises(StreamFallback, match="a reading worker died"):
            list(pool.map(str(path), [(16, -1, True)]))
