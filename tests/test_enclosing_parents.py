"""``enclosing_parents`` (vectorised) gives the parents a stack walk gives, nested or not."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil_pgc.trace.attribution import enclosing_parents


def _stack_walk(lanes, starts, ends):
    parent = np.full(len(starts), -1, dtype=np.int64)
    stack: list[int] = []
    prev = None
    for i in range(len(starts)):
        if lanes[i] != prev:
            stack.clear()
            prev = lanes[i]
        while stack and ends[stack[-1]] <= starts[i]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(0, 8)), max_size=60))
def test_parents_match_a_stack_walk(rows):
    lanes = np.array([r[0] for r in rows], dtype=np.int64)
    starts = np.array([r[1] for r in rows], dtype=np.float64)
    ends = starts + np.array([r[2] for r in rows], dtype=np.float64)
    order = np.lexsort((-ends, starts, lanes))
    lanes, starts, ends = lanes[order], starts[order], ends[order]
    assert (enclosing_parents(lanes, starts, ends) == _stack_walk(lanes, starts, ends)).all()


def test_nested_ops_and_an_empty_one():
    lanes = np.zeros(5, dtype=np.int64)
    starts = np.array([0.0, 0.0, 2.0, 5.0, 5.0])
    ends = np.array([10.0, 4.0, 3.0, 5.0, 9.0])
    assert enclosing_parents(lanes, starts, ends).tolist() == [-1, 0, 1, 0, 0]
