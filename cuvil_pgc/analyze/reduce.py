"""Map and reduce of many traces: each trace analysed alone (map), the results merged (reduce).

``map_trace(path)`` loads one trace, analyses it and returns a :data:`Partial` — a small,
picklable dict: the trace's ``Analysis.to_json()``, its rank and weight, and per region path a
weighted latency histogram in the aggregate scheme (8 log-linear buckets per octave of ns,
``instrument.aggregate``), so histograms of any number of traces merge by adding counts.

``reduce_partials(partials)`` merges them into one :class:`Analysis`, the same whatever order the
partials arrive in (they are sorted by path first, and every sum runs in that order). Aggregate
summaries and event traces are refused together, as :func:`~cuvil_pgc.analyze.analyzer.analyze`
refuses them in one merged trace:

- per region path: ``calls``, ``total_us``, ``self_us`` and ``hotness`` add (each trace's are
  already weighted by its source weight); ``mean_us`` = total / calls; p50/p95/p99 are exact
  where each trace has at most ``EXACT_CALLS`` calls of the path (the partial carries their
  durations), else they come from the merged buckets (bucket midpoints: within 6.25 %, and within
  the calls' smallest and largest); the histogram is the merged buckets; ``share`` is of the
  summed trace durations; the bottleneck is the class with the most summed hotness over the
  traces (``evidence.bottleneck_votes``), its confidence their hotness-weighted mean, and the
  evidence that of the trace where the region took longest; ``top_ops`` add by name;
- fusion candidates add by (region, op sequence); compile summaries concatenate their graphs
  and add their totals and phases;
- ``ranks``: per region, each rank's total over all its traces, the slowest and fastest rank,
  skew over the median and the top stragglers (as ``ranks.rank_skew`` for one merged trace);
- ``trace``: sources, events, counts, durations and drops of all traces; no timeline.

One trace alone reduces to its own analysis unchanged.
"""

from __future__ import annotations

import gc
import logging
import math
import os
import resource
import time
from collections import defaultdict
from typing import Any

import numpy as np

from cuvil_pgc.analyze.analysis import Analysis
from cuvil_pgc.analyze.ranks import TOP_STRAGGLERS
from cuvil_pgc.trace.schema import Kind

Partial = dict[str, Any]
#: a trace's region paths with at most this many calls send their durations to the reduce
EXACT_CALLS = 4096
_QUANTILES = (0.5, 0.95, 0.99)


def map_trace(path: str, machine: dict[str, Any] | None = None, filter: str | None = None) -> Partial:
    """Load and analyse one trace — a trace file, or one trace of a Parquet export named by its
    ``traces`` file (:func:`cuvil_pgc.trace.parquet.trace_units`) — and return what the reduce
    needs (see module docstring)."""
    from cuvil_pgc.analyze.analyzer import analyze
    from cuvil_pgc.analyze.machine import MachineModel

    t0, c0 = time.perf_counter(), time.process_time()
    trace = _load_unit(path)
    model = MachineModel.from_json(machine) if machine else None
    # The fallback-machine warning travels in analysis.trace["warnings"]; every worker logging it
    # again would print it once per trace.
    machine_log = logging.getLogger("cuvil_pgc.analyze.machine")
    level = machine_log.level
    machine_log.setLevel(logging.ERROR)
    try:
        analysis = analyze(trace, machine=model, filter=filter)
    finally:
        machine_log.setLevel(level)
    source = trace.sources[0]
    doc = analysis.to_json()
    paths = {r["path"] for r in doc["regions"]}
    # "path": the trace file (for an exported trace: the file it was exported from), so a dataset
    # reduces as its files do; "unit": what the map was given, unique, to order ties.
    partial = {"path": source.path, "unit": os.fspath(path), "rank": int(source.rank),
               "weight": float(source.weight), "analysis": doc, "histograms": _histograms(trace, paths),
               "samples": _samples(trace, paths)}
    del trace, analysis
    _release_memory()
    partial["timing"] = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                         "max_rss_bytes": _max_rss(), "pid": os.getpid()}
    return partial


def _load_unit(path: str) -> Any:
    from cuvil_pgc.trace import parquet
    from cuvil_pgc.trace.reader import load_trace

    if parquet.is_unit(path):
        return parquet.read_unit(path)
    return load_trace(path)


def _release_memory() -> None:
    """Hand the freed heap of a trace back to the OS before the worker reads the next one, so a
    worker's peak stays that of its largest trace rather than growing with fragmentation."""
    gc.collect()
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)      # glibc; elsewhere there is no such symbol
    except (OSError, AttributeError):
        pass


