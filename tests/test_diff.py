"""Trace diff: per-region median change with Mann-Whitney U and a bootstrap CI of the ratio."""

from __future__ import annotations

import math

import numpy as np
import pytest

from cuvil_pgc.analyze.diff import bootstrap_ratio_ci, diff, mann_whitney
from tests._tracebuild import build_trace, region


def _trace(durations: dict[str, np.ndarray]):
    evs, t = [], 0.0
    for path, durs in durations.items():
        for d in durs:
            evs.append(region(path, t, float(d)))
            t += float(d) + 10.0
    return build_trace(evs)


def test_mann_whitney_matches_hand_computation():
    # with a tie (normal approximation): ranks 1, 2, 3.5 | 3.5, 5, 6 -> U_b = 8.5, mu = 4.5,
    # tie term 6 / 30 = 0.2, var = 9/12 * (7 - 0.2) = 5.1, z = (4 - 0.5) / sqrt(5.1)
    p, prob = mann_whitney(np.array([1.0, 2.0, 3.0]), np.array([3.0, 4.0, 5.0]))
    assert p == pytest.approx(math.erfc(3.5 / math.sqrt(5.1) / math.sqrt(2.0)))
    assert prob == pytest.approx(8.5 / 9)
    p_tied, prob_tied = mann_whitney(np.array([2.0, 2.0, 2.0]), np.array([2.0, 2.0]))
    assert p_tied == 1.0 and prob_tied == 0.5


def test_bootstrap_interval_brackets_the_true_ratio():
    rng = np.random.default_rng(1)
    a = rng.normal(100, 5, 400)
    lo, hi = bootstrap_ratio_ci(a, a * 1.2)
    assert lo < 1.2 < hi and hi - lo < 0.1


def test_diff_finds_slower_faster_and_unchanged_regions():
    rng = np.random.default_rng(0)
    base = {p: rng.normal(1000, 30, 200) for p in ("enc", "dec", "head")}
    after = {"enc": base["enc"] * 1.25, "dec": rng.normal(700, 30, 200), "head": rng.normal(1000, 30, 200),
             "new": np.full(5, 10.0)}
    doc = diff(_trace(base), _trace(after))
    rows = {r["path"]: r for r in doc["regions"]}
    assert rows["enc"]["verdict"] == "slower" and rows["enc"]["p_value"] < 1e-6
    assert rows["enc"]["ratio"] == pytest.approx(1.25, rel=0.03)
    assert rows["dec"]["verdict"] == "faster" and rows["dec"]["ratio_ci95"][1] < 1.0
    assert rows["head"]["verdict"] == "same"
    assert {o["path"]: o["verdict"] for o in doc["only_one_side"]} == {"new": "added"}
    assert doc["summary"] == {"slower": 1, "faster": 1, "same": 1, "insufficient": 0}
    assert [r["path"] for r in doc["regions"]][:2] == ["dec", "enc"]   # by |total change|


def test_too_few_calls_is_insufficient():
    doc = diff(_trace({"r": np.array([10.0, 11.0])}), _trace({"r": np.array([20.0, 21.0])}))
    assert doc["regions"][0]["verdict"] == "insufficient" and doc["regions"][0]["p_value"] is None


def test_exact_p_value_for_small_samples_without_ties():
    # 5 vs 5, fully separated: 2 of the C(10, 5) = 252 orderings are this extreme
    p, _ = mann_whitney(np.arange(5.0), np.arange(5.0) + 10)
    assert p == pytest.approx(2 / 252)
    p, _ = mann_whitney(np.array([1.0, 5, 7, 9]), np.array([2.0, 3, 4, 6, 8]))
    assert p == pytest.approx(92 / 126)          # brute force over the 126 splits of 9 values
