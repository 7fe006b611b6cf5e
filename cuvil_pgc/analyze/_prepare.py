"""Shared, vectorised views of a Trace that every analysis pass reads (built once per analyze()).

Contract: ``prepare(trace, roofs, filter)`` returns a :class:`Prepared` holding, as numpy arrays,
- ``lane`` per row: one int64 key per (source, pid, tid), so threads of different files never mix;
- the region instances (rows of kind REGION) with their path index, parent instance and depth;
- the top-level CPU ops: nesting is derived per lane from the intervals themselves (an op is
  top-level when it starts at or after the end of every earlier op on its lane), which matches
  torch.profiler's ``depth == 0`` and also works for Kineto files that carry no depth;
- FLOPs and bytes per top-level op: its own when known, else the sum over its nested ops
  (torch.profiler counts FLOPs on ``aten::addmm``, not on the ``aten::linear`` around it);
- GPU work (kernels, memcpy, memset) with its region;
- per-path sums of all of the above (:class:`PathWork`), weighted by the source weights.

Region paths are indexed 0..P-1 in ``paths``; ops and kernels outside every region (or a trace with no
regions at all) form the pseudo-path ``OUTSIDE``. A ``filter`` regex keeps the paths it matches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from cuvil_pgc.analyze._roofs import Roofs
from cuvil_pgc.analyze.analysis import OUTSIDE
from cuvil_pgc.analyze.intervals import grouped_union_length
from cuvil_pgc.analyze.op_estimates import estimate_missing
from cuvil_pgc.trace.attribution import RegionIndex
from cuvil_pgc.trace.columns import Trace
from cuvil_pgc.trace.schema import Kind

TINY_FACTOR = 4.0     # an op of unknown work lasting at most this many dispatch costs is all fixed cost
GAP_FACTOR = 4.0      # a gap between consecutive ops up to this many dispatch costs is issue overhead
_GPU_KINDS = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)


@dataclass
class PathWork:
    """Per-path sums (arrays of length P), weighted by source weight unless said otherwise."""

    op_count: np.ndarray
    op_time: np.ndarray
    op_flops: np.ndarray
    op_bytes: np.ndarray
    op_flops_time: np.ndarray      # op time of the ops whose FLOPs are known
    op_bytes_time: np.ndarray      # op time of the ops whose bytes are known
    op_median: np.ndarray          # median top-level op duration (unweighted), NaN without ops
    op_fixed_time: np.ndarray      # op time spent on fixed per-op cost (see fixed_cost)
    short_gap_time: np.ndarray     # gaps between consecutive ops shorter than GAP_FACTOR dispatches
    gpu_count: np.ndarray
    gpu_time: np.ndarray           # busy time of kernels + memcpy/memset: their union, per source
    gpu_flops: np.ndarray
    gpu_bytes: np.ndarray
    gpu_median: np.ndarray
    runtime_time: np.ndarray       # CPU time in CUDA runtime/driver calls (launches, syncs)


@dataclass
class Prepared:
    trace: Trace
    roofs: Roofs
    lane: np.ndarray
    weight: np.ndarray                      # per row
    paths: list[str]
    path_pos: np.ndarray                    # per row: index into paths, -1 when filtered out / none
    region_rows: np.ndarray                 # region instances kept, in ts order
    region_parent: np.ndarray               # per region instance: index into region_rows, -1 at the top
    region_depth: np.ndarray
    op_rows: np.ndarray                     # top-level CPU ops kept, in ts order
    op_instance: np.ndarray                 # innermost region instance (index into region_rows) or -1
    op_flops: np.ndarray                    # per top-level op (own or nested sum), NaN unknown
    op_bytes: np.ndarray
    gpu_rows: np.ndarray
    work: PathWork | None = None
    duration_us: float = 0.0
    extras: dict = field(default_factory=dict)   # what a pass leaves for a later one
    #: every region instance (rows, index of the enclosing one), those a --filter hides included
    #: (set by :func:`prepare`)
    all_regions: tuple[np.ndarray, np.ndarray] = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    @property
    def n_paths(self) -> int:
        return len(self.paths)


def lane_keys(trace: Trace) -> np.ndarray:
    """One int64 per row identifying (source, pid, tid)."""
    src = trace.events["source"].astype(np.int64)
    pid = trace.events["pid"].astype(np.int64) & 0x3FFFFFF
    tid = trace.events["tid"].astype(np.int64) & 0xFFFFFF
    return (src << 50) | (pid << 24) | tid


def prepare(trace: Trace, roofs: Roofs, pattern: str | None = None) -> Prepared:
    ev = trace.events
    weights = np.array([s.weight for s in trace.sources] or [1.0], dtype=np.float64)
    src = np.clip(ev["source"].astype(np.int64), 0, len(weights) - 1)
    lane = lane_keys(trace)
    kind = ev["kind"]
    op_all = np.nonzero(kind == Kind.CPU_OP)[0]
    around = op_all[_around_regions(lane, ev, op_all, np.nonzero(kind == Kind.REGION)[0])]
    op_all = np.setdiff1d(op_all, around, assume_unique=True)
    paths, path_pos = _path_positions(trace, pattern, around)
    keep = path_pos >= 0
    region_rows = np.nonzero((kind == Kind.REGION) & keep)[0]
    r_ts, r_dur = ev["ts"][region_rows], ev["dur"][region_rows]
    index = RegionIndex(lane[region_rows], r_ts, r_ts + r_dur) if len(region_rows) else None
    parent, depth = _region_nesting(index, len(region_rows))
    top, ancestor = top_level(lane[op_all], ev["ts"][op_all], ev["dur"][op_all])
    flops = _own_or_nested(ev["flops"][op_all], top, ancestor)[top]
    nbytes = _own_or_nested(ev["bytes"][op_all], top, ancestor)[top]
    top_rows = op_all[top]
    estimate_missing(trace, top_rows, flops, nbytes)      # a Kineto trace's ops, from their shapes
    kept = keep[top_rows]
    op_rows = top_rows[kept]
    prep = Prepared(trace=trace, roofs=roofs, lane=lane, weight=weights[src], paths=paths, path_pos=path_pos,
                    region_rows=region_rows, region_parent=parent, region_depth=depth, op_rows=op_rows,
                    op_instance=_instances(index, lane, ev, op_rows),
                    op_flops=flops[kept], op_bytes=nbytes[kept],
                    gpu_rows=np.nonzero(np.isin(kind, _GPU_KINDS) & keep)[0],
                    duration_us=trace.duration_us)
    every = np.nonzero(kind == Kind.REGION)[0]
    if len(every) == len(region_rows):             # nothing hidden: the shown calls are all of them
        prep.all_regions = (region_rows, parent)
    else:
        e_ts, e_dur = ev["ts"][every], ev["dur"][every]
        prep.all_regions = (every, _enclosing(RegionIndex(lane[every], e_ts, e_ts + e_dur), len(every)))
    prep.work = _path_work(prep)
    return prep


def _path_positions(trace: Trace, pattern: str | None, skip: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Index of each row's region path in the sorted list of kept paths (-1: dropped, and the rows
    ``skip``)."""
    ev = trace.events
    region = ev["region"].astype(np.int64)
    interesting = np.isin(ev["kind"], (Kind.REGION, Kind.CPU_OP, Kind.RUNTIME, *_GPU_KINDS))
    interesting[skip] = False
    ids = np.unique(region[interesting & (region >= 0)])
    names = [trace.strings[int(i)] for i in ids]
    has_outside = bool(np.any(interesting & (region < 0) & (ev["kind"] != Kind.REGION)))
    rx = re.compile(pattern) if pattern else None
    keep = [rx is None or rx.search(n) is not None for n in names]
    paths = sorted(n for n, k in zip(names, keep, strict=True) if k)
    pos_of = {n: i for i, n in enumerate(paths)}
    lookup = np.full(len(trace.strings) + 1, -1, dtype=np.int64)   # last slot: "no region"
    for i, n in zip(ids, names, strict=True):
        lookup[i] = pos_of.get(n, -1)
    if has_outside and (rx is None or rx.search(OUTSIDE)):
        paths.append(OUTSIDE)
        lookup[-1] = len(paths) - 1
    pos = lookup[np.where(region >= 0, region, len(lookup) - 1)]
    pos[~interesting] = -1
    return paths, pos


