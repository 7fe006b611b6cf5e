"""Hot regions: per-path statistics, the call tree, and the hotness score that ranks them.

Statistics (pass :func:`region_stats`), per region path over all its calls and merged sources:
``calls`` is the number of calls weighted by the source weight (a source sampled 1-in-N stands for N
times its recorded calls); ``total_us`` / ``self_us`` are sums weighted by the source weight
(self = the call's duration minus the calls of regions nested directly in it on the same thread);
``mean_us`` and ``p50/p95/p99_us`` are weighted over calls (inverted-CDF quantiles);
``share = total_us / run duration``, where the run duration is the weighted sum of each source's
span. ``parent`` is the enclosing region's path and ``depth`` its nesting depth (the call tree).
Ops and kernels outside every region form the pseudo-region ``(outside regions)`` with one call;
its time is its op time (CPU traces) or, on GPU traces, the span of each source not inside any
region call (:mod:`.gpu_windows`).

Hotness (pass :func:`score_hotness`) estimates the µs that recompiling could save::

    hotness = max(self_us - unrecompilable_us - bound_us, 0) * wall_us / self_us
    bound_us = calls * floor_us + sum over the region's top-level ops (or GPU kernels) of roof_i
    roof_i   = max(flops_i / peak_flops, bytes_i / mem_bw)   when the op's FLOPs or bytes are known
             = max(dur_i - floor_us, 0)                        when neither is known
    floor_us = the machine's per-op dispatch overhead (CPU) or kernel-launch latency (GPU):
               a recompiled region still runs at least one fused op per call

(each term weighted by its source weight, roof_i capped at the op's measured time).
``unrecompilable_us`` is the time the bottleneck split gives to classes whose remedy is ``none``
(``idle``, ``communication``, ``setup``: see ``vocabulary``) plus the time the host waited in a sync
call for GPU work of other regions (``sync_wait_busy_us``: that work is their saving, not this one's). ``wall_us`` is the region's self time
with time shared by concurrent calls of regions on other threads divided among them
(:func:`shared_self_time`), so savings are bounded by the region's own time, nested and
overlapping time is counted once, and summed root savings never exceed the run. Time in the
region not covered by ops (Python) is all saving potential, except time attributed to ``idle``
(the process waited: nothing to recompile). An op whose work is unknown is assumed to run at
its roof already, so only its dispatch overhead counts. A trace with no op or kernel data at all
gives no bound: there ``hotness = NO_OP_DATA_SAVING * self_us`` (documented estimate), which keeps
self-time order among regions.
"""

from __future__ import annotations

import numpy as np

from cuvil_pgc.analyze import vocabulary
from cuvil_pgc.analyze._prepare import OUTSIDE, Prepared, group_quantiles
from cuvil_pgc.analyze.analysis import Analysis, RegionStats
from cuvil_pgc.analyze.gpu_windows import has_gpu, self_pieces, split_windows
from cuvil_pgc.analyze.intervals import shared_time

NO_OP_DATA_SAVING = 0.5
#: time of these classes is not saved by recompiling the region (idle, communication, setup)
NOT_RECOMPILABLE = tuple(sorted(vocabulary.with_remedy("none")))
HIST_BINS = 20
TOP_OPS = 5


def region_stats(prep: Prepared, analysis: Analysis) -> None:
    """Fill ``analysis.regions`` (in path order) with calls, times, quantiles, share and tree."""
    ev = prep.trace.events
    rr = prep.region_rows
    pos, w, dur = prep.path_pos[rr], prep.weight[rr], ev["dur"][rr]
    n = prep.n_paths
    child = prep.region_parent >= 0
    child_sum = np.bincount(prep.region_parent[child], weights=dur[child], minlength=len(rr))
    self_each = np.maximum(dur - child_sum, 0.0)
    # Calls are weighted like times: a source sampled 1-in-N (weight N) stands for N times its calls.
    total = np.bincount(pos, weights=w * dur, minlength=n)
    self_ = np.bincount(pos, weights=w * self_each, minlength=n)
    wsum = np.bincount(pos, weights=w, minlength=n)
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


