"""``diff(a, b) -> dict``: which regions got faster or slower from trace(s) A to trace(s) B.

For every region path present in both, from the per-call durations of each side:
- ``median_a_us`` / ``median_b_us``, ``change_us`` (B - A) and ``ratio`` (B / A: above 1 is slower);
- ``ratio_ci95``: a percentile-bootstrap 95 % interval of the median ratio (``BOOTSTRAP`` resamples,
  each side subsampled to at most ``BOOTSTRAP_MAX`` calls, fixed seed: reproducible);
- ``p_value``: two-sided Mann-Whitney U test (exact for small samples without ties, else the normal
  approximation with tie and continuity correction; numpy only), and ``prob_b_slower`` = P(a B call
  is slower than an A call);
- ``verdict``: ``slower`` / ``faster`` when p < ``ALPHA``, the CI excludes 1 and the median moved by at
  least ``MIN_CHANGE`` (relative); else ``same``; ``insufficient`` below ``MIN_CALLS`` calls a side.
Regions only in A are ``removed``, only in B ``added``. Rows are sorted by the absolute change of
total time (``change_us`` times B's calls), largest first.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from cuvil_pgc.analyze.analyzer import TraceInput, as_trace, check_usable
from cuvil_pgc.trace.columns import Trace
from cuvil_pgc.trace.schema import Kind

ALPHA = 0.01
EXACT_MAX = 25
MIN_CHANGE = 0.02
MIN_CALLS = 3
BOOTSTRAP = 1000
BOOTSTRAP_MAX = 2000
SEED = 20240607


def diff(a: TraceInput, b: TraceInput, filter: str | None = None) -> dict[str, Any]:
    """Compare region timings of ``a`` (before) and ``b`` (after); see the module docstring."""
    ta, tb = as_trace(a), as_trace(b)
    calls_a, calls_b = _calls(ta, filter), _calls(tb, filter)
    rows = [compare_calls(p, calls_a[p], calls_b[p]) for p in sorted(calls_a.keys() & calls_b.keys())]
    rows.sort(key=lambda r: -abs(r["change_us"] * r["calls_b"]))
    only = [{"path": p, "verdict": "removed", "calls_a": len(calls_a[p]), "total_a_us": float(calls_a[p].sum())}
            for p in sorted(calls_a.keys() - calls_b.keys())]
    only += [{"path": p, "verdict": "added", "calls_b": len(calls_b[p]), "total_b_us": float(calls_b[p].sum())}
             for p in sorted(calls_b.keys() - calls_a.keys())]
    verdicts = [r["verdict"] for r in rows]
    return {"a": _facts(ta), "b": _facts(tb), "alpha": ALPHA, "min_change": MIN_CHANGE,
            "regions": rows, "only_one_side": only,
            "summary": {v: verdicts.count(v) for v in ("slower", "faster", "same", "insufficient")}}


def _calls(trace: Trace, pattern: str | None) -> dict[str, np.ndarray]:
    """Per-call durations: from region events, or from the histograms of aggregate summaries."""
    from cuvil_pgc.analyze.summary import is_summary, summary_samples

    if is_summary(trace):
        import re

        return {p: v for p, v in summary_samples(trace).items() if pattern is None or re.search(pattern, p)}
    check_usable(trace)
    return region_calls(trace, pattern)


def _facts(trace: Trace) -> dict[str, Any]:
    return {"sources": [s.path for s in trace.sources], "duration_us": float(trace.duration_us)}


def region_calls(trace: Trace, pattern: str | None = None) -> dict[str, np.ndarray]:
    """Per region path: the durations (µs) of its calls."""
    import re

    rows = trace.of_kind(Kind.REGION)
    if not len(rows):
        return {}
    ids = trace.events["region"][rows]
    dur = trace.events["dur"][rows]
    order = np.argsort(ids, kind="stable")
    uniq, first = np.unique(ids[order], return_index=True)
    bounds = np.append(first, len(order))
    rx = re.compile(pattern) if pattern else None
    out = {}
    for k, i in enumerate(uniq.tolist()):
        if i < 0:
            continue
        path = trace.strings[i]
        if rx is None or rx.search(path):
            out[path] = dur[order[bounds[k]:bounds[k + 1]]]
    return out


def compare_calls(path: str, a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """One row of the diff (see module docstring)."""
    ma, mb = float(np.median(a)), float(np.median(b))
    ratio = mb / ma if ma > 0 else (1.0 if mb == 0 else math.inf)
    row: dict[str, Any] = {"path": path, "calls_a": int(len(a)), "calls_b": int(len(b)),
                           "median_a_us": ma, "median_b_us": mb, "change_us": mb - ma,
                           "change_pct": (ratio - 1.0) * 100.0 if math.isfinite(ratio) else None,
                           "ratio": ratio if math.isfinite(ratio) else None}
    if min(len(a), len(b)) < MIN_CALLS:
        row.update(ratio_ci95=None, p_value=None, prob_b_slower=None, verdict="insufficient")
        return row
    p, prob = mann_whitney(a, b)
    lo, hi = bootstrap_ratio_ci(a, b)
    row.update(ratio_ci95=[lo, hi], p_value=p, prob_b_slower=prob,
               verdict=_verdict(ratio, p, lo, hi))
    return row


def _verdict(ratio: float, p: float, lo: float, hi: float) -> str:
    if p >= ALPHA or abs(ratio - 1.0) < MIN_CHANGE:
        return "same"
    if ratio > 1.0 and lo > 1.0:
        return "slower"
    if ratio < 1.0 and hi < 1.0:
        return "faster"
    return "same"


def mann_whitney(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sided Mann-Whitney U p-value and P(b > a) + P(b == a) / 2.

    Exact (the U distribution under the null) for small samples without ties, both sides at most
    ``EXACT_MAX``; otherwise the normal approximation with tie and continuity correction.
    """
    na, nb = len(a), len(b)
    both = np.concatenate([a, b])
    uniq, inv, counts = np.unique(both, return_inverse=True, return_counts=True)
    avg_rank = np.cumsum(counts) - (counts - 1) / 2.0          # average 1-based rank of each value
    ranks = avg_rank[inv.reshape(-1)]
    u_b = float(ranks[na:].sum()) - nb * (nb + 1) / 2.0
    prob = u_b / (na * nb)
    if max(na, nb) <= EXACT_MAX and len(uniq) == na + nb:
        return exact_u_p_value(int(round(u_b)), na, nb), prob
    n = na + nb
    mu = na * nb / 2.0
    tie = float(np.sum(counts.astype(np.float64) ** 3 - counts)) / (n * (n - 1)) if n > 1 else 0.0
    var = na * nb / 12.0 * ((n + 1) - tie)
    if var <= 0:
        return 1.0, prob
    z = (abs(u_b - mu) - 0.5) / math.sqrt(var)
    return float(min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0)))), prob