def _around_regions(lane: np.ndarray, ev: dict[str, np.ndarray], ops: np.ndarray, regions: np.ndarray) -> np.ndarray:
    """Per op: whether a region starts inside it on its lane (torch.compile's ``Torch-Compiled
    Region`` op around its ``## Call CompiledFxGraph ##`` range, a custom op that opens a
    ``record_function``). Such an op is not one of the analysis' ops: the ops inside the region
    are its region's, and the op's own time would count the region's again in its own region."""
    out = np.zeros(len(ops), dtype=bool)
    if not len(ops) or not len(regions):
        return out
    ts = ev["ts"][ops]
    index = RegionIndex(lane[ops], ts, ts + ev["dur"][ops])
    up = _enclosing(index, len(ops))                  # each op's enclosing op
    cur = index.innermost(lane[regions], ev["ts"][regions])
    cur = cur[cur >= 0]
    while len(cur):
        out[cur] = True
        cur = up[cur]
        cur = cur[cur >= 0]
        cur = cur[~out[cur]]
    return out


def top_level(lane: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For intervals on lanes: (is top-level, index of the top-level interval each one lies in).

    Vectorised: sort by lane, start, longest first; an interval is top-level when it starts at or
    after the running maximum end of the earlier intervals on its lane.
    """
    n = len(ts)
    if not n:
        return np.zeros(0, dtype=bool), np.zeros(0, dtype=np.int64)
    order = lane_time_order(lane, ts, dur)
    ln, s, e = lane[order], ts[order], ts[order] + np.maximum(dur[order], 0.0)
    first = np.ones(n, dtype=bool)
    first[1:] = ln[1:] != ln[:-1]
    group = np.cumsum(first) - 1
    span = float(np.max(e) - min(float(np.min(s)), 0.0)) + 1.0
    shifted = e - float(np.min(s)) + group * span        # later groups sit above earlier ones
    run_max = np.maximum.accumulate(shifted)
    prev = np.empty(n)
    prev[0] = -np.inf
    prev[1:] = run_max[:-1]
    prev[first] = -np.inf
    top_sorted = (s - float(np.min(s)) + group * span) >= prev - 1e-6
    anc_sorted = np.maximum.accumulate(np.where(top_sorted, np.arange(n), 0))
    top = np.empty(n, dtype=bool)
    top[order] = top_sorted
    ancestor = np.empty(n, dtype=np.int64)
    ancestor[order] = order[anc_sorted]
    return top, ancestor


def lane_time_order(lane: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Order by lane, then start, longest first on ties. Rows of a Trace are already in time order
    (the reader puts longer rows first on ties): then one stable sort by lane is enough."""
    same_ts = ts[1:] == ts[:-1]
    in_order = bool(np.all(ts[1:] >= ts[:-1])) and bool(np.all(dur[1:][same_ts] <= dur[:-1][same_ts]))
    if in_order:
        return np.argsort(lane, kind="stable")
    return np.lexsort((-dur, ts, lane))


def _own_or_nested(values: np.ndarray, top: np.ndarray, ancestor: np.ndarray) -> np.ndarray:
    """Per interval: its own value where known; for top-level ones, else the sum over nested ones."""
    known = ~np.isnan(values)
    nested = known & ~top
    sums = np.bincount(ancestor[nested], weights=values[nested], minlength=len(values))
    has = np.bincount(ancestor[nested], minlength=len(values)) > 0
    out = values.copy()
    fill = top & ~known & has
    out[fill] = sums[fill]
    return out


def _enclosing(index: RegionIndex | None, n: int) -> np.ndarray:
    """Per interval of ``index``: the interval enclosing it (-1 at the top), in the index's input order."""
    parent = np.full(n, -1, dtype=np.int64)
    if index is not None:
        has = index.parent >= 0
        parent[index.order[has]] = index.order[index.parent[has]]
    return parent


def _region_nesting(index: RegionIndex | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per region instance: the enclosing instance (-1 at the top) and the nesting depth."""
    parent = _enclosing(index, n)
    depth = np.zeros(n, dtype=np.int64)
    cur = parent.copy()
    while np.any(cur >= 0):          # bounded by the nesting depth
        live = cur >= 0
        depth[live] += 1
        cur[live] = parent[cur[live]]
    return parent, depth


def _instances(index: RegionIndex | None, lane: np.ndarray, ev: dict[str, np.ndarray],
               op_rows: np.ndarray) -> np.ndarray:
    """Innermost region instance (index into region_rows) of each op, -1 outside every region."""
    if index is None or not len(op_rows):
        return np.full(len(op_rows), -1, dtype=np.int64)
    return index.innermost(lane[op_rows], ev["ts"][op_rows])


def _path_work(prep: Prepared) -> PathWork:
    ev, n = prep.trace.events, prep.n_paths
    p, w = prep.path_pos[prep.op_rows], prep.weight[prep.op_rows]
    d = ev["dur"][prep.op_rows]
    f, b = prep.op_flops, prep.op_bytes
    g = prep.gpu_rows
    gp, gw, gd = prep.path_pos[g], prep.weight[g], ev["dur"][g]
    rt = np.nonzero((ev["kind"] == Kind.RUNTIME) & (prep.path_pos >= 0))[0]
    return PathWork(
        op_count=_sum(p, w, n), op_time=_sum(p, w * d, n),
        op_flops=_sum(p, w * np.nan_to_num(f), n), op_bytes=_sum(p, w * np.nan_to_num(b), n),
        op_flops_time=_sum(p, w * d * ~np.isnan(f), n), op_bytes_time=_sum(p, w * d * ~np.isnan(b), n),
        op_median=group_median(p, d, n),
        op_fixed_time=_sum(p, w * fixed_cost(f, b, d, prep.roofs), n),
        short_gap_time=_short_gaps(prep, n),
        gpu_count=_sum(gp, gw, n), gpu_time=_busy(prep, g, n),
        gpu_flops=_sum(gp, gw * np.nan_to_num(ev["flops"][g]), n),
        gpu_bytes=_sum(gp, gw * np.nan_to_num(ev["bytes"][g]), n),
        gpu_median=group_median(gp, gd, n),
        runtime_time=_sum(prep.path_pos[rt], prep.weight[rt] * ev["dur"][rt], n),
    )


def _busy(prep: Prepared, rows: np.ndarray, n: int) -> np.ndarray:
    """Per path: the union of its GPU intervals in each source (two kernels at once are busy once),
    weighted by the source weight."""
    ev = prep.trace.events
    src = np.clip(ev["source"][rows].astype(np.int64), 0, None)
    n_src = int(src.max()) + 1 if len(rows) else 1
    by_group = grouped_union_length(ev["ts"][rows], ev["ts"][rows] + ev["dur"][rows],
                                    src * n + prep.path_pos[rows], n_src * n)
    w = np.array([s.weight for s in prep.trace.sources] + [1.0] * n_src)[:n_src]
    return (by_group.reshape(n_src, n) * w[:, None]).sum(axis=0) if n else np.zeros(0)


def fixed_cost(flops: np.ndarray, nbytes: np.ndarray, dur: np.ndarray, roofs: Roofs) -> np.ndarray:
    """Per op: the part of its time that is fixed per-op cost (dispatch, allocation, bookkeeping).

    A tiny op spends all its time beyond its roofline work on fixed cost; any other op spends one
    dispatch cost on it. Tiny: when the op's FLOPs or bytes are known, its roofline work is less
    than one dispatch cost (however long it took: on a loaded machine small ops stretch, and that
    is overhead too); when they are unknown, it lasted at most TINY_FACTOR dispatch costs.
    """
    disp = roofs.dispatch_us
    known = ~np.isnan(flops) | ~np.isnan(nbytes)
    roof = np.where(known, np.maximum(np.nan_to_num(flops) / roofs.peak_flops,
                                      np.nan_to_num(nbytes) / roofs.mem_bw) * 1e6, 0.0)
    tiny = np.where(known, roof < disp, dur <= TINY_FACTOR * disp)
    return np.where(tiny, np.maximum(dur - roof, 0.0), np.minimum(dur, disp))


def _short_gaps(prep: Prepared, n: int) -> np.ndarray:
    """Per path: time between consecutive top-level ops of one region call on one thread, counting
    only gaps up to GAP_FACTOR dispatch costs (the eager issue overhead between back-to-back ops)."""
    rows = prep.op_rows
    if len(rows) < 2:
        return np.zeros(n)
    ev = prep.trace.events
    lane, inst = prep.lane[rows], prep.op_instance
    order = np.lexsort((ev["ts"][rows], lane))
    r, lane, inst = rows[order], lane[order], inst[order]
    start, end = ev["ts"][r], ev["ts"][r] + ev["dur"][r]
    pos = prep.path_pos[r]
    gap = start[1:] - end[:-1]
    same = (lane[1:] == lane[:-1]) & (inst[1:] == inst[:-1]) & (pos[1:] == pos[:-1])
    short = same & (gap >= 0) & (gap <= GAP_FACTOR * prep.roofs.dispatch_us)
    return _sum(pos[:-1][short], (prep.weight[r][:-1] * gap)[short], n)


def _sum(pos: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(pos, weights=values, minlength=n)[:n].astype(np.float64)


def group_median(pos: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Median of ``values`` per group index in ``pos`` (NaN for empty groups)."""
    return group_quantiles(pos, values, n, (0.5,))[:, 0]


def group_quantiles(pos: np.ndarray, values: np.ndarray, n: int, qs: tuple[float, ...],
                    weights: np.ndarray | None = None) -> np.ndarray:
    """Weighted quantiles per group (inverted-CDF definition), shape (n, len(qs)); NaN for empty groups."""
    out = np.full((n, len(qs)), np.nan)
    if not len(pos):
        return out
    w = np.ones(len(values)) if weights is None else weights
    order = np.lexsort((values, pos))
    p, v, w = pos[order], values[order], w[order]
    counts = np.bincount(p, minlength=n)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    cw = np.cumsum(w)
    base = np.concatenate(([0.0], cw))[starts]                 # cumulative weight before each group
    tot = np.bincount(p, weights=w, minlength=n)
    present = counts > 0
    for j, q in enumerate(qs):
        target = base + q * tot
        k = np.searchsorted(cw, target[present] - 1e-12 * np.maximum(tot[present], 1), side="left")
        k = np.clip(k, starts[present], starts[present] + counts[present] - 1)
        out[present, j] = v[k]
    return out
