"""Which region was active on a thread at a time: the innermost enclosing interval.

Used when reading Kineto traces (ops and runtime calls inside ``user_annotation`` ranges), by the
operator sampler (torch ops inside ProfileRegions) and for GPU kernels (through the launching
runtime call's thread and time). Regions on one thread nest; a point belongs to the innermost
region whose ``[start, end)`` contains it.
"""

from __future__ import annotations

import numpy as np


class RegionIndex:
    """Interval index over regions, answering innermost-region queries in bulk.

    Args:
        tids: thread id of each region.
        starts, ends: region bounds, any one clock shared with the queries.
    """

    def __init__(self, tids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> None:
        tids = np.asarray(tids, dtype=np.int64)
        starts = np.asarray(starts, dtype=np.float64)
        ends = np.asarray(ends, dtype=np.float64)
        # Sort by thread, then start ascending, then end descending (outer before inner).
        self.order = np.lexsort((-ends, starts, tids))
        self.tids = tids[self.order]
        self.starts = starts[self.order]
        self.ends = ends[self.order]
        self.parent = enclosing_parents(self.tids, self.starts, self.ends)
        self._groups = {int(t): (int(lo), int(hi)) for t, lo, hi in _group_bounds(self.tids)}

    def __len__(self) -> int:
        return len(self.order)

    def innermost(self, tids: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Index (into the arrays given at construction) of the innermost region containing each
        (tid, time), or -1 where none does."""
        tids = np.asarray(tids, dtype=np.int64)
        times = np.asarray(times, dtype=np.float64)
        out = np.full(len(times), -1, dtype=np.int64)
        for tid, (lo, hi) in self._groups.items():
            sel = np.nonzero(tids == tid)[0]
            if not len(sel):
                continue
            t = times[sel]
            cand = np.searchsorted(self.starts[lo:hi], t, side="right") - 1 + lo
            cand[cand < lo] = -1
            cand = self._climb(cand, t)
            found = cand >= 0
            res = np.full(len(sel), -1, dtype=np.int64)
            res[found] = self.order[cand[found]]
            out[sel] = res
        return out

    def _climb(self, cand: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Walk up from the last-started region until one contains t (bounded by nesting depth)."""
        while True:
            live = cand >= 0
            bad = np.zeros(len(cand), dtype=bool)
            bad[live] = self.ends[cand[live]] <= t[live]
            if not bad.any():
                return cand
            cand[bad] = self.parent[cand[bad]]


def _group_bounds(sorted_tids: np.ndarray):
    if not len(sorted_tids):
        return []
    change = np.nonzero(np.diff(sorted_tids))[0] + 1
    los = np.concatenate(([0], change))
    his = np.concatenate((change, [len(sorted_tids)]))
    return zip(sorted_tids[los], los, his, strict=True)


def enclosing_parents(lanes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Parent of each interval (index into the same arrays, -1 for none), for intervals sorted by
    lane, then start, then end descending (outer before inner on ties).

    The parent is the innermost earlier interval of the lane still open at the interval's start
    (an interval ending at ``t`` is closed at ``t``; an empty interval encloses nothing), as a
    stack walk in that order finds it. Vectorised: each interval's depth (intervals open at its
    start) comes from one sort of the end points; its parent is the last interval one level up
    that starts before it on the lane. Lanes whose intervals overlap without nesting (the parent
    found does not contain the child) are walked with a stack instead.
    """
    n = len(starts)
    parent = np.full(n, -1, dtype=np.int64)
    if not n:
        return parent
    first = np.ones(n, dtype=bool)
    first[1:] = lanes[1:] != lanes[:-1]
    lane_code = np.cumsum(first) - 1
    is_live = ends > starts
    # depth = live intervals before it (in the order) minus those closed by its start; on one time
    # axis with each lane above the previous ones, earlier lanes count in both and cancel
    lo = float(min(starts.min(), ends.min()))
    shift = lane_code * (float(max(starts.max(), ends.max())) - lo + 1.0) - lo
    closed = np.searchsorted(np.sort((ends + shift)[is_live]), starts + shift, side="right")
    depth = np.cumsum(is_live) - is_live - closed
    need = np.nonzero(depth > 0)[0]
    live = np.nonzero(is_live)[0]
    if not len(need) or not len(live):
        return parent
    key = depth[live] * n + live
    key_sort = np.argsort(key, kind="stable")
    key, cand = key[key_sort], live[key_sort]
    want = (depth[need] - 1) * n + need
    k = np.searchsorted(key, want) - 1
    ok = k >= 0
    ok[ok] = (key[k[ok]] // n == want[ok] // n) & (lane_code[cand[k[ok]]] == lane_code[need[ok]])
    parent[need[ok]] = cand[k[ok]]
    has = parent >= 0
    bad = has.copy()          # improper nesting (overlapping, not nested): the stack walk decides
    bad[has] = (ends[parent[has]] < ends[has]) | (ends[parent[has]] <= starts[has])
    bad |= (depth > 0) & ~has
    for code in np.unique(lane_code[bad]).tolist():
        on = np.nonzero(lane_code == code)[0]
        lo = int(on[0])
        parent[on] = _stack_parents(starts[on], ends[on], lo)
    return parent


def _stack_parents(starts: np.ndarray, ends: np.ndarray, offset: int) -> np.ndarray:
    """The stack walk of one lane's sorted intervals (parents offset by ``offset``)."""
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[int] = []
    e_list = ends.tolist()
    for i, s in enumerate(starts.tolist()):
        while stack and e_list[stack[-1]] <= s:
            stack.pop()
        if stack:
            parent[i] = stack[-1] + offset
        stack.append(i)
    return parent