def exact_u_p_value(u: int, na: int, nb: int) -> float:
    """Two-sided exact p-value of U = ``u`` for samples of ``na`` and ``nb`` distinct values.

    The number of orderings with each U is a coefficient of the Gaussian binomial
    ``[na + nb choose na]_q = prod_i (1 - q^(nb + i)) / (1 - q^i)``, i = 1..na.
    """
    poly = np.zeros(na * nb + 1)
    poly[0] = 1.0
    for i in range(1, na + 1):
        poly[nb + i:] -= poly[:len(poly) - nb - i].copy()       # * (1 - q^(nb+i))
        for r in range(i):                                       # / (1 - q^i): running sums, stride i
            poly[r::i] = np.cumsum(poly[r::i])
    dist = poly / poly.sum()
    lower, upper = dist[:u + 1].sum(), dist[u:].sum()
    return float(min(1.0, 2.0 * min(lower, upper)))


def bootstrap_ratio_ci(a: np.ndarray, b: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of median(b) / median(a)."""
    rng = np.random.default_rng(SEED)
    a = _subsample(a, rng)
    b = _subsample(b, rng)
    ma = np.median(rng.choice(a, size=(BOOTSTRAP, len(a)), replace=True), axis=1)
    mb = np.median(rng.choice(b, size=(BOOTSTRAP, len(b)), replace=True), axis=1)
    ratios = mb / np.where(ma > 0, ma, np.nan)
    ratios = ratios[np.isfinite(ratios)]
    if not len(ratios):
        return math.nan, math.nan
    tail = (1.0 - level) / 2.0 * 100.0
    lo, hi = np.percentile(ratios, [tail, 100.0 - tail])
    return float(lo), float(hi)


def _subsample(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return x if len(x) <= BOOTSTRAP_MAX else rng.choice(x, size=BOOTSTRAP_MAX, replace=False)
