"""Interval arithmetic on numpy arrays: unions, differences and how much of a window a set covers.

An *interval set* is a pair ``(starts, ends)`` of float arrays, sorted, disjoint and non-empty
intervals (what :func:`union` returns). Busy time of a device is the union of its kernel, memcpy
and memset intervals, never their sum: two kernels on two streams at once are busy once.

Groups: functions taking ``group`` work on many independent sets in one vectorised pass (one set
per group id, e.g. per device or per trace source); results are per group.
"""

from __future__ import annotations

import numpy as np

Intervals = tuple[np.ndarray, np.ndarray]
EMPTY: Intervals = (np.zeros(0), np.zeros(0))


def union(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """The union of intervals ``[starts[i], ends[i])`` as a sorted disjoint set (empty ones dropped)."""
    s, e, _ = merge_with_openers(starts, ends)
    return s, e


merge = union     # the name the per-device GPU figures use


def merge_with_openers(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`union`, plus for each merged interval the index (into the inputs) of the interval
    that opens it (the earliest start; the first given on ties)."""
    starts = np.asarray(starts, dtype=np.float64)
    ends = np.asarray(ends, dtype=np.float64)
    idx = np.nonzero(ends > starts)[0]
    if not len(idx):
        return np.zeros(0), np.zeros(0), np.zeros(0, dtype=np.int64)
    idx = idx[np.argsort(starts[idx], kind="stable")]
    s, e = starts[idx], ends[idx]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]            # starts after everything before it ended; touching ones merge
    first = np.nonzero(new)[0]
    last = np.append(first[1:], len(s)) - 1
    return s[first], reach[last], idx[first]


def total(iv: Intervals) -> float:
    return float(np.sum(iv[1] - iv[0]))


def intersection_length(a: Intervals, b: Intervals) -> float:
    """Length of the intersection of two interval sets (each as :func:`union` returns)."""
    return total(intersect(a, b))


def gaps(merged: Intervals) -> Intervals:
    """The holes between consecutive intervals of a set: one fewer than them."""
    s, e = merged
    return e[:-1], s[1:]


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals."""
    return total(union(starts, ends))


def grouped_union_length(starts: np.ndarray, ends: np.ndarray, group: np.ndarray, n: int) -> np.ndarray:
    """Per group id 0..n-1: the length of the union of that group's intervals (one pass: each group
    is moved to a time range of its own)."""
    out = np.zeros(n)
    s = np.asarray(starts, dtype=np.float64)
    if not len(s):
        return out
    e = np.maximum(np.asarray(ends, dtype=np.float64), s)
    lo = float(np.min(s))
    span = float(np.max(e)) - lo + 1.0
    g = np.asarray(group, dtype=np.int64)
    us, ue = union(s - lo + g * span, e - lo + g * span)
    np.add.at(out, np.floor(us / span).astype(np.int64), ue - us)
    return out


def covered(iv: Intervals, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per window ``[a[k], b[k]]``: how much of it the disjoint set ``iv`` covers."""
    s, e = iv
    a = np.asarray(a, dtype=np.float64)
    b = np.maximum(np.asarray(b, dtype=np.float64), a)
    if not len(s):
        return np.zeros(len(a))
    cum = np.concatenate(([0.0], np.cumsum(e - s)))

    def measure_before(t: np.ndarray) -> np.ndarray:     # length of the set on (-inf, t]
        k = np.searchsorted(s, t, side="right")          # intervals starting at or before t
        inside = np.where(k > 0, np.minimum(t, e[np.maximum(k - 1, 0)]) - s[np.maximum(k - 1, 0)], 0.0)
        return cum[np.maximum(k - 1, 0)] * (k > 0) + np.maximum(inside, 0.0)

    return measure_before(b) - measure_before(a)


def intersect(x: Intervals, y: Intervals) -> Intervals:
    """``x ∩ y`` of two disjoint sets."""
    return _combine(x, y, lambda cx, cy: cx & cy)


def subtract(x: Intervals, y: Intervals) -> Intervals:
    """``x \\ y`` of two disjoint sets."""
    return _combine(x, y, lambda cx, cy: cx & ~cy)


def _combine(x: Intervals, y: Intervals, keep) -> Intervals:
    if not len(x[0]):
        return EMPTY
    points = np.unique(np.concatenate([x[0], x[1], y[0], y[1]]))
    if len(points) < 2:
        return EMPTY
    lo, hi = points[:-1], points[1:]
    mid = (lo + hi) / 2
    inside = keep(_contains(x, mid), _contains(y, mid))
    return union(lo[inside], hi[inside])


def _contains(iv: Intervals, t: np.ndarray) -> np.ndarray:
    s, e = iv
    if not len(s):
        return np.zeros(len(t), dtype=bool)
    k = np.searchsorted(s, t, side="right") - 1
    ok = k >= 0
    out = np.zeros(len(t), dtype=bool)
    out[ok] = t[ok] < e[k[ok]]
    return out


def shared_time(starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Per interval: its length with every instant divided among the intervals that cover it
    (an instant covered by k intervals gives 1/k to each). The results sum to the union's length:
    overlapping time is counted once."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.maximum(np.asarray(ends, dtype=np.float64), s)
    n = len(s)
    if not n:
        return np.zeros(0)
    t = np.concatenate([s, e])
    step = np.concatenate([np.ones(n), -np.ones(n)])
    order = np.lexsort((step, t))            # ends before starts at the same instant
    t, step = t[order], step[order]
    depth = np.cumsum(step)                  # intervals open on (t[i], t[i+1])
    seg = np.diff(t)
    weight = np.where(depth[:-1] > 0, seg / np.maximum(depth[:-1], 1), 0.0)
    cum = np.concatenate(([0.0], np.cumsum(weight)))   # cum[i]: shared measure up to t[i]
    # ``cum`` is piecewise linear in t between points: evaluate at each interval's ends.
    return _eval_cum(t, cum, e) - _eval_cum(t, cum, s)


def _eval_cum(t: np.ndarray, cum: np.ndarray, x: np.ndarray) -> np.ndarray:
    k = np.searchsorted(t, x, side="left")
    return cum[np.clip(k, 0, len(cum) - 1)]
