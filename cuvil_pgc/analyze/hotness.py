"""Hotness (pass :func:`score_hotness`): the µs that recompiling a region could save, which ranks regions::

    hotness = max(self_us - unrecompilable_us - bound_us, 0) * wall_us / self_us
    bound_us = calls * floor_us + sum over the region's top-level ops (or GPU kernels) of roof_i
    roof_i   = max(flops_i / peak_flops, bytes_i / mem_bw)   when the op's FLOPs or bytes are known
             = max(dur_i - floor_us, 0)                        when neither is known
    floor_us = the machine's per-op dispatch overhead (CPU) or kernel-launch latency (GPU):
               a recompiled region still runs at least one fused op per call

(each term weighted by its source weight, roof_i capped at the op's measured time).
``unrecompilable_us`` is the time the bottleneck split gives to classes whose remedy is ``none``
(``idle``, ``communication``, ``setup``: see ``vocabulary``) plus the time the host waited in a sync
call for GPU work of other regions (``sync_wait_busy_us``: that work is their saving, not this one's). ``wall_us`` is the region's self time
with time shared by concurrent calls of regions on other threads divided among them
(:func:`shared_self_time`), so savings are bounded by the region's own time, nested and
overlapping time is counted once, and summed root savings never exceed the run. Time in the
region not covered by ops (Python) is all saving potential, except time attributed to ``idle``
(the process waited: nothing to recompile). An op whose work is unknown is assumed to run at
its roof already, so only its dispatch overhead counts. A trace with no op or kernel data at all
gives no bound: there ``hotness = NO_OP_DATA_SAVING * self_us`` (documented estimate), which keeps
self-time order among regions.
"""

from __future__ import annotations

import numpy as np

from cuvil_pgc.analyze import vocabulary
from cuvil_pgc.analyze._prepare import Prepared
from cuvil_pgc.analyze.analysis import Analysis
from cuvil_pgc.analyze.bottleneck import attribute_bottlenecks
from cuvil_pgc.analyze.gpu_windows import call_pieces
from cuvil_pgc.analyze.intervals import shared_time
from cuvil_pgc.analyze.passes import requires

NO_OP_DATA_SAVING = 0.5
#: time of these classes is not saved by recompiling the region (idle, communication, setup)
NOT_RECOMPILABLE = tuple(sorted(vocabulary.with_remedy("none")))


@requires(attribute_bottlenecks)       # regions and their evidence (the time each class explains)
def score_hotness(prep: Prepared, analysis: Analysis) -> None:
    """Set ``hotness`` (see module docstring) and sort regions hottest first."""
    calls = prep.extras.get("weighted_calls")           # per path, weighted by source weight
    if calls is None:
        calls = np.array([r.calls for r in analysis.regions], dtype=np.float64)
    bound = roofline_bound(prep, calls)
    shared = shared_self_time(prep)
    no_data = not len(prep.op_rows) and not len(prep.gpu_rows)
    for i, r in enumerate(analysis.regions):
        explained = r.evidence.get("explained_us", {})
        # idle, communication, setup, and waiting in a sync for other regions' GPU work
        idle = sum(explained.get(name, 0.0) for name in NOT_RECOMPILABLE) + r.evidence.get("sync_wait_busy_us", 0.0)
        if no_data:
            raw = NO_OP_DATA_SAVING * max(r.self_us - idle, 0.0)
        else:
            raw = max(r.self_us - idle - bound[i], 0.0)
        own = min(float(shared[i]), r.self_us) if not np.isnan(shared[i]) else r.self_us
        r.hotness = raw * (own / r.self_us) if r.self_us > 0 else 0.0
        r.evidence["roofline_bound_us"] = float(bound[i])
        r.evidence["wall_us"] = own
    analysis.regions.sort(key=lambda r: (-r.hotness, -r.self_us, r.path))


def shared_self_time(prep: Prepared) -> np.ndarray:
    """Per path: its self time with time shared by concurrent region calls (other threads) divided
    among them, weighted by source weight; NaN for paths without region calls (``(outside regions)``).
    Summed over all paths it is at most the run: overlapping time is counted once."""
    ev, n = prep.trace.events, prep.n_paths
    # every region call shares time, those a --filter hides too: the filter hides rows, it does
    # not change the figures of the rows it shows
    rr, parent = prep.all_regions
    out = np.full(n, np.nan)
    if not len(rr):
        return out
    ts, end = ev["ts"], ev["ts"] + ev["dur"]
    a, b, inst = call_pieces(rr, parent, ts, end)
    src = ev["source"][rr][inst].astype(np.int64)
    lo = float(np.min(ts))
    span = float(np.max(end)) - lo + 1.0
    share = shared_time(a - lo + src * span, b - lo + src * span)
    pos = prep.path_pos[rr][inst]
    shown = pos >= 0
    got = np.bincount(pos[shown], weights=(share * prep.weight[rr][inst])[shown], minlength=n)
    has = np.bincount(pos[shown], minlength=n) > 0
    out[has] = got[has]
    return out


def roofline_bound(prep: Prepared, calls: np.ndarray) -> np.ndarray:
    """Per path: the time its work would take at the machine's roofs plus a per-call floor (µs)."""
    ev, roofs, n = prep.trace.events, prep.roofs, prep.n_paths
    d = ev["dur"][prep.op_rows]
    op_roof = _roof_times(prep.op_flops, prep.op_bytes, d, roofs.peak_flops, roofs.mem_bw, roofs.dispatch_us)
    g = prep.gpu_rows
    peak = roofs.gpu_peak_flops or roofs.peak_flops
    bw = roofs.gpu_mem_bw or roofs.mem_bw
    gpu_roof = _roof_times(ev["flops"][g], ev["bytes"][g], ev["dur"][g], peak, bw, roofs.launch_us)
    cpu_b = np.bincount(prep.path_pos[prep.op_rows], weights=prep.weight[prep.op_rows] * op_roof, minlength=n)
    gpu_b = np.bincount(prep.path_pos[g], weights=prep.weight[g] * gpu_roof, minlength=n)
    has_gpu = prep.work.gpu_count > 0
    floor = np.where(has_gpu, roofs.launch_us, roofs.dispatch_us)
    return np.where(has_gpu, gpu_b, cpu_b) + calls * floor


def _roof_times(flops, nbytes, dur, peak, bw, floor_us):
    known = ~np.isnan(flops) | ~np.isnan(nbytes)
    t_roof = np.maximum(np.nan_to_num(flops) / peak, np.nan_to_num(nbytes) / bw) * 1e6
    t_unknown = np.maximum(dur - floor_us, 0.0)
    return np.minimum(np.where(known, t_roof, t_unknown), dur)
