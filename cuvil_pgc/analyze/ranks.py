"""Cross-rank skew of a merged multi-rank trace (the ranks of one job: ``analyze([rank0, rank1, ...])``).

Pass :func:`rank_skew` (multi-rank inputs only): per region, each rank's weighted total time,
the slowest and fastest rank, ``skew_us`` (slowest minus the median rank) and ``skew_pct``
(slowest over the median, in percent); ``stragglers`` lists the regions with the largest skew.
The merge itself (ranks aligned on wall-clock time, weights kept per source) is the trace data's:
:func:`cuvil_pgc.trace.merge.merge_traces`.
"""

from __future__ import annotations

import numpy as np

from cuvil_pgc.analyze._prepare import Prepared
from cuvil_pgc.analyze.analysis import Analysis
from cuvil_pgc.analyze.bottleneck import attribute_bottlenecks
from cuvil_pgc.analyze.passes import requires

TOP_STRAGGLERS = 10


@requires(attribute_bottlenecks)  # regions, and the evidence it adds to
def rank_skew(prep: Prepared, analysis: Analysis) -> None:
    """Pass: per-region cross-rank skew into ``analysis.ranks`` (only with more than one rank)."""
    ranks_of_source = np.array([s.rank for s in prep.trace.sources] or [0], dtype=np.int64)
    ranks = np.unique(ranks_of_source)
    if len(ranks) < 2:
        return
    rr = prep.region_rows
    src = np.clip(prep.trace.events["source"][rr].astype(np.int64), 0, len(ranks_of_source) - 1)
    r_idx = np.searchsorted(ranks, ranks_of_source[src])
    key = prep.path_pos[rr] * len(ranks) + r_idx
    totals = np.bincount(key, weights=prep.weight[rr] * prep.trace.events["dur"][rr],
                         minlength=prep.n_paths * len(ranks)).reshape(prep.n_paths, len(ranks))
    regions = []
    for r in analysis.regions:
        i = prep.paths.index(r.path)
        per = totals[i]
        if not np.any(per > 0):
            continue
        med = float(np.median(per))
        slow, fast = int(np.argmax(per)), int(np.argmin(per))
        regions.append({"path": r.path, "per_rank_us": {str(int(ranks[k])): float(per[k]) for k in range(len(ranks))},
                        "slowest_rank": int(ranks[slow]), "fastest_rank": int(ranks[fast]),
                        "skew_us": float(per[slow] - med),
                        "skew_pct": float((per[slow] / med - 1.0) * 100.0) if med > 0 else None})
        r.evidence["slowest_rank"] = int(ranks[slow])
        r.evidence["rank_skew_us"] = float(per[slow] - med)
    stragglers = sorted(regions, key=lambda d: -d["skew_us"])[:TOP_STRAGGLERS]
    analysis.ranks = {"ranks": [int(x) for x in ranks], "regions": regions,
                      "stragglers": [{k: d[k] for k in ("path", "slowest_rank", "skew_us", "skew_pct")}
                                     for d in stragglers if d["skew_us"] > 0]}
