"""Interval arithmetic (analyze.intervals) against a brute-force measure on a fine integer grid."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil_pgc.analyze import intervals as iv

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 20)), max_size=12)


def _cells(pairs) -> np.ndarray:
    grid = np.zeros(100, dtype=bool)
    for a, d in pairs:
        grid[a:a + d] = True
    return grid


def _set(pairs):
    return iv.union(np.array([a for a, _ in pairs], float), np.array([a + d for a, d in pairs], float))


@settings(max_examples=200, deadline=None)
@given(spans, spans, st.integers(0, 80), st.integers(0, 40))
def test_union_subtract_intersect_covered_match_the_grid(x, y, a, w):
    gx, gy = _cells(x), _cells(y)
    sx, sy = _set(x), _set(y)
    assert iv.total(sx) == gx.sum()
    assert np.all(sx[0][1:] > sx[1][:-1])                      # sorted, disjoint, not touching
    assert iv.total(iv.subtract(sx, sy)) == (gx & ~gy).sum()
    assert iv.total(iv.intersect(sx, sy)) == (gx & gy).sum()
    assert iv.covered(sx, np.array([a], float), np.array([a + w], float))[0] == gx[a:a + w].sum()


@settings(max_examples=200, deadline=None)
@given(spans)
def test_shared_time_divides_overlaps_and_sums_to_the_union(x):
    starts = np.array([a for a, _ in x], float)
    ends = np.array([a + d for a, d in x], float)
    share = iv.shared_time(starts, ends)
    depth = np.zeros(100)
    for a, d in x:
        depth[a:a + d] += 1
    expect = [sum(1 / depth[t] for t in range(a, a + d)) for a, d in x]
    assert np.allclose(share, expect)
    assert np.isclose(share.sum(), _cells(x).sum())


def test_grouped_union_length_keeps_groups_apart():
    s = np.array([0.0, 5.0, 0.0, 100.0])
    e = np.array([10.0, 15.0, 10.0, 101.0])
    g = np.array([0, 0, 1, 1])
    assert iv.grouped_union_length(s, e, g, 3).tolist() == [15.0, 11.0, 0.0]
