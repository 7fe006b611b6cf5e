"""CPU utilization timeline (process and per core), sampled on a background thread.

The utilization view of machines without a GPU (the report shows it in place of SM utilization);
it runs on GPU machines too whenever ``sample_hz > 0``.

Contract (sampler name ``cpu_util``):
- A daemon thread (``cuvil-pgc-cpu``) reads ``/proc/stat`` (all cores and each core) and
  ``/proc/self/stat`` (this process's user + system time) every ``1 / sample_hz`` seconds. Where
  ``/proc`` is missing (macOS) psutil supplies the same times; with neither the sampler reports
  itself unavailable.
- Each tick emits one counter event ``{"ph": "C", "name": "cpu_util", "ts", "pid", "tid": 0,
  "args": {...}}`` holding averages over the interval since the previous tick, stamped at the
  interval's start (as the NVML sampler stamps GPM averages):
  ``total`` busy percent of all online cores (0-100), ``cpu<N>`` busy percent of core N (0-100),
  ``process`` this process's CPU time as a percent of all online cores (0-100, comparable with
  ``total``), and ``process_cores`` the same as a number of cores kept busy (1.5 = one and a half
  cores). Busy = user + nice + system + irq + softirq + steal; idle and iowait are idle.
- Like py-spy, each tick's lateness against its schedule is measured: ``status["lag_ms"]`` has
  ``p50`` and ``max``; ticks skipped because a read overran are counted in ``missed_ticks``.
- The thread never touches the user's threads; a read that fails stops the thread, marks the
  sampler ``failed`` with the reason (in ``cuvil.samplers``) and the user's program goes on.
  ``stop`` joins the thread with a timeout.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, NamedTuple, Protocol

from cuvil_pgc.instrument.samplers.base import Sampler, SamplerContext
from cuvil_pgc.trace import schema

log = logging.getLogger("cuvil_pgc")

PROC_STAT = "/proc/stat"
PROC_SELF_STAT = "/proc/self/stat"
JOIN_TIMEOUT_S = 2.0
LAG_SAMPLES_MAX = 1 << 16


class CpuTimes(NamedTuple):
    """One reading: cumulative CPU seconds (busy, total) of the machine and of each core, and of
    this process (user + system)."""

    total: tuple[float, float]
    cores: dict[str, tuple[float, float]]
    process_s: float


class CpuTimesReader(Protocol):
    def read(self) -> CpuTimes: ...


class ProcReader:
    """Linux: ``/proc/stat`` and ``/proc/self/stat`` (times in clock ticks, converted to seconds)."""

    def __init__(self, stat_path: str = PROC_STAT, self_stat_path: str = PROC_SELF_STAT) -> None:
        self.stat_path = stat_path
        self.self_stat_path = self_stat_path
        self.tick_s = 1.0 / os.sysconf("SC_CLK_TCK")

    def read(self) -> CpuTimes:
        total: tuple[float, float] = (0.0, 0.0)
        cores: dict[str, tuple[float, float]] = {}
        with open(self.stat_path, "rb") as f:
            for line in f:
                if not line.startswith(b"cpu"):
                    break  # cpu lines come first
                name, *fields = line.split()
                busy_total = self._busy_total(fields)
                if name == b"cpu":
                    total = busy_total
                else:
                    cores[name.decode()] = busy_total
        with open(self.self_stat_path, "rb") as f:
            # comm (field 2) may hold spaces and parentheses: split after the last ')'.
            rest = f.read().rsplit(b")", 1)[1].split()
        process = (int(rest[11]) + int(rest[12])) * self.tick_s  # utime, stime (fields 14, 15)
        return CpuTimes(total, cores, process)

    def _busy_total(self, fields: list[bytes]) -> tuple[float, float]:
        # user nice system idle iowait irq softirq steal (guest time is already inside user)
        values = [int(v) for v in fields[:8]]
        total = sum(values)
        idle = values[3] + (values[4] if len(values) > 4 else 0)
        return (total - idle) * self.tick_s, total * self.tick_s


class PsutilReader:
    """Portable fallback (macOS): the same times from psutil."""

    def __init__(self) -> None:
        import psutil

        self._psutil = psutil
        self._process = psutil.Process()

    def read(self) -> CpuTimes:
        per_core = self._psutil.cpu_times(percpu=True)
        cores = {f"cpu{i}": _psutil_busy_total(t) for i, t in enumerate(per_core)}
        busy = sum(b for b, _ in cores.values())
        total = sum(t for _, t in cores.values())
        times = self._process.cpu_times()
        return CpuTimes((busy, total), cores, times.user + times.system)


def _psutil_busy_total(t: Any) -> tuple[float, float]:
    total = sum(t)
    idle = t.idle + getattr(t, "iowait", 0.0)
    return total - idle, total


def default_reader() -> tuple[CpuTimesReader | None, str | None]:
    """The reader for this machine, or None and why there is none."""
    if os.path.exists(PROC_STAT) and os.path.exists(PROC_SELF_STAT):
        return ProcReader(), None
    try:
        return PsutilReader(), None
    except Exception as exc:
        return None, (f"no {PROC_STAT} and psutil is unusable ({type(exc).__name__}: {exc}); "
                      "install psutil to sample CPU utilization")


def utilization(prev: CpuTimes, cur: CpuTimes, wall_s: float) -> dict[str, float]:
    """Counter ``args`` for the interval between two readings ``wall_s`` seconds apart."""
    args = {"total": _busy_pct(prev.total, cur.total)}
    ncores = max(len(cur.cores), 1)
    # Process CPU time advances in clock ticks (10 ms), so a short interval can read more busy time
    # than its cores could hold: the figure is clamped to the core count.
    cores_busy = max(cur.process_s - prev.process_s, 0.0) / wall_s if wall_s > 0 else 0.0
    cores_busy = min(cores_busy, float(ncores))
    args["process"] = round(min(100.0 * cores_busy / ncores, 100.0), 2)
    args["process_cores"] = round(cores_busy, 3)
    for name, now in cur.cores.items():
        before = prev.cores.get(name)
        if before is not None:
            args[name] = _busy_pct(before, now)
    return args


def _busy_pct(before: tuple[float, float], now: tuple[float, float]) -> float:
    d_total = now[1] - before[1]
    if d_total <= 0:
        return 0.0
    return round(min(max(100.0 * (now[0] - before[0]) / d_total, 0.0), 100.0), 2)


class CpuUtilSampler(Sampler):
    """Process and per-core CPU utilization counters at ``hz`` samples per second."""

    name = "cpu_util"

    def __init__(self, hz: float, reader: CpuTimesReader | None = None) -> None:
        super().__init__()
        self.hz = hz
        self._reader = reader
        self._reason: str | None = None
        if reader is None:
            self._reader, self._reason = default_reader()
        self._ctx: SamplerContext | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lags_ns: list[int] = []
        self._samples = 0
        self._missed = 0

    def unavailable(self) -> str | None:
        if self.hz <= 0:
            return "sample_hz is 0 (utilization sampling disabled)"
        return self._reason

    def start(self, ctx: SamplerContext) -> None:
        self._ctx = ctx
        first = self._reader.read()   # fail here, in start, if the reader cannot read at all
        self._thread = threading.Thread(target=self._run, args=(first, time.perf_counter_ns()),
                                        name="cuvil-pgc-cpu", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(JOIN_TIMEOUT_S)
            if thread.is_alive():
                self.status["note"] = f"sampling thread did not stop within {JOIN_TIMEOUT_S} s"
        self.status.update(hz=self.hz, samples=self._samples, missed_ticks=self._missed,
                           lag_ms=self._lag_summary())

    # -- sampling thread ---------------------------------------------------------------------------
    def _run(self, prev: CpuTimes, prev_ns: int) -> None:
        period_ns = int(1e9 / self.hz)
        due = prev_ns + period_ns
        try:
            while not self._stop.wait(max(due - time.perf_counter_ns(), 0) / 1e9):
                now_ns = time.perf_counter_ns()
                cur = self._reader.read()
                self._record_lag(now_ns - due)
                self._add(prev, cur, prev_ns, now_ns)
                prev, prev_ns = cur, now_ns
                due += period_ns
                if due <= now_ns:   # a tick overran: skip the slots it missed, keep the phase
                    skipped = (now_ns - due) // period_ns + 1
                    self._missed += skipped
                    due += skipped * period_ns
        except Exception as exc:  # the user's program goes on; the trace says why sampling stopped
            reason = f"sampling failed: {type(exc).__name__}: {exc}"
            log.warning("cuvil-pgc: sampler %s disabled (%s)", self.name, reason)
            self.status.update(status=schema.STATUS_FAILED, reason=reason)

    def _add(self, prev: CpuTimes, cur: CpuTimes, prev_ns: int, now_ns: int) -> None:
        ctx = self._ctx
        args = utilization(prev, cur, (now_ns - prev_ns) / 1e9)
        # ctx.emit appends to a deque: safe from this thread, and nothing is held back should the
        # sampler fail later (a failed sampler is not stopped by the session).
        ctx.emit([{"ph": "C", "name": schema.COUNTER_CPU_UTIL, "pid": ctx.pid, "tid": 0,
                   "ts": ctx.clock.mono_to_us(prev_ns), "args": args}])
        self._samples += 1

    def _record_lag(self, lag_ns: int) -> None:
        if len(self._lags_ns) < LAG_SAMPLES_MAX:
            self._lags_ns.append(max(lag_ns, 0))

    def _lag_summary(self) -> dict[str, float] | None:
        lags = sorted(self._lags_ns)
        if not lags:
            return None
        return {"p50": round(lags[len(lags) // 2] / 1e6, 3), "max": round(lags[-1] / 1e6, 3)}
