"""Fusion candidates: frequent consecutive op (or kernel) sequences inside hot regions.

Miner (vectorised n-grams): the top-level CPU ops of the ``HOT_REGIONS`` hottest regions, in time
order per thread, are cut into segments at every change of thread or region call (where no region
call marks them, at the ends of the unit the run repeats: :func:`repeat_period`); every window of
``MIN_LEN..MAX_LEN`` consecutive ops inside one segment is a sequence occurrence, keyed by
(region path, op names). The same runs on GPU kernels per stream. A sequence is kept when it
occurs at least ``MIN_SUPPORT`` times (occurrences that overlap themselves, as in ``add add add``,
are counted greedily without overlap), and deduplicated: a sequence contained in a longer kept
one that covers at least ``1 - DEDUP_TOL`` of its time is dropped (it occurs as often inside the
longer one, or both cover the same run of a repeated op), so each pattern is reported once.

For each candidate: ``total_us`` = the weighted time of all its ops over all occurrences;
``bytes_saved`` = the intermediate tensors a fused kernel would not write and read back, per
occurrence ``sum over the k-1 inner boundaries of 2 * min(bytes_j, bytes_j+1) / 3`` (an op's bytes
count its inputs and output; for the common elementwise op, two inputs and one output of equal
size, the intermediate is a third of its traffic) — an estimate, 0 when bytes are unknown;
``est_saving_us`` = occurrences * (k-1) * per-op dispatch (or launch) cost + bytes_saved / bandwidth,
at most ``total_us`` (fusing cannot save more time than the ops take). Ops that launch GPU kernels (a
region with kernels) count no bytes: their tensors live on the device, where the kernel sequences
count them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cuvil_pgc.analyze._prepare import Prepared
from cuvil_pgc.analyze.analysis import Analysis, FusionCandidate
from cuvil_pgc.analyze.hotness import score_hotness
from cuvil_pgc.analyze.passes import requires
from cuvil_pgc.trace.schema import Kind

MIN_LEN, MAX_LEN = 2, 6
MIN_SUPPORT = 3
HOT_REGIONS = 10
MAX_CANDIDATES = 50
DEDUP_TOL = 0.1
_PER_LENGTH = 200          # best sequences per length kept before deduplication
REPEAT_MATCH = 0.95        # share of a run that must match itself one unit on (see repeat_period)
_PERIOD_WORK = 200_000_000  # names compared at most to find the unit, where it has more than 64 to try


@requires(score_hotness)          # mines the hottest regions
def mine_fusion(prep: Prepared, analysis: Analysis) -> None:
    """Pass: fill ``analysis.fusion_candidates`` (highest estimated saving first)."""
    hot = [prep.paths.index(r.path) for r in analysis.regions[:HOT_REGIONS] if r.hotness > 0]
    if not hot:
        return
    ev = prep.trace.events
    cands: list[FusionCandidate] = []
    g = prep.gpu_rows[(ev["kind"][prep.gpu_rows] == Kind.KERNEL) & np.isin(prep.path_pos[prep.gpu_rows], hot)]
    in_hot = np.isin(prep.path_pos[prep.op_rows], hot)
    ops, inst = prep.op_rows[in_hot], prep.op_instance[in_hot]
    # where a region's ops launch kernels, their tensors live on the device: the kernel sequences
    # carry the bytes a fusion saves there, and the ops only their dispatch
    on_device = np.isin(prep.path_pos[ops], prep.path_pos[g])
    cands += _mine(prep, ops, inst, np.where(on_device, 0.0, prep.op_bytes[in_hot]),
                   prep.roofs.dispatch_us, prep.roofs.mem_bw)
    cands += _mine(prep, g, np.full(len(g), -1), ev["bytes"][g], prep.roofs.launch_us,
                   prep.roofs.gpu_mem_bw or prep.roofs.mem_bw)
    cands.sort(key=lambda c: (-c.est_saving_us, -c.total_us, c.region, c.ops))
    analysis.fusion_candidates = cands[:MAX_CANDIDATES]


@dataclass
class _Stream:
    """Ops (or kernels) of the hot regions in lane/time order, cut into segments."""

    seg: np.ndarray          # segment id: changes at every new thread, region call or path
    path: np.ndarray
    names: np.ndarray        # dense name codes 0..U-1
    name_ids: np.ndarray     # code -> string id
    dur: np.ndarray          # weighted durations
    nbytes: np.ndarray       # weighted bytes (0 where unknown)


def _stream(prep: Prepared, rows: np.ndarray, inst: np.ndarray, nbytes: np.ndarray) -> _Stream:
    ev = prep.trace.events
    order = np.lexsort((ev["ts"][rows], prep.lane[rows]))
    rows, inst, nbytes = rows[order], inst[order], nbytes[order]
    lane, path = prep.lane[rows], prep.path_pos[rows]
    cut = (lane[1:] != lane[:-1]) | (inst[1:] != inst[:-1]) | (path[1:] != path[:-1])
    name_ids, names = np.unique(ev["name"][rows], return_inverse=True)
    names = names.reshape(-1).astype(np.int64)
    starts = np.concatenate(([0], np.nonzero(cut)[0] + 1, [len(rows)]))
    outside = np.nonzero(inst[starts[:-1]] < 0)[0]     # no region call marks a call's end: find the repeats
    for lo, hi in zip(starts[outside].tolist(), starts[outside + 1].tolist(), strict=True):
        period = repeat_period(names[lo:hi])
        if period:
            cut[lo + period - 1:hi - 1:period] = True
    w = prep.weight[rows]
    return _Stream(seg=np.cumsum(np.concatenate(([True], cut))), path=path, names=names, name_ids=name_ids,
                   dur=ev["dur"][rows] * w, nbytes=np.nan_to_num(nbytes) * w)


def repeat_period(names: np.ndarray) -> int | None:
    """The length of the unit a run of op (or kernel) names repeats, where no region call marks
    where one call of the model ends and the next begins (a torch.profiler trace without regions,
    the kernels of a region's calls on one stream); None where nothing repeats so (such a run is
    mined as a whole, as before).

    The unit's length is a distance from the rarest op of the run's first third (of those that
    occur :data:`MIN_SUPPORT` times at least: a layer's ops recur in every layer, a model's first or
    last op once a call) to a later occurrence of it at which the run matches itself shifted by that
    much, but for at most ``1 - REPEAT_MATCH`` of it. A multiple of the unit matches as well, and a
    call that took another path (one other op) costs every shift one or two mismatches: the
    shortest shift with at most twice the fewest mismatches (plus two) is the unit. A layer
    repeated inside a call is not: each call's other ops mismatch at the layer's length. The unit
    must repeat :data:`MIN_SUPPORT` times and hold :data:`MIN_LEN` ops (one op per call looks like
    one long run of it). The run is cut into units from its first op, which starts a call where the
    profile began between calls."""
    n = len(names)
    if n < MIN_LEN * MIN_SUPPORT or _fits(np.count_nonzero(names[:-1] != names[1:]), n, 1):
        return None
    longest = n // MIN_SUPPORT
    counts = np.bincount(names)
    seen = counts[names[:longest]]
    anchor = int(np.argmin(np.where(seen >= MIN_SUPPORT, seen, n + 1)))   # once a call, in each
    later = np.nonzero(names[anchor + MIN_LEN:anchor + longest + 1] == names[anchor])[0] + MIN_LEN
    later = later[:max(64, _PERIOD_WORK // n)]
    misses = {p: int(np.count_nonzero(names[:n - p] != names[p:])) for p in later.tolist()}
    fits = {p: m for p, m in misses.items() if _fits(m, n, p)}
    if not fits:
        return None
    fewest = min(fits.values())
    return min(p for p, m in fits.items() if m <= 2 * fewest + 2)


def _fits(misses: int, n: int, shift: int) -> bool:
    """Whether a run of ``n`` names matches itself shifted by ``shift`` but for ``misses`` of them."""
    return misses <= (1.0 - REPEAT_MATCH) * (n - shift)


def _mine(prep: Prepared, rows: np.ndarray, inst: np.ndarray, nbytes: np.ndarray,
          per_op_us: float, bw: float) -> list[FusionCandidate]:
    if len(rows) < MIN_LEN:
        return []
    st = _stream(prep, rows, inst, nbytes)
    found: dict[tuple, FusionCandidate] = {}
    for k in range(MIN_LEN, min(MAX_LEN, len(rows)) + 1):
        for key, occ, t_us, b in _frequent_of_length(st, k, prep.n_paths):
            found[key] = FusionCandidate(
                region=prep.paths[key[0]], ops=[prep.trace.strings[x] for x in key[1:]], occurrences=occ,
                total_us=t_us, bytes_saved=b,
                est_saving_us=min(float(occ * (k - 1) * per_op_us + (b / bw * 1e6 if bw > 0 else 0.0)), t_us))
    return _closed(found)


def _frequent_of_length(st: _Stream, k: int, n_paths: int):
    """Yield (key, non-overlapping occurrences, total µs, intermediate bytes) of the frequent k-grams."""
    start = np.nonzero(st.seg[:len(st.seg) - k + 1] == st.seg[k - 1:])[0]
    if not len(start):
        return
    uniq, inv, counts = _unique_grams(st.path[start], [st.names[start + j] for j in range(k)],
                                      len(st.name_ids), n_paths)
    frequent = np.nonzero(counts >= MIN_SUPPORT)[0]
    if not len(frequent):
        return
    t_sum = np.bincount(inv, weights=sum(st.dur[start + j] for j in range(k)))
    inter = sum(2.0 * np.minimum(st.nbytes[start + j], st.nbytes[start + j + 1]) / 3.0 for j in range(k - 1))
    b_sum = np.bincount(inv, weights=inter)
    by_gram = start[np.argsort(inv, kind="stable")]          # occurrence starts grouped by gram, in order
    first = np.concatenate(([0], np.cumsum(counts)[:-1]))
    for u in frequent[np.argsort(-t_sum[frequent], kind="stable")][:_PER_LENGTH]:
        occ = _non_overlapping(by_gram[first[u]:first[u] + counts[u]], k)
        if occ >= MIN_SUPPORT:
            scale = occ / counts[u]
            key = (int(uniq[u][0]), *(int(st.name_ids[x]) for x in uniq[u][1:]))
            yield key, int(occ), float(t_sum[u] * scale), float(b_sum[u] * scale)


def _unique_grams(path: np.ndarray, cols: list[np.ndarray], n_names: int, n_paths: int):
    """np.unique over (path, name_1..name_k) rows: one int64 key per row when it fits (fast),
    else row-wise unique. Returns (unique rows as an (m, k+1) array, inverse, counts)."""
    k = len(cols)
    if (n_paths + 1) * float(n_names + 1) ** k < 2.0 ** 62:
        key = path.astype(np.int64)
        for c in cols:
            key = key * (n_names + 1) + c
        uk, inv, counts = np.unique(key, return_inverse=True, return_counts=True)
        rows = np.empty((len(uk), k + 1), dtype=np.int64)
        for j in range(k, 0, -1):
            rows[:, j] = uk % (n_names + 1)
            uk = uk // (n_names + 1)
        rows[:, 0] = uk
        return rows, inv.reshape(-1), counts
    grams = np.stack([path, *cols], axis=1)
    uniq, inv, counts = np.unique(grams, axis=0, return_inverse=True, return_counts=True)
    return uniq, inv.reshape(-1), counts


def _non_overlapping(starts: np.ndarray, k: int) -> int:
    """Greedy count of occurrences that do not overlap an earlier counted one."""
    if len(starts) < 2 or np.all(np.diff(starts) >= k):
        return len(starts)
    count, last = 0, -k
    for s in starts.tolist():
        if s >= last + k:
            count, last = count + 1, s
    return count


def _closed(found: dict[tuple, FusionCandidate]) -> list[FusionCandidate]:
    """Drop sequences contained in a longer kept sequence (same region) that accounts for at least
    ``1 - DEDUP_TOL`` of their time (as often, or covering the same run of a repeated op)."""
    dominated: set[tuple] = set()
    for key, cand in found.items():
        region, seq = key[0], key[1:]
        for length in range(MIN_LEN, len(seq)):
            for i in range(len(seq) - length + 1):
                sub = (region, *seq[i:i + length])
                other = found.get(sub)
                if other is not None and cand.total_us >= (1.0 - DEDUP_TOL) * other.total_us:
                    dominated.add(sub)
    return [c for key, c in found.items() if key not in dominated]
