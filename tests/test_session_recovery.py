"""A session survives what production does to it: a crash before a restart, a full or
unwritable disk at start, a flood before a crash, a fork. Each runs in separate processes where
production would (the recorder killed with SIGKILL, the restart a new process, the forked child).
"""

from __future__ import annotations

import errno
import gzip
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cuvil_pgc import ProfileRegion, profile
from cuvil_pgc.trace import load_trace
from cuvil_pgc.trace import writer as trace_writer
from cuvil_pgc.trace.schema import Kind

QUIET = dict(ops=False, gpu="off", sample_hz=0, compile=False)

RECORDER = textwrap.dedent("""
    import sys
    from cuvil_pgc import ProfileRegion, profile
    with profile(sys.argv[1], ops=False, gpu="off", sample_hz=0, compile=False, flush_interval_s=0.05,
                 buffer_events=int(sys.argv[2])):
        i = 0
        while True:
            with ProfileRegion("step", i=i):
                with ProfileRegion("inner"):
                    pass
            i += 1
""")

RESTART = textwrap.dedent("""
    import sys
    from cuvil_pgc import ProfileRegion, profile
    with profile(sys.argv[1], ops=False, gpu="off", sample_hz=0, compile=False) as s:
        with ProfileRegion("restarted"):
            pass
    print(s.path)
""")


def _kill_when(partial: Path, proc: subprocess.Popen, ready) -> None:
    """SIGKILL ``proc`` once the partial file's bytes satisfy ``ready``."""
    try:
        deadline = time.monotonic() + 60
        while not (partial.exists() and ready(partial.read_bytes())):
            assert proc.poll() is None, proc.stderr.read().decode()
            assert time.monotonic() < deadline, "the recorder wrote too little in 60 s"
            time.sleep(0.05)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


