"""Is the machine busy with other work? Timings taken then are not the program's own.

Three signals, each where the figure is computed:

- **The trace's own counters** (:func:`trace_contention`): ``cpu_util.total`` against
  ``cpu_util.process`` per sample. A sample is contended when the cores are saturated
  (total >= :data:`SATURATED_PCT`) and other processes hold at least :data:`OTHERS_PCT` of them.
  The analyzer pass :func:`contention_pass` records the contended fraction in
  ``analysis.trace["contention"]``, adds a warning, and scales every verdict's confidence by
  ``1 - CONFIDENCE_PENALTY * fraction`` (the evidence says so: ``contended_fraction``).
- **The run queue** (:func:`host_load`): the 1-minute load average and the runnable tasks of
  ``/proc/loadavg`` against the cores this process may use; contended above
  :data:`LOAD_PER_CORE` per core (a program using every core accounts for about 1 per core itself).
- **The spread of repeated measurements** (:func:`spread_warning`): a 95% interval wider than
  :data:`SPREAD_FRAC` of the median.

Tests fake the readings at their seams (``_read_loadavg``, the counters of a built Trace).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from cuvil_pgc._pool import usable_cores
from cuvil_pgc.analyze.bottleneck import attribute_bottlenecks
from cuvil_pgc.analyze.passes import requires

SATURATED_PCT = 85.0        # all cores busy ...
OTHERS_PCT = 30.0           # ... and other processes hold this share of them
LOAD_PER_CORE = 1.5         # run queue per core above which others wait for (and take) CPU
SPREAD_FRAC = 0.25          # 95% interval width / median of repeated timings
WARN_FRACTION = 0.2         # contended samples from which the trace gets a warning
CONFIDENCE_PENALTY = 0.5


def _read_loadavg() -> tuple[float, int | None]:
    """(1-minute load average, runnable tasks now or None): the seam tests replace."""
    try:
        with open("/proc/loadavg", encoding="ascii") as f:
            fields = f.read().split()
        return float(fields[0]), int(fields[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        try:
            return os.getloadavg()[0], None
        except OSError:
            return 0.0, None


def host_load() -> dict[str, Any]:
    """``{"load1", "running", "cores", "per_core", "contended"}`` of this machine now."""
    load1, running = _read_loadavg()
    cores = usable_cores()
    per_core = load1 / cores
    return {"load1": round(load1, 2), "running": running, "cores": cores, "per_core": round(per_core, 2),
            "contended": per_core > LOAD_PER_CORE}


def load_warning(load: dict[str, Any], what: str = "timings") -> str | None:
    """The warning for a busy machine, or None."""
    if not load.get("contended"):
        return None
    return (f"the machine is busy: load average {load['load1']:.1f} on {load['cores']} cores "
            f"({load['per_core']:.1f} per core); these {what} include waiting for CPU other processes "
            "took: rerun on a quiet machine before trusting them")


def spread_warning(name: str, median: float, ci: tuple[float, float] | list[float]) -> str | None:
    """A warning when the 95% interval of ``name``'s timings is wide against its median."""
    if not median or ci is None or any(x is None for x in ci):
        return None
    width = (ci[1] - ci[0]) / median
    if width <= SPREAD_FRAC:
        return None
    return (f"{name}: repeated timings spread widely (95% interval {width:.0%} of the median): "
            "the machine may be busy")


def trace_contention(trace: Any) -> dict[str, Any] | None:
    """Contended fraction of the trace's CPU-utilisation samples, or None without such samples."""
    counters = trace.counters
    if not len(counters["ts"]):
        return None
    total_code, proc_code = trace.strings.get("cpu_util.total"), trace.strings.get("cpu_util.process")
    if total_code is None or total_code < 0 or proc_code is None or proc_code < 0:
        return None
    names, ts, values = counters["name"], counters["ts"], counters["value"]
    total, proc = _series(ts, values, names == total_code), _series(ts, values, names == proc_code)
    common = sorted(set(total) & set(proc))
    if not common:
        return None
    t = np.array([total[k] for k in common])
    others = t - np.array([proc[k] for k in common])
    contended = (t >= SATURATED_PCT) & (others >= OTHERS_PCT)
    return {"samples": len(common), "contended_fraction": round(float(contended.mean()), 3),
            "others_pct_median": round(float(np.median(others)), 1)}


def _series(ts: np.ndarray, values: np.ndarray, mask: np.ndarray) -> dict[float, float]:
    return dict(zip(ts[mask].tolist(), values[mask].tolist(), strict=True))


@requires(attribute_bottlenecks)  # the verdicts whose confidence it lowers
def contention_pass(prep: Any, analysis: Any) -> None:
    """Analyzer pass: record contention, warn, and lower the confidence of every verdict."""
    found = trace_contention(prep.trace)
    if found is None:
        return
    analysis.trace["contention"] = found
    fraction = found["contended_fraction"]
    if fraction < WARN_FRACTION:
        return
    analysis.trace.setdefault("warnings", []).append(
        f"other processes held {found['others_pct_median']:.0f}% of the CPU (median) and the cores were "
        f"saturated in {fraction:.0%} of this trace's utilisation samples: its timings include waiting for "
        "the CPU, and verdicts are given lower confidence; profile again on a quiet machine")
    scale = 1.0 - CONFIDENCE_PENALTY * fraction
    for r in analysis.regions:
        r.confidence = round(r.confidence * scale, 3)
        r.evidence["contended_fraction"] = fraction
