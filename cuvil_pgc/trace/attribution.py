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
        self.parent = _enclosing_parents(self.tids, self.starts, self.ends)
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


def _enclosing_parents(tids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """For sorted intervals, the index of the nearest enclosing interval on the same thread."""
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[int] = []
    prev_tid = None
    s_list, e_list, t_list = starts.tolist(), ends.tolist(), tids.tolist()
    for i in range(len(s_list)):
        if t_list[i] != prev_tid:
            stack.clear()
            prev_tid = t_list[i]
        s = s_list[i]
        while stack and e_list[stack[-1]] <= s:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent
