"""CPU utilization sampler: /proc parsing, the utilization arithmetic, and a real sampling thread."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from cuvil_pgc.instrument import ProfileRegion, Session, SessionConfig
from cuvil_pgc.instrument.samplers import build_samplers, cpu
from cuvil_pgc.instrument.samplers.cpu import CpuTimes, CpuUtilSampler, ProcReader, PsutilReader, utilization

PROC_STAT = """\
cpu  100 5 50 800 40 3 2 0 0 0
cpu0 60 5 20 400 10 2 1 0 0 0
cpu1 40 0 30 400 30 1 1 0 0 0
intr 12345 0 0
ctxt 999
"""
# comm with a space and a closing parenthesis; utime=250 stime=50 (fields 14 and 15)
SELF_STAT = "4242 (my (odd) prog) R 1 4242 4242 0 -1 4194304 100 0 0 0 250 50 0 0 20 0 3 0 77 0 0\n"


def test_proc_reader_parses_stat_files(tmp_path):
    stat, self_stat = tmp_path / "stat", tmp_path / "self_stat"
    stat.write_text(PROC_STAT)
    self_stat.write_text(SELF_STAT)
    reader = ProcReader(str(stat), str(self_stat))
    tick = reader.tick_s
    times = reader.read()
    # busy = total - idle - iowait
    assert times.total == pytest.approx(((1000 - 840) * tick, 1000 * tick))
    assert times.cores["cpu0"] == pytest.approx(((498 - 410) * tick, 498 * tick))
    assert times.cores["cpu1"] == pytest.approx(((502 - 430) * tick, 502 * tick))
    assert times.process_s == pytest.approx(300 * tick)


def test_utilization_arithmetic():
    prev = CpuTimes((10.0, 40.0), {"cpu0": (5.0, 20.0), "cpu1": (5.0, 20.0)}, 3.0)
    # 2 cores over 1 s: cpu0 fully busy, cpu1 a quarter; the process used 1.5 CPU seconds
    cur = CpuTimes((11.25, 42.0), {"cpu0": (6.0, 21.0), "cpu1": (5.25, 21.0)}, 4.5)
    args = utilization(prev, cur, 1.0)
    assert args == {"total": 62.5, "cpu0": 100.0, "cpu1": 25.0, "process": 75.0, "process_cores": 1.5}
    # a core that came online in between has no previous reading: left out, not reported as 0
    cur_more = cur._replace(cores={**cur.cores, "cpu2": (1.0, 1.0)})
    assert "cpu2" not in utilization(prev, cur_more, 1.0)
    # counters that did not move (idle interval of zero ticks) read as 0, never divide by zero
    assert utilization(prev, prev, 0.0)["total"] == 0.0


def test_psutil_reader_matches_core_count():
    times = PsutilReader().read()
    import psutil

    assert len(times.cores) == psutil.cpu_count()
    assert times.process_s > 0
    assert 0 < times.total[0] <= times.total[1]


def _record(tmp_path, sampler, body):
    path = tmp_path / "cpu.trace.json"
    with Session(SessionConfig(path=str(path), gpu="off", ops=False, compile=False,
                               sample_hz=sampler.hz), samplers=[sampler]):
        body()
    with open(path) as f:
        return json.load(f)


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1


def test_counters_at_about_the_rate_with_sane_values(tmp_path):
    hz, seconds = 50.0, 0.4
    sampler = CpuUtilSampler(hz)

    def body():
        with ProfileRegion("spin"):
            _spin(seconds)

    trace = _record(tmp_path, sampler, body)
    assert not [t for t in threading.enumerate() if t.name == "cuvil-pgc-cpu"]
    counters = [e for e in trace["traceEvents"] if e.get("ph") == "C" and e["name"] == "cpu_util"]
    # about hz * seconds ticks; generous bounds for a loaded shared machine
    assert 0.25 * hz * seconds <= len(counters) <= hz * seconds + 3
    ts = [e["ts"] for e in counters]
    assert ts == sorted(ts) and ts[0] >= 0
    ncores = len(PsutilReader().read().cores)
    for e in counters:
        args = e["args"]
        assert e["pid"] == os.getpid()
        assert {f"cpu{i}" for i in range(ncores)} <= set(args)
        assert all(0.0 <= args[k] <= 100.0 for k in args if k != "process_cores")
        assert 0.0 <= args["process_cores"] <= ncores + 0.5
    assert max(e["args"]["process"] for e in counters) > 0      # the spin shows up
    status = trace["cuvil"]["samplers"]["cpu_util"]
    # the first interval starts when the sampler starts, which may precede the session's recording
    # window by a hair (the session drops sampler events stamped before it)
    assert status["status"] == "ok" and len(counters) <= status["samples"] <= len(counters) + 1
    assert set(status["lag_ms"]) == {"p50", "max"} and status["lag_ms"]["max"] >= status["lag_ms"]["p50"] >= 0


class _FailingReader:
    """Reads in start and for two ticks, then raises, as a vanished /proc would."""

    def __init__(self) -> None:
        self.real = PsutilReader()
        self.calls = 0

    def read(self) -> CpuTimes:
        self.calls += 1
        if self.calls > 3:
            raise OSError("simulated read failure")
        return self.real.read()


def test_failure_in_the_sampling_thread_is_recorded_not_raised(tmp_path):
    reader = _FailingReader()
    sampler = CpuUtilSampler(100.0, reader=reader)
    trace = _record(tmp_path, sampler, lambda: _spin(0.2))
    status = trace["cuvil"]["samplers"]["cpu_util"]
    assert status["status"] == "failed"
    assert "OSError: simulated read failure" in status["reason"]
    counters = [e for e in trace["traceEvents"] if e.get("ph") == "C"]
    # what was sampled before the failure is kept (the first interval may precede the recording window)
    assert 1 <= len(counters) <= 2
    assert not [t for t in threading.enumerate() if t.name == "cuvil-pgc-cpu"]


def test_failure_at_start_is_recorded_not_raised(tmp_path, monkeypatch):
    def broken(self):
        raise PermissionError("no /proc for you")

    monkeypatch.setattr(ProcReader, "read", broken)
    trace = _record(tmp_path, CpuUtilSampler(20.0, reader=ProcReader()), lambda: None)
    status = trace["cuvil"]["samplers"]["cpu_util"]
    assert status == {"status": "failed", "reason": "start failed: PermissionError: no /proc for you"}


def test_unavailable_without_proc_or_psutil(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu.os.path, "exists", lambda path: False)

    def no_psutil():
        raise ImportError("No module named 'psutil'")

    monkeypatch.setattr(cpu, "PsutilReader", no_psutil)
    sampler = CpuUtilSampler(20.0)
    assert "psutil" in sampler.unavailable()
    trace = _record(tmp_path, sampler, lambda: None)
    assert trace["cuvil"]["samplers"]["cpu_util"]["status"] == "unavailable"


def test_default_factories_include_cpu_sampler_when_sampling():
    def names(**kw):
        return [s.name for s in build_samplers(SessionConfig(gpu="off", ops=False, compile=False, **kw))]

    assert "cpu_util" in names(sample_hz=10)
    assert "cpu_util" not in names(sample_hz=0)
