"""Several traces as one: ranks of a job, repeated runs, weighted samples of traffic.

``merge_traces(traces)`` concatenates the columns of several Traces into one (strings re-interned,
source indices shifted, rows re-sorted by ``ts``, sparse ``args`` re-keyed). Each source keeps its
``rank`` and ``weight``; every statistic of the analyzer weights a row by its source's weight.
When every source records ``start_unix_ns`` (our traces do), the sources are aligned on wall-clock
time, so the ranks of one job line up on the timeline; otherwise each starts at 0.

Pass :func:`rank_skew` (multi-rank inputs only): per region, each rank's weighted total time,
the slowest and fastest rank, ``skew_us`` (slowest minus the median rank) and ``skew_pct``
(slowest over the median, in percent); ``stragglers`` lists the regions with the largest skew.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil_pgc.analyze._prepare import Prepared
from cuvil_pgc.analyze.analysis import Analysis
from cuvil_pgc.trace.columns import COUNTER_COLUMNS, EVENT_COLUMNS, Source, StringTable, Trace

TOP_STRAGGLERS = 10


def merge_traces(traces: list[Trace]) -> Trace:
    """One Trace holding the rows of all ``traces`` (see module docstring)."""
    if len(traces) == 1:
        return traces[0]
    strings = StringTable()
    maps = [np.array([strings.intern(s) for s in t.strings.strings] + [-1], dtype=np.int64) for t in traces]
    shifts = _wall_shifts(traces)
    events, counters, sources, src_base = _empty(EVENT_COLUMNS), _empty(COUNTER_COLUMNS), [], 0
    for t, m, shift in zip(traces, maps, shifts, strict=True):
        for col in EVENT_COLUMNS:
            events[col].append(_remap(col, t.events[col], m, src_base, shift))
        for col in COUNTER_COLUMNS:
            counters[col].append(_remap(col, t.counters[col], m, src_base, shift))
        sources += [Source(path=s.path, format=s.format, metadata=s.metadata, rank=s.rank, weight=s.weight,
                           recovered=s.recovered, notes=list(s.notes), warnings=list(s.warnings))
                    for s in t.sources]
        src_base += max(len(t.sources), 1)
    ev = {c: np.concatenate(v).astype(EVENT_COLUMNS[c]) for c, v in events.items()}
    order = np.argsort(ev["ts"], kind="stable")
    ev = {c: v[order] for c, v in ev.items()}
    ct = {c: np.concatenate(v).astype(COUNTER_COLUMNS[c]) for c, v in counters.items()}
    corder = np.argsort(ct["ts"], kind="stable")
    return Trace(strings=strings, events=ev, counters={c: v[corder] for c, v in ct.items()},
                 args=_merge_args(traces, order), sources=sources)


def _empty(spec: dict) -> dict[str, list]:
    return {c: [] for c in spec}


def _remap(col: str, values: np.ndarray, m: np.ndarray, src_base: int, shift: float) -> np.ndarray:
    if col in ("name", "region"):
        return m[np.where(values >= 0, values, len(m) - 1)]
    if col == "source":
        return values.astype(np.int64) + src_base
    if col == "ts":
        return values + shift
    return values


def _wall_shifts(traces: list[Trace]) -> list[float]:
    """Per trace: µs to add to its ts so all share the earliest trace's origin (0 when unknown)."""
    origins = []
    for t in traces:
        meta = t.sources[0].metadata if t.sources else {}
        start = meta.get("start_unix_ns") if isinstance(meta, dict) else None
        offset = meta.get("ts_offset_us", 0.0) if isinstance(meta, dict) else 0.0
        ok = isinstance(start, int) and isinstance(offset, (int, float))
        origins.append(start - offset * 1000.0 if ok else None)   # Unix ns of the trace's ts = 0
    if any(o is None for o in origins):
        return [0.0] * len(traces)
    first = min(origins)
    return [(o - first) / 1000.0 for o in origins]


def _merge_args(traces: list[Trace], order: np.ndarray) -> Any:
    """Re-keyed args; lazily decoded values (the reader's ArgsMap) stay undecoded."""
    new_pos = np.empty(len(order), dtype=np.int64)
    new_pos[order] = np.arange(len(order))
    out: dict[int, Any] = {}
    base = 0
    for t in traces:
        if hasattr(t.args, "raw_items"):
            rows, values = t.args.raw_items()
        else:
            rows = np.fromiter(t.args.keys(), dtype=np.int64, count=len(t.args))
            values = list(t.args.values())
        if len(rows):
            out.update(zip(new_pos[base + rows].tolist(), values, strict=True))
        base += len(t)
    try:
        from cuvil_pgc.trace._args import ArgsMap
    except ImportError:
        return out
    return ArgsMap(out)


def rank_skew(prep: Prepared, analysis: Analysis) -> None:
    """Pass: per-region cross-rank skew into ``analysis.ranks`` (only with more than one rank)."""
    ranks_of_source = np.array([s.rank for s in prep.trace.sources] or [0], dtype=np.int64)
    ranks = np.unique(ranks_of_source)
    if len(ranks) < 2:
        return
    rr = prep.region_rows
    src = np.clip(prep.trace.events["source"][rr].astype(np.int64), 0, len(ranks_of_source) - 1)
    r_idx = np.searchsorted(ranks, ranks_of_source[src])
    key = prep.path_pos[rr] * len(ranks) + r_idx
    totals = np.bincount(key, weights=prep.weight[rr] * prep.trace.events["dur"][rr],
                         minlength=prep.n_paths * len(ranks)).reshape(prep.n_paths, len(ranks))
    regions = []
    for r in analysis.regions:
        i = prep.paths.index(r.path)
        per = totals[i]
        if not np.any(per > 0):
            continue
        med = float(np.median(per))
        slow, fast = int(np.argmax(per)), int(np.argmin(per))
        regions.append({"path": r.path, "per_rank_us": {str(int(ranks[k])): float(per[k]) for k in range(len(ranks))},
                        "slowest_rank": int(ranks[slow]), "fastest_rank": int(ranks[fast]),
                        "skew_us": float(per[slow] - med),
                        "skew_pct": float((per[slow] / med - 1.0) * 100.0) if med > 0 else None})
        r.evidence["slowest_rank"] = int(ranks[slow])
        r.evidence["rank_skew_us"] = float(per[slow] - med)
    stragglers = sorted(regions, key=lambda d: -d["skew_us"])[:TOP_STRAGGLERS]
    analysis.ranks = {"ranks": [int(x) for x in ranks], "regions": regions,
                      "stragglers": [{k: d[k] for k in ("path", "slowest_rank", "skew_us", "skew_pct")}
                                     for d in stragglers if d["skew_us"] > 0]}