def _max_rss() -> int:
    """Peak RSS of this process in bytes: VmHWM where /proc has it (ru_maxrss may count the parent
    a worker was forked or exec'd from), else ru_maxrss."""
    try:
        with open("/proc/self/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _histograms(trace: Any, paths: set[str]) -> dict[str, dict[int, float]]:
    """Per region path: {bucket: weighted count} of its calls' durations (ns buckets)."""
    from cuvil_pgc.trace.summary import buckets_of

    out: dict[str, dict[int, float]] = {}
    for s in trace.sources:
        for row in s.metadata.get("summary_regions", []) if s.format == "summary" else []:
            if row["path"] in paths:
                h = out.setdefault(row["path"], {})
                for b, n in row["buckets"]:
                    h[int(b)] = h.get(int(b), 0.0) + n * s.weight
    ev = trace.events
    rows = np.flatnonzero(ev["kind"] == Kind.REGION)
    if not len(rows):
        return out
    weights = np.array([s.weight for s in trace.sources], dtype=np.float64)[ev["source"][rows].astype(np.int64)]
    buckets = buckets_of(np.maximum(np.round(ev["dur"][rows] * 1000.0), 0).astype(np.int64))
    key = ev["region"][rows].astype(np.int64) * 4096 + buckets
    keys, inverse = np.unique(key, return_inverse=True)
    sums = np.bincount(inverse, weights=weights)
    for k, w in zip(keys.tolist(), sums.tolist(), strict=True):
        path = trace.strings[k >> 12] if k >= 0 else None
        if path in paths:
            h = out.setdefault(path, {})
            h[k & 4095] = h.get(k & 4095, 0.0) + w
    return out


def _samples(trace: Any, paths: set[str]) -> dict[str, list[list[float]]]:
    """Per region path with at most :data:`EXACT_CALLS` calls in this trace: its calls' durations
    (µs) and source weights, from which the reduce computes the quantiles exactly, as one
    :func:`~.analyzer.analyze` of the merged files does; more calls: their [min, max] only, which
    bound the quantiles the histogram gives."""
    ev = trace.events
    rows = np.flatnonzero(ev["kind"] == Kind.REGION)
    if not len(rows):
        return {}
    rows = rows[np.argsort(ev["region"][rows], kind="stable")]          # grouped by path, once
    codes, starts = np.unique(ev["region"][rows], return_index=True)
    weights = np.array([s.weight for s in trace.sources], dtype=np.float64)
    out: dict[str, list[list[float]]] = {}
    for code, mine in zip(codes.tolist(), np.split(rows, starts[1:]), strict=True):
        path = trace.strings[int(code)] if code >= 0 else None
        if path not in paths:
            continue
        dur = ev["dur"][mine].astype(np.float64)
        if len(mine) <= EXACT_CALLS:
            out[path] = [dur.tolist(), weights[ev["source"][mine].astype(np.int64)].tolist()]
        else:
            out[path] = [[float(dur.min()), float(dur.max())]]
    return out


def reduce_partials(partials: list[Partial]) -> Analysis:
    """One Analysis from the partials of many traces (see module docstring)."""
    parts = sorted(partials, key=lambda p: (p["path"], p.get("unit", "")))
    if len(parts) == 1:
        return Analysis.from_json(parts[0]["analysis"])
    docs = [p["analysis"] for p in parts]
    formats = {d["trace"].get("format", "events") for d in docs}
    if len(formats) > 1:                    # as analyze() of one merged trace refuses them
        from cuvil_pgc.errors import AnalysisError

        summaries = [p["path"] for p, d in zip(parts, docs, strict=True) if d["trace"].get("format") == "summary"]
        raise AnalysisError(f"aggregate summaries ({', '.join(summaries[:3])}{', ...' if len(summaries) > 3 else ''})"
                            " and event traces cannot be analysed together",
                            fix="analyse the .summary.json files and the .trace.json files separately")
    duration = sum(float(d["trace"].get("duration_us") or d["trace"].get("run_duration_us") or 0.0) for d in docs)
    regions = _merge_regions(parts, duration)
    analysis = Analysis(regions=regions, fusion_candidates=_merge_fusion(docs), compile=_merge_compile(docs, parts),
                        machine=docs[0].get("machine", {}), trace=_merge_facts(docs, duration))
    analysis.ranks = _rank_skew(parts, analysis)
    return analysis


def _merge_regions(parts: list[Partial], duration: float) -> list:
    from cuvil_pgc.analyze.analysis import RegionStats

    by_path: dict[str, list[tuple[dict, Partial]]] = defaultdict(list)
    for p in parts:
        for r in p["analysis"]["regions"]:
            by_path[r["path"]].append((r, p))
    regions = []
    for path in sorted(by_path):
        items = by_path[path]
        calls = sum(r["calls"] for r, _ in items)
        total = math.fsum(r["total_us"] for r, _ in items)
        hist = _add_histograms(p["histograms"].get(path, {}) for _, p in items)
        q = _merged_quantiles([p.get("samples", {}).get(path) for _, p in items], hist)
        votes: dict[str, float] = defaultdict(float)
        for r, _ in items:
            votes[r["bottleneck"]] += r["hotness"]
        best = max(sorted(votes), key=lambda b: votes[b])
        agree = [r for r, _ in items if r["bottleneck"] == best]
        weight = math.fsum(r["hotness"] for r in agree)
        confidence = (math.fsum(r["confidence"] * r["hotness"] for r in agree) / weight if weight > 0
                      else float(np.mean([r["confidence"] for r in agree])))
        longest = max(items, key=lambda it: (it[0]["total_us"], it[1]["path"]))[0]
        evidence = dict(longest["evidence"])
        evidence.update(traces=len(items), bottleneck_votes={b: votes[b] for b in sorted(votes)})
        regions.append(RegionStats(
            path=path, calls=calls, total_us=total, self_us=math.fsum(r["self_us"] for r, _ in items),
            mean_us=total / calls if calls else 0.0, p50_us=q[0], p95_us=q[1], p99_us=q[2],
            share=total / duration if duration > 0 else 0.0, hotness=math.fsum(r["hotness"] for r, _ in items),
            bottleneck=best, confidence=float(confidence), evidence=evidence, parent=longest.get("parent"),
            depth=longest.get("depth", 0), histogram=_histogram_doc(hist), top_ops=_merge_ops(r for r, _ in items)))
    regions.sort(key=lambda r: (-r.hotness, r.path))
    return regions


def _add_histograms(hists: Any) -> dict[int, float]:
    out: dict[int, float] = {}
    for h in hists:
        for b, n in h.items():
            out[int(b)] = out.get(int(b), 0.0) + n
    return out


def _midpoints_us(hist: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    from cuvil_pgc.trace.summary import bucket_bounds

    keys = sorted(hist)
    return (np.array([sum(bucket_bounds(b)) / 2000.0 for b in keys]),
            np.array([hist[b] for b in keys], dtype=np.float64))


def _quantiles(hist: dict[int, float]) -> list[float]:
    mids, counts = _midpoints_us(hist)
    if not len(mids) or counts.sum() <= 0:
        return [0.0] * len(_QUANTILES)
    cum = np.cumsum(counts) / counts.sum()
    return [float(mids[min(int(np.searchsorted(cum, q)), len(mids) - 1)]) for q in _QUANTILES]


def _merged_quantiles(samples: list[Any], hist: dict[int, float]) -> list[float]:
    """p50/p95/p99 of one path over the traces: exact where every trace sent its calls (see
    :func:`_samples`), else from the merged histogram, within the calls' smallest and largest."""
    from cuvil_pgc.analyze._prepare import group_quantiles

    if samples and all(s is not None and len(s) == 2 for s in samples):
        dur = np.concatenate([np.asarray(s[0], dtype=np.float64) for s in samples])
        w = np.concatenate([np.asarray(s[1], dtype=np.float64) for s in samples])
        q = group_quantiles(np.zeros(len(dur), dtype=np.int64), dur, 1, _QUANTILES, weights=w)[0]
        return [float(x) if not math.isnan(x) else 0.0 for x in q]
    q = _quantiles(hist)
    bounds = [s[-1] if len(s) == 1 else [min(s[0]), max(s[0])] for s in samples if s is not None and s[0]]
    if len(bounds) < len(samples) or not bounds:       # a partial of an older version: no bounds
        return q
    lo, hi = min(b[0] for b in bounds), max(b[1] for b in bounds)
    return [min(max(x, lo), hi) for x in q]


def _histogram_doc(hist: dict[int, float]) -> dict[str, list[float]]:
    from cuvil_pgc.trace.summary import bucket_bounds

    keys = sorted(hist)
    if not keys:
        return {}
    return {"edges_us": [bucket_bounds(b)[0] / 1000.0 for b in keys] + [bucket_bounds(keys[-1])[1] / 1000.0],
            "counts": [float(hist[b]) for b in keys]}


def _merge_ops(regions: Any) -> list[dict[str, Any]]:
    merged: dict[str, dict[str, Any]] = {}
    limit = 0
    for r in regions:
        limit = max(limit, len(r.get("top_ops") or []))
        for op in r.get("top_ops") or []:
            m = merged.setdefault(op["name"], {k: (0 if isinstance(v, (int, float)) and k != "name" else v)
                                               for k, v in op.items()})
            for k, v in op.items():
                if k != "name" and isinstance(v, (int, float)) and isinstance(m.get(k), (int, float)):
                    m[k] = m[k] + v
    return sorted(merged.values(), key=lambda o: (-float(o.get("total_us") or 0.0), o["name"]))[:limit]


def _merge_fusion(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from cuvil_pgc.analyze.analysis import FusionCandidate

    merged: dict[tuple, dict[str, Any]] = {}
    for d in docs:
        for f in d.get("fusion_candidates", []):
            key = (f["region"], tuple(f["ops"]))
            m = merged.setdefault(key, {"region": f["region"], "ops": list(f["ops"]), "occurrences": 0,
                                        "total_us": 0.0, "bytes_saved": 0.0, "est_saving_us": 0.0})
            for k in ("occurrences", "total_us", "bytes_saved", "est_saving_us"):
                m[k] += f.get(k, 0)
    out = sorted(merged.values(), key=lambda f: (-f["est_saving_us"], -f["total_us"], f["region"], f["ops"]))
    return [FusionCandidate(**f) for f in out]


def _merge_compile(docs: list[dict[str, Any]], parts: list[Partial]) -> dict[str, Any]:
    graphs, totals, phases = [], {}, {}
    for d, p in zip(docs, parts, strict=True):
        c = d.get("compile") or {}
        graphs += [{**g, "trace": p["path"]} for g in c.get("graphs", [])]
        for name, into in (("totals", totals), ("phases", phases)):
            for k, v in (c.get(name) or {}).items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    into[k] = into.get(k, 0) + v
    return {"graphs": graphs, "totals": totals, "phases": phases} if graphs or totals else {}


def _merge_facts(docs: list[dict[str, Any]], duration: float) -> dict[str, Any]:
    counts: dict[str, int] = defaultdict(int)
    dropped: dict[str, float] = defaultdict(float)
    warnings: list[str] = []
    devices: list[Any] = []
    for d in docs:
        t = d["trace"]
        for k, v in (t.get("counts") or {}).items():
            counts[k] += v
        for k, v in (t.get("dropped") or {}).items():
            if isinstance(v, (int, float)):
                dropped[k] += v
        warnings += [w for w in t.get("warnings", []) if w not in warnings]
        devices += [x for x in t.get("devices", []) if x not in devices]
    first = docs[0]["trace"]
    return {"sources": [s for d in docs for s in d["trace"].get("sources", [])], "duration_us": duration,
            "events": sum(int(d["trace"].get("events") or 0) for d in docs), "counts": dict(counts),
            "top_level_ops": sum(int(d["trace"].get("top_level_ops") or 0) for d in docs),
            "dropped": dict(dropped), "samplers": first.get("samplers", {}), "devices": devices,
            "filter": first.get("filter"), "warnings": warnings, "traces": len(docs),
            "format": first.get("format", "events")}


def _rank_skew(parts: list[Partial], analysis: Analysis) -> dict[str, Any]:
    ranks = sorted({p["rank"] for p in parts})
    if len(ranks) < 2:
        return {}
    col = {r: i for i, r in enumerate(ranks)}
    totals: dict[str, np.ndarray] = {}
    for p in parts:
        for r in p["analysis"]["regions"]:
            per = totals.setdefault(r["path"], np.zeros(len(ranks)))
            per[col[p["rank"]]] += r["total_us"]
    rows = []
    for region in analysis.regions:
        per = totals.get(region.path)
        if per is None or not np.any(per > 0):
            continue
        med = float(np.median(per))
        slow, fast = int(np.argmax(per)), int(np.argmin(per))
        rows.append({"path": region.path, "per_rank_us": {str(r): float(per[i]) for i, r in enumerate(ranks)},
                     "slowest_rank": ranks[slow], "fastest_rank": ranks[fast], "skew_us": float(per[slow] - med),
                     "skew_pct": float((per[slow] / med - 1.0) * 100.0) if med > 0 else None})
        region.evidence["slowest_rank"] = ranks[slow]
        region.evidence["rank_skew_us"] = float(per[slow] - med)
    stragglers = sorted(rows, key=lambda d: (-d["skew_us"], d["path"]))[:TOP_STRAGGLERS]
    return {"ranks": ranks, "regions": rows,
            "stragglers": [{k: d[k] for k in ("path", "slowest_rank", "skew_us", "skew_pct")}
                           for d in stragglers if d["skew_us"] > 0]}
