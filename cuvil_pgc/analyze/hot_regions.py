"""Hot regions: per-path statistics and the call tree.

Statistics (pass :func:`region_stats`), per region path over all its calls and merged sources:
``calls`` is the number of calls weighted by the source weight (a source sampled 1-in-N stands for N
times its recorded calls); ``total_us`` / ``self_us`` are sums weighted by the source weight
(self = the call's duration minus the calls of regions nested directly in it on the same thread);
``mean_us`` and ``p50/p95/p99_us`` are weighted over calls (inverted-CDF quantiles);
``share = total_us / run duration``, where the run duration is the weighted sum of each source's
span. ``parent`` is the enclosing region's path and ``depth`` its nesting depth (the call tree).
Ops and kernels outside every region form the pseudo-region ``(outside regions)`` with one call;
its time is its op time (CPU traces) or, on GPU traces, the span of each source not inside any
region call (:mod:`.gpu_windows`). The hotness score that ranks them is :mod:`.hotness`.
"""

from __future__ import annotations

import numpy as np

from cuvil_pgc.analyze._prepare import OUTSIDE, Prepared, group_quantiles
from cuvil_pgc.analyze.analysis import Analysis, RegionStats
from cuvil_pgc.analyze.gpu_windows import has_gpu, split_windows
from cuvil_pgc.analyze.passes import requires

HIST_BINS = 20
TOP_OPS = 5


@requires()
def region_stats(prep: Prepared, analysis: Analysis) -> None:
    """Fill ``analysis.regions`` (in path order) with calls, times, quantiles, share and tree."""
    ev = prep.trace.events
    rr = prep.region_rows
    pos, w, dur = prep.path_pos[rr], prep.weight[rr], ev["dur"][rr]
    n = prep.n_paths
    child = prep.region_parent >= 0
    # a child cut at its parent's end (ranges that overlap without nesting: the reader warns)
    end = ev["ts"][rr] + dur
    inside = np.minimum(end[child], end[prep.region_parent[child]]) - ev["ts"][rr][child]
    child_sum = np.bincount(prep.region_parent[child], weights=np.maximum(inside, 0.0), minlength=len(rr))
    self_each = np.maximum(dur - child_sum, 0.0)
    # Calls are weighted like times: a source sampled 1-in-N (weight N) stands for N times its calls.
    # as floats: bincount of no rows is an int array, which truncated the (outside regions) time
    total = np.bincount(pos, weights=w * dur, minlength=n).astype(np.float64)
    self_ = np.bincount(pos, weights=w * self_each, minlength=n).astype(np.float64)
    wsum = np.bincount(pos, weights=w, minlength=n).astype(np.float64)
    calls = np.round(wsum)
    q = group_quantiles(pos, dur, n, (0.5, 0.95, 0.99), weights=w)
    _fill_outside(prep, calls, total, self_, wsum, q)
    run = run_duration(prep)
    parents = _parent_paths(prep)
    depth = _depths(prep.paths, parents)
    hists = _histograms(pos, dur, n)
    top_ops = _top_ops(prep)
    prep.extras["top_ops"] = top_ops
    mean = np.divide(total, wsum, out=np.zeros(n), where=wsum > 0)
    analysis.regions = [
        RegionStats(path=p, calls=int(calls[i]), total_us=float(total[i]), self_us=float(self_[i]),
                    mean_us=float(mean[i]), p50_us=_f(q[i, 0]), p95_us=_f(q[i, 1]), p99_us=_f(q[i, 2]),
                    share=float(total[i] / run) if run > 0 else 0.0, hotness=0.0, bottleneck="idle",
                    confidence=0.0, parent=parents[i], depth=depth[i], histogram=hists[i], top_ops=top_ops[i])
        for i, p in enumerate(prep.paths)]
    prep.extras["run_us"] = run
    analysis.trace["run_duration_us"] = run            # the denominator of every region's share
    prep.extras["weighted_calls"] = wsum


def _f(x: float) -> float:
    return 0.0 if np.isnan(x) else float(x)


def _fill_outside(prep: Prepared, calls, total, self_, wsum, q) -> None:
    if not prep.paths or prep.paths[-1] != OUTSIDE:
        return
    i = len(prep.paths) - 1
    work = prep.work
    busy = work.op_time[i] if work.op_count[i] > 0 else work.gpu_time[i]
    if has_gpu(prep):         # GPU traces: the time outside every region call (span minus regions)
        busy = split_windows(prep)["window"][i]
    calls[i], total[i], self_[i], wsum[i] = 1, busy, busy, 1.0
    q[i, :] = busy


