"""A session killed with SIGKILL loses nothing it flushed: load_trace recovers the partial file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import zlib
from pathlib import Path

import numpy as np
import pytest

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import load_trace
from cuvil_pgc.trace.schema import Kind
from tests.test_reader_invariants import DATA, assert_valid_trace

RECORDER = textwrap.dedent("""
    import sys, time
    from cuvil_pgc import ProfileRegion, profile
    with profile(sys.argv[1], ops=False, gpu="off", sample_hz=0, compile=False, flush_interval_s=0.1):
        i = 0
        while True:
            with ProfileRegion("step", i=i):
                with ProfileRegion("inner"):
                    time.sleep(0.0002)
            i += 1
""")
MIN_VISIBLE = 300


def _visible_regions(partial: Path) -> int:
    """Regions a reader could see in the partial file right now (complete lines only)."""
    try:
        data = partial.read_bytes()
    except FileNotFoundError:
        return 0
    if data[:2] == b"\x1f\x8b":
        data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(data)
    complete = data[: data.rfind(b",\n") + 1]
    return complete.count(b'"cat":"region"')


@pytest.mark.parametrize("name", ["run.trace.json", "run.trace.json.gz"])
def test_sigkill_keeps_every_flushed_region(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    partial = Path(str(path) + ".partial")
    proc = subprocess.Popen([sys.executable, "-c", RECORDER, str(path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        visible = 0
        while visible < MIN_VISIBLE:
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, f"only {visible} regions flushed in 60 s"
            time.sleep(0.05)
            visible = _visible_regions(partial)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not path.exists() and partial.exists()

    trace = load_trace(path)                      # finds the .partial by itself
    assert_valid_trace(trace)
    src = trace.sources[0]
    assert src.recovered and src.path == str(partial)
    assert any("partial" in note for note in src.notes)
    assert src.metadata["pid"] == proc.pid and isinstance(src.metadata["start_unix_ns"], int)
    regions = trace.of_kind(Kind.REGION)
    assert len(regions) >= visible
    _assert_tree_consistent(trace, regions)


def _assert_tree_consistent(trace, regions: np.ndarray) -> None:
    ids = trace.region_id[regions]
    assert len(np.unique(ids)) == len(ids), "region ids are unique"
    by_id = {int(i): int(r) for i, r in zip(ids, regions, strict=True)}
    orphans = 0
    for r in regions.tolist():
        path = trace.strings[trace.region[r]]
        if trace.strings[trace.name[r]] == "step":
            assert path == "step" and trace.parent_id[r] == -1
            continue
        assert path == "step/inner"
        parent = by_id.get(int(trace.parent_id[r]))
        if parent is None:          # the inner region finished and was flushed, its step was not
            orphans += 1
            continue
        assert trace.ts[parent] <= trace.ts[r]
        assert trace.ts[r] + trace.dur[r] <= trace.ts[parent] + trace.dur[parent] + 1e-6
    assert orphans <= 1


def test_partial_path_can_be_passed_directly(tmp_path: Path) -> None:
    src = DATA / "ours" / "crashed.trace.json.partial"
    copy = tmp_path / src.name
    shutil.copy(src, copy)
    trace = load_trace(copy)
    assert trace.sources[0].recovered
    assert any("incomplete last line" in n for n in trace.sources[0].notes)
    assert len(trace) == len(load_trace(tmp_path / "crashed.trace.json"))
    _assert_tree_consistent(trace, trace.of_kind(Kind.REGION))


def test_truncated_gzip_partial_recovers_up_to_the_damage(tmp_path: Path) -> None:
    data = (DATA / "ours" / "crashed_gz.trace.json.gz.partial").read_bytes()
    full = load_trace(DATA / "ours" / "crashed_gz.trace.json.gz")
    assert full.sources[0].recovered
    cut = tmp_path / "cut.trace.json.gz.partial"
    cut.write_bytes(data[: len(data) * 2 // 3])
    trace = load_trace(cut)
    assert_valid_trace(trace)
    assert 0 < len(trace) < len(full)
    assert any("gzip" in n for n in trace.sources[0].notes)
    corrupt = tmp_path / "corrupt.trace.json.gz.partial"
    corrupt.write_bytes(data[:1200] + bytes(b ^ 0x5A for b in data[1200:1400]) + data[1400:])
    assert_valid_trace(load_trace(corrupt))


def test_damaged_middle_line_is_skipped_with_a_note(tmp_path: Path) -> None:
    lines = (DATA / "ours" / "crashed.trace.json.partial").read_bytes().split(b",\n")
    lines[3] = b'{"ph":"X","cat":"region",' + b"\x00garbage"
    path = tmp_path / "x.trace.json.partial"
    path.write_bytes(b",\n".join(lines))
    trace = load_trace(path)
    assert any("damaged line" in n for n in trace.sources[0].notes)
    assert len(trace) == len(load_trace(DATA / "ours" / "crashed.trace.json")) - 1


def test_partial_of_a_session_that_finished_writing_but_not_renaming(tmp_path: Path) -> None:
    path = tmp_path / "done.trace.json.partial"
    shutil.copy(DATA / "ours" / "regions.trace.json", path)
    trace = load_trace(path)
    assert trace.sources[0].recovered and len(trace) == 9
    assert "complete JSON" in trace.sources[0].notes[1]


def test_partial_with_nothing_recoverable(tmp_path: Path) -> None:
    path = tmp_path / "empty.trace.json.partial"
    path.write_bytes(b'{"traceEvents":[\n{"ph":"M","name":"cuvil_ses')
    trace = load_trace(path)
    assert len(trace) == 0 and trace.sources[0].recovered
    bad = tmp_path / "bad.trace.json.partial"
    bad.write_bytes(b"hello world")
    with pytest.raises(TraceError, match="does not start like one"):
        load_trace(bad)
