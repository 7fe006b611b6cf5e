"""Analysis of always-on aggregate summaries (:mod:`cuvil_pgc.trace.summary`): histograms, no timeline.

A summary holds, per region path, the call count, the exact sum, min and max, and a log-linear
histogram (8 buckets per octave). Merged over all summary sources (weighted), each path gets
calls, total, self (total minus its direct children's totals), mean, p50/p95/p99 read from the
histogram (bucket midpoints: within 6.25 %), share of the summarised wall time, and hotness by the
analyzer's no-operator-data rule (half the self time, see hotness). With no operator or kernel
data the bottleneck cannot be attributed: regions are labelled ``host_bound`` with confidence 0
and the evidence says so. ``diff`` reads the same histograms as weighted per-call samples.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from cuvil_pgc.analyze.analysis import Analysis, RegionStats
from cuvil_pgc.analyze.hotness import NO_OP_DATA_SAVING  # the analyzer's rule without op data
from cuvil_pgc.errors import AnalysisError
from cuvil_pgc.trace.columns import Trace
from cuvil_pgc.trace.summary import PathStats, bucket_bounds

MAX_SAMPLES = 20_000       # per path, when histograms stand in for per-call samples (diff)


def is_summary(trace: Trace) -> bool:
    return bool(trace.sources) and all(s.format == "summary" for s in trace.sources)


def merged_paths(trace: Trace) -> dict[str, tuple[PathStats, float]]:
    """Per path: the merged histogram and the weight (calls stand for ``weight`` calls each)."""
    out: dict[str, tuple[PathStats, float]] = {}
    for source in trace.sources:
        for row in source.metadata.get("summary_regions", []):
            stats, weight = out.get(row["path"], (PathStats(), source.weight))
            stats.merge(PathStats.from_json(row))
            out[row["path"]] = (stats, weight)
    return out


def analyze_summary(trace: Trace, filter: str | None = None) -> Analysis:
    """The Analysis of summary sources (see module docstring)."""
    paths = merged_paths(trace)
    if filter is not None:
        paths = {p: v for p, v in paths.items() if re.search(filter, p)}
    if not paths:
        raise AnalysisError(f"{', '.join(s.path for s in trace.sources)}: the summary holds no regions"
                            + (f" matching {filter!r}" if filter else ""),
                            fix="let the program run regions while aggregate mode is on")
    run_us = _run_us(trace)
    totals = {p: s.sum_ns / 1000.0 * w for p, (s, w) in paths.items()}
    children: dict[str, float] = {}
    for p, t in totals.items():
        parent = p.rpartition("/")[0]
        if parent:
            children[parent] = children.get(parent, 0.0) + t
    regions = [_region(p, s, w, totals[p], children.get(p, 0.0), run_us) for p, (s, w) in paths.items()]
    regions.sort(key=lambda r: -r.hotness)
    facts = {"sources": [{"path": s.path, "format": s.format, "rank": s.rank, "weight": s.weight,
                          "recovered": False, "notes": list(s.notes)} for s in trace.sources],
             "format": "summary", "duration_us": run_us, "run_duration_us": run_us, "events": 0,
             "dropped": _dropped(trace), "samplers": {}, "devices": [], "filter": filter,
             "warnings": ["aggregate summary: no timeline, operators or kernels; bottleneck classes unknown"]}
    return Analysis(regions=regions, trace=facts)


def _region(path: str, s: PathStats, w: float, total: float, child_total: float, run_us: float) -> RegionStats:
    mids, counts = _midpoints_us(s)
    q = _quantiles(mids, counts, (0.5, 0.95, 0.99))
    self_us = max(total - child_total, 0.0)
    parent = path.rpartition("/")[0] or None
    return RegionStats(
        path=path, calls=int(round(s.count * w)), total_us=total, self_us=self_us,
        mean_us=s.sum_ns / 1000.0 / s.count if s.count else 0.0, p50_us=q[0], p95_us=q[1], p99_us=q[2],
        share=total / run_us if run_us > 0 else 0.0, hotness=NO_OP_DATA_SAVING * self_us, bottleneck="host_bound",
        confidence=0.0, parent=parent, depth=path.count("/"),
        evidence={"source": "aggregate summary", "min_us": s.min_ns / 1000.0, "max_us": s.max_ns / 1000.0,
                  "note": "no operator or kernel data: profile a capture window for the bottleneck class"},
        histogram={"edges_us": _edges_us(s), "counts": [float(s.buckets[b]) for b in sorted(s.buckets)]})


def _midpoints_us(s: PathStats) -> tuple[np.ndarray, np.ndarray]:
    keys = sorted(s.buckets)
    mids = np.array([sum(bucket_bounds(b)) / 2000.0 for b in keys])
    counts = np.array([s.buckets[b] for b in keys], dtype=np.float64)
    return mids, counts


def _edges_us(s: PathStats) -> list[float]:
    keys = sorted(s.buckets)
    return [bucket_bounds(b)[0] / 1000.0 for b in keys] + ([bucket_bounds(keys[-1])[1] / 1000.0] if keys else [])


def _quantiles(mids: np.ndarray, counts: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    if not len(mids):
        return [0.0] * len(qs)
    cum = np.cumsum(counts) / counts.sum()
    return [float(mids[min(int(np.searchsorted(cum, q)), len(mids) - 1)]) for q in qs]


def summary_samples(trace: Trace) -> dict[str, np.ndarray]:
    """Per path: per-call durations (µs) standing in for the calls, from the histograms (for diff)."""
    out = {}
    for path, (s, _w) in merged_paths(trace).items():
        mids, counts = _midpoints_us(s)
        if counts.sum() > MAX_SAMPLES:
            counts = np.maximum(np.round(counts * MAX_SAMPLES / counts.sum()), (counts > 0).astype(float))
        out[path] = np.repeat(mids, counts.astype(np.int64))
    return out


def _run_us(trace: Trace) -> float:
    spans = [(s.metadata.get("end_unix_ns", 0) - s.metadata.get("start_unix_ns", 0)) / 1000.0
             for s in trace.sources]
    return float(max(spans)) if spans else 0.0


def _dropped(trace: Trace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for s in trace.sources:
        for k, v in (s.metadata.get("dropped") or {}).items():
            out[k] = out.get(k, 0) + v
    return out