def run_duration(prep: Prepared) -> float:
    """Weighted sum of each source's span (first event start to last event end)."""
    ev = prep.trace.events
    if not len(ev["ts"]):
        return 0.0
    src = ev["source"].astype(np.int64)
    ns = int(src.max()) + 1
    lo = np.full(ns, np.inf)
    hi = np.full(ns, -np.inf)
    np.minimum.at(lo, src, ev["ts"])
    np.maximum.at(hi, src, ev["ts"] + ev["dur"])
    span = np.where(np.isfinite(lo), hi - lo, 0.0)
    weights = np.array([s.weight for s in prep.trace.sources] + [1.0] * ns)[:ns]
    return float(np.sum(span * weights))


def _parent_paths(prep: Prepared) -> list[str | None]:
    """Parent of each path: the path prefix when that is a region, else the enclosing instance's path."""
    known = set(prep.paths)
    inst_parent: dict[int, int] = {}
    rr, par = prep.region_rows, prep.region_parent
    has = np.nonzero(par >= 0)[0]
    pos = prep.path_pos[rr]
    n = max(prep.n_paths, 1)
    pairs = np.unique(pos[has] * n + pos[par[has]]) if len(has) else np.zeros(0, dtype=np.int64)
    for child, parent in zip((pairs // n).tolist(), (pairs % n).tolist(), strict=True):
        inst_parent.setdefault(child, parent)
    out: list[str | None] = []
    for i, p in enumerate(prep.paths):
        prefix = p.rsplit("/", 1)[0] if "/" in p else None
        if prefix in known:
            out.append(prefix)
        elif i in inst_parent and inst_parent[i] != i:
            out.append(prep.paths[inst_parent[i]])
        else:
            out.append(None)
    return out


def _depths(paths: list[str], parents: list[str | None]) -> list[int]:
    parent_of = dict(zip(paths, parents, strict=True))
    depths = []
    for p in paths:
        d, cur, seen = 0, parent_of.get(p), {p}
        while cur is not None and cur not in seen:
            seen.add(cur)
            d += 1
            cur = parent_of.get(cur)
        depths.append(d)
    return depths


def _histograms(pos: np.ndarray, dur: np.ndarray, n: int) -> list[dict[str, list[float]]]:
    """Per path: call-duration histogram on log-spaced edges (what the report's latency plot draws)."""
    out: list[dict[str, list[float]]] = [{} for _ in range(n)]
    if not len(pos):
        return out
    order = np.lexsort((dur, pos))
    bounds = np.searchsorted(pos[order], np.arange(n + 1))
    for i in range(n):
        d = dur[order[bounds[i]:bounds[i + 1]]]
        if not len(d):
            continue
        lo, hi = max(float(d[0]), 1e-3), max(float(d[-1]), 1e-3)
        edges = np.geomspace(lo, hi * 1.000001, HIST_BINS + 1) if hi > lo * 1.0001 else np.array([lo, hi + 1e-3])
        counts, _ = np.histogram(np.maximum(d, 1e-3), bins=edges)
        out[i] = {"edges_us": edges.tolist(), "counts": counts.astype(float).tolist()}
    return out


def _top_ops(prep: Prepared) -> list[list[dict]]:
    """Per path: the TOP_OPS top-level op (or kernel) names by weighted time."""
    ev, n = prep.trace.events, prep.n_paths
    rows = np.concatenate([prep.op_rows, prep.gpu_rows])
    flops = np.concatenate([prep.op_flops, ev["flops"][prep.gpu_rows]])
    nbytes = np.concatenate([prep.op_bytes, ev["bytes"][prep.gpu_rows]])
    out: list[list[dict]] = [[] for _ in range(n)]
    if not len(rows):
        return out
    n_names = len(prep.trace.strings) + 1
    is_gpu = np.concatenate([np.zeros(len(prep.op_rows), dtype=np.int64), np.ones(len(prep.gpu_rows), dtype=np.int64)])
    key = (prep.path_pos[rows] * 2 + is_gpu) * n_names + ev["name"][rows]
    uniq, inv = np.unique(key, return_inverse=True)
    w = prep.weight[rows]
    t = np.bincount(inv, weights=w * ev["dur"][rows])
    c = np.bincount(inv, weights=w)
    fl = np.bincount(inv, weights=w * np.nan_to_num(flops))
    by = np.bincount(inv, weights=w * np.nan_to_num(nbytes))
    path_of, name_of = uniq // (2 * n_names), uniq % n_names
    gpu_of = (uniq // n_names) % 2
    for j in np.lexsort((-t, path_of)):
        lst = out[int(path_of[j])]
        if len(lst) < TOP_OPS:
            lst.append({"name": prep.trace.strings[int(name_of[j])], "kind": "kernel" if gpu_of[j] else "op",
                        "calls": float(c[j]), "total_us": float(t[j]), "flops": float(fl[j]), "bytes": float(by[j])})
    return out