def score_hotness(prep: Prepared, analysis: Analysis) -> None:
    """Set ``hotness`` (see module docstring) and sort regions hottest first."""
    calls = prep.extras.get("weighted_calls")           # per path, weighted by source weight
    if calls is None:
        calls = np.array([r.calls for r in analysis.regions], dtype=np.float64)
    bound = roofline_bound(prep, calls)
    shared = shared_self_time(prep)
    no_data = not len(prep.op_rows) and not len(prep.gpu_rows)
    for i, r in enumerate(analysis.regions):
        explained = r.evidence.get("explained_us", {})
        # idle, communication, setup, and waiting in a sync for other regions' GPU work
        idle = sum(explained.get(name, 0.0) for name in NOT_RECOMPILABLE) + r.evidence.get("sync_wait_busy_us", 0.0)
        if no_data:
            raw = NO_OP_DATA_SAVING * max(r.self_us - idle, 0.0)
        else:
            raw = max(r.self_us - idle - bound[i], 0.0)
        own = min(float(shared[i]), r.self_us) if not np.isnan(shared[i]) else r.self_us
        r.hotness = raw * (own / r.self_us) if r.self_us > 0 else 0.0
        r.evidence["roofline_bound_us"] = float(bound[i])
        r.evidence["wall_us"] = own
    analysis.regions.sort(key=lambda r: (-r.hotness, -r.self_us, r.path))


def shared_self_time(prep: Prepared) -> np.ndarray:
    """Per path: its self time with time shared by concurrent region calls (other threads) divided
    among them, weighted by source weight; NaN for paths without region calls (``(outside regions)``).
    Summed over all paths it is at most the run: overlapping time is counted once."""
    ev, rr, n = prep.trace.events, prep.region_rows, prep.n_paths
    out = np.full(n, np.nan)
    if not len(rr):
        return out
    ts, end = ev["ts"], ev["ts"] + ev["dur"]
    a, b, inst = self_pieces(prep, ts, end)
    src = ev["source"][rr][inst].astype(np.int64)
    lo = float(np.min(ts))
    span = float(np.max(end)) - lo + 1.0
    share = shared_time(a - lo + src * span, b - lo + src * span)
    pos = prep.path_pos[rr][inst]
    got = np.bincount(pos, weights=share * prep.weight[rr][inst], minlength=n)
    has = np.bincount(pos, minlength=n) > 0
    out[has] = got[has]
    return out


def roofline_bound(prep: Prepared, calls: np.ndarray) -> np.ndarray:
    """Per path: the time its work would take at the machine's roofs plus a per-call floor (µs)."""
    ev, roofs, n = prep.trace.events, prep.roofs, prep.n_paths
    d = ev["dur"][prep.op_rows]
    op_roof = _roof_times(prep.op_flops, prep.op_bytes, d, roofs.peak_flops, roofs.mem_bw, roofs.dispatch_us)
    g = prep.gpu_rows
    peak = roofs.gpu_peak_flops or roofs.peak_flops
    bw = roofs.gpu_mem_bw or roofs.mem_bw
    gpu_roof = _roof_times(ev["flops"][g], ev["bytes"][g], ev["dur"][g], peak, bw, roofs.launch_us)
    cpu_b = np.bincount(prep.path_pos[prep.op_rows], weights=prep.weight[prep.op_rows] * op_roof, minlength=n)
    gpu_b = np.bincount(prep.path_pos[g], weights=prep.weight[g] * gpu_roof, minlength=n)
    has_gpu = prep.work.gpu_count > 0
    floor = np.where(has_gpu, roofs.launch_us, roofs.dispatch_us)
    return np.where(has_gpu, gpu_b, cpu_b) + calls * floor


def _roof_times(flops, nbytes, dur, peak, bw, floor_us):
    known = ~np.isnan(flops) | ~np.isnan(nbytes)
    t_roof = np.maximum(np.nan_to_num(flops) / peak, np.nan_to_num(nbytes) / bw) * 1e6
    t_unknown = np.maximum(dur - floor_us, 0.0)
    return np.minimum(np.where(known, t_roof, t_unknown), dur)
