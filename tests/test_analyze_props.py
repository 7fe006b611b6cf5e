"""Property tests of the analyzer's vectorised building blocks against plain-Python references."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil_pgc.analyze._prepare import group_quantiles, top_level


def _intervals():
    return st.lists(st.tuples(st.integers(0, 2), st.integers(0, 50), st.integers(0, 20)), min_size=1, max_size=40)


def _nested_reference(items):
    """Top-level flags by brute force: an interval is nested if an earlier-sorted one on its lane
    (start <= its start, longer on ties) still runs at its start."""
    order = sorted(range(len(items)), key=lambda i: (items[i][0], items[i][1], -items[i][2]))
    top = [False] * len(items)
    for pos, i in enumerate(order):
        lane, s, _ = items[i]
        top[i] = not any(items[j][0] == lane and items[j][1] + items[j][2] > s for j in order[:pos])
    return top


@settings(max_examples=150, deadline=None)
@given(_intervals())
def test_top_level_matches_brute_force(items):
    lane = np.array([x[0] for x in items], dtype=np.int64)
    ts = np.array([x[1] for x in items], dtype=np.float64)
    dur = np.array([x[2] for x in items], dtype=np.float64)
    top, anc = top_level(lane, ts, dur)
    assert top.tolist() == _nested_reference(items)
    assert np.all(top[anc]) and np.all(lane[anc] == lane)
    assert np.all(ts[anc] <= ts)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1e6, allow_nan=False)), min_size=1, max_size=60),
       st.sampled_from([0.5, 0.95, 0.99]))
def test_group_quantiles_match_inverted_cdf(rows, q):
    pos = np.array([r[0] for r in rows], dtype=np.int64)
    val = np.array([r[1] for r in rows])
    got = group_quantiles(pos, val, 4, (q,))[:, 0]
    for g in range(4):
        sel = np.sort(val[pos == g])
        if not len(sel):
            assert np.isnan(got[g])
            continue
        expected = sel[max(int(np.ceil(q * len(sel) - 1e-9)), 1) - 1]   # inverted CDF: smallest x, F(x) >= q
        assert got[g] == expected
