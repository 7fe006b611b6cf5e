"""Interval arithmetic on numpy arrays: unions, their length, intersections, the gaps between.

Intervals are half-open ``[start, end)`` given as two float arrays (µs); zero or negative lengths
count as nothing. Everything is vectorised: one sort, then cumulative maxima, so a million
kernels merge in milliseconds.
"""

from __future__ import annotations

import numpy as np


def merge(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The union of the intervals as disjoint, sorted intervals (touching ones are joined)."""
    s, e, _ = merge_with_openers(starts, ends)
    return s, e


def merge_with_openers(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`merge`, plus for each merged interval the index (into the inputs) of the interval
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
    new[1:] = s[1:] > reach[:-1]            # starts after everything before it ended
    first = np.nonzero(new)[0]
    last = np.append(first[1:], len(s)) - 1
    return s[first], reach[last], idx[first]


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Length of the union of the intervals."""
    s, e = merge(starts, ends)
    return float(np.sum(e - s))


def intersection_length(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> float:
    """Length of the intersection of two unions, each given merged (as :func:`merge` returns)."""
    (as_, ae), (bs, be) = a, b
    if not len(as_) or not len(bs):
        return 0.0
    # |A ∩ B| = |A| + |B| - |A ∪ B| for unions of disjoint intervals.
    return float(np.sum(ae - as_) + np.sum(be - bs)
                 - union_length(np.concatenate([as_, bs]), np.concatenate([ae, be])))


def gaps(merged: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The holes between consecutive merged intervals: (start, end) arrays, one fewer than them."""
    s, e = merged
    return e[:-1], s[1:]