def _crash(path: Path, buffer_events: int = 1 << 18, ready=lambda data: data.count(b'"cat":"region"') >= 200):
    proc = subprocess.Popen([sys.executable, "-c", RECORDER, str(path), str(buffer_events)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _kill_when(Path(f"{path}.partial"), proc, ready)
    return proc.pid


def _region_names(path: Path) -> list[str]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        doc = json.load(f)
    return [e["name"] for e in doc["traceEvents"] if e.get("cat") == "region"]


# -- item 2: a crash does not block the restart ---------------------------------------------------
@pytest.mark.parametrize("suffix", [".trace.json", ".trace.json.gz"])
def test_a_restart_after_sigkill_records_and_keeps_the_crashed_partial(tmp_path, suffix):
    path = tmp_path / f"run{suffix}"
    dead = _crash(path, ready=lambda data: len(data) > 20_000)
    out = subprocess.run([sys.executable, "-c", RESTART, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(path) and _region_names(path) == ["restarted"]
    moved = tmp_path / f"run.crashed-{dead}{suffix}.partial"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([path.name, moved.name])
    assert out.stderr.count("was left by a session that did not finish") == 1
    assert f"process {dead}, which wrote it, is gone" in out.stderr and str(moved) in out.stderr
    opener = gzip.open if suffix.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        previous = json.load(f)["cuvil"]["previous_partial"]
    assert previous["moved_to"] == str(moved) and previous["pid"] == dead
    recovered = load_trace(moved)                       # the crashed session's events are all there
    assert recovered.sources[0].recovered and recovered.sources[0].metadata["pid"] == dead
    assert len(recovered.of_kind(Kind.REGION)) >= 100


def _foreign_partial(partial: Path, age_s: float) -> bytes:
    header = {"ph": "M", "name": "cuvil_session", "pid": 4242, "tid": 0,
              "args": {"pid": 4242, "host": socket.gethostname() + "-elsewhere", "schema_version": 2}}
    data = b'{"traceEvents":[\n' + json.dumps(header).encode() + b",\n"
    partial.write_bytes(data)
    then = time.time() - age_s
    os.utime(partial, (then, then))
    return data


def test_a_partial_nobody_touched_for_a_minute_is_moved_aside(tmp_path):
    path = tmp_path / "run.trace.json"
    data = _foreign_partial(Path(f"{path}.partial"), age_s=600)
    with profile(path, **QUIET) as s:
        with ProfileRegion("fresh"):
            pass
    assert s.path == str(path) and _region_names(path) == ["fresh"]
    assert (tmp_path / "run.crashed-4242.trace.json.partial").read_bytes() == data
    assert "has not changed for 600 s" in s.leftover["reason"]


@pytest.mark.parametrize("content", ["header", "empty"])
def test_a_partial_another_process_writes_is_left_alone(tmp_path, content):
    path = tmp_path / "run.trace.json"
    partial = Path(f"{path}.partial")
    data = _foreign_partial(partial, age_s=0) if content == "header" else b""
    if content == "empty":
        partial.write_bytes(data)
    with profile(path, **QUIET) as s:
        with ProfileRegion("mine"):
            pass
    assert s.path == str(tmp_path / f"run.pid{os.getpid()}.trace.json")
    assert _region_names(Path(s.path)) == ["mine"] and partial.read_bytes() == data and not path.exists()


def test_the_writer_touches_its_partial_every_flush(tmp_path, monkeypatch):
    touched = []
    monkeypatch.setattr(trace_writer.os, "utime", lambda fd, *a: touched.append(fd))
    with profile(tmp_path / "t.trace.json", flush_interval_s=0.05, **QUIET):
        deadline = time.monotonic() + 30
        while len(touched) < 3 and time.monotonic() < deadline:     # nothing written, still touched
            time.sleep(0.01)
    assert len(touched) >= 3


# -- item 3: a full disk or an unwritable directory at start ---------------------------------------
def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _no_permission(*args, **kwargs):
    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))


@pytest.mark.parametrize("failure", ["disk full on the header", "no permission to create"])
def test_a_session_that_cannot_write_lets_the_program_run(tmp_path, monkeypatch, caplog, failure):
    if failure == "disk full on the header":
        monkeypatch.setattr(trace_writer.os, "write", _no_space)
        expected = "No space left on device"
    else:
        monkeypatch.setattr(trace_writer.os, "open", _no_permission)
        expected = "Permission denied"
    path = tmp_path / "run.trace.json"
    ran = []
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc"):
        with profile(path, **QUIET) as s:
            with ProfileRegion("work"):
                ran.append(True)
    assert ran == [True] and s.stop() is None
    assert expected in s.unavailable and str(path) in s.unavailable
    assert s.sampler_status["trace"] == {"status": "unavailable", "reason": s.unavailable}
    assert s.metadata()["samplers"]["trace"]["status"] == "unavailable"
    assert sum("recording is off" in r.getMessage() for r in caplog.records) == 1
    assert list(tmp_path.iterdir()) == []                        # no 0-byte partial left behind
    monkeypatch.undo()
    with profile(path, **QUIET):                                 # the next start records
        with ProfileRegion("later"):
            pass
    assert _region_names(path) == ["later"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_lets_the_program_run(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with profile(locked / "run.trace.json", **QUIET) as s:
        with ProfileRegion("work"):
            pass
    assert "Permission denied" in s.unavailable and list(locked.iterdir()) == []


def test_a_missing_directory_lets_the_program_run(tmp_path):
    with profile(tmp_path / "absent" / "run.trace.json", **QUIET) as s:
        with ProfileRegion("work"):
            pass
    assert "does not exist" in s.unavailable and s.stop() is None


# -- item 4: the partial file carries the drop counters -------------------------------------------
def test_a_trace_recovered_after_a_flood_knows_what_was_dropped(tmp_path):
    path = tmp_path / "flood.trace.json"
    _crash(path, buffer_events=50, ready=lambda data: data.count(b'"cuvil_dropped"') >= 3)
    trace = load_trace(path)
    src = trace.sources[0]
    assert src.recovered
    assert src.metadata["dropped"]["regions"] > 1000
    assert len(trace.of_kind(Kind.REGION)) > 0


# -- item 5: a forked child inherits no session ----------------------------------------------------
FORKER = textwrap.dedent("""
    import os, sys
    from cuvil_pgc import ProfileRegion, profile
    quiet = dict(ops=False, gpu="off", sample_hz=0, compile=False)
    path = sys.argv[1]
    with profile(path, flush_interval_s=0.05, **quiet):
        with ProfileRegion("before"):
            pass
        pid = os.fork()
        if pid == 0:                        # the child leaves through the parent's `with profile`
            with ProfileRegion("in_child"):
                pass
            if sys.argv[2] == "own":
                with profile(path, **quiet) as own:
                    with ProfileRegion("child_own"):
                        pass
                print(own.path)
            sys.exit(0)
        os.waitpid(pid, 0)
        with ProfileRegion("after"):
            pass
""")


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork on this platform")
@pytest.mark.parametrize("name", ["run.trace.json", "run.trace.json.gz"])
@pytest.mark.parametrize("child", ["exits", "own"])
def test_a_forked_child_never_finishes_its_parents_trace(tmp_path, name, child):
    path = tmp_path / name
    out = subprocess.run([sys.executable, "-c", FORKER, str(path), child], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert _region_names(path) == ["before", "after"]            # whole, valid, and only the parent's
    files = sorted(p.name for p in tmp_path.iterdir())
    if child == "own":
        own = Path(out.stdout.strip())
        assert own.name.startswith("run.pid") and _region_names(own) == ["child_own"]
        assert files == sorted([name, own.name])
    else:
        assert files == [name]
