"""Bottleneck attribution: one primary class per region, with its evidence and a confidence.

Evidence (per region, from the prepared per-path sums): op and kernel counts, median op/kernel
duration, FLOPs and bytes, achieved FLOP/s and bytes/s and their fractions of the machine's
peaks, arithmetic intensity vs the ridge point, the fraction of the region's self time not
covered by ops (CPU) or kernels (GPU), and the dispatch / launch overhead estimate.

The region's self time ``T`` is split into components, one per rule below; the primary class is
the rule whose component (``explained_us``) is largest.

CPU regions (no GPU work), with ``dispatch_us`` the machine's per-op dispatch cost:
- ``launch_overhead``: ``L = fixed_cost + short_gaps``: the fixed per-op cost inside ops (an op whose
  roofline work is below one dispatch cost, or of unknown work and no longer than TINY_FACTOR
  dispatch costs, spends all its time beyond that work on it; any other op one ``dispatch_us``;
  see ``_prepare.fixed_cost``)
  plus the gaps between back-to-back ops of a call up to GAP_FACTOR dispatch costs (issuing the
  next eager op);
- ``memory_bandwidth`` / ``compute``: the rest of the op time, ``W = op_time - fixed_cost``, goes to
  the side of the roofline the ops sit on: arithmetic intensity below the ridge point → memory,
  above → compute; without FLOPs and bytes, by op names (matmul/conv families → compute);
- ``host_bound`` / ``idle``: the time not covered by ops nor short gaps, ``U``; split by the process's
  CPU utilization over the region's calls (``cpu_util`` counter, cores busy): all ``idle`` at
  IDLE_UTIL or below, all ``host_bound`` (Python) at BUSY_UTIL or above, linear in between; all
  ``host_bound`` when there is no counter.

GPU regions (a trace with GPU work, and the region has GPU work of its own, CUDA runtime calls, or
the GPU busy in its windows): the region's self windows are split by what the GPU and the host did
at each instant (:mod:`.gpu_windows`), every instant counted once:
- GPU busy (union of kernels, memcpy, memset) → the work, ``memory_bandwidth`` / ``compute`` by the
  side of the roofline the region's own kernels sit on (kernel names when FLOPs are unknown), except
  ``communication`` where only collective kernels run (not hidden behind compute) and ``sync_wait``
  where the host blocks in a sync call while the GPU runs work that is not the region's;
- GPU idle, by what the host was doing for the region (on any of its threads), in this priority:
  a sync call or blocking copy → ``sync_wait``; an allocation call → ``allocation``; a context /
  setup call → ``setup``; a collective call or op (gloo) → ``communication``; a launch call (and
  the wait for its kernel to start) → ``launch_overhead``; an op (also the eager op around a
  launch: its dispatch, cuDNN setup, a host-side copy or a Python-level optimizer loop is host
  work, not the launch; the evidence keeps it apart as ``gpu_idle_by_host_us.op_launch``) or
  nothing recorded → ``host_bound`` / ``idle`` by the ``cpu_util`` counter as on the CPU path (all
  ``host_bound`` without one).
A region whose windows have the GPU at least GPU_BUSY_FRAC busy is never ``host_bound`` or
``launch_overhead``: the host kept the GPU fed.

Confidence = (winning component / T) * quality, where quality is 1 for launch overhead and for
host/idle with a utilization counter, 0.7 for host/idle without one, and for memory/compute the
fraction of op (kernel) time whose FLOPs or bytes are known, at least 0.4 (name heuristics).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil_pgc.analyze import vocabulary
from cuvil_pgc.analyze._prepare import Prepared
from cuvil_pgc.analyze.analysis import Analysis
from cuvil_pgc.analyze.gpu_windows import split_windows
from cuvil_pgc.analyze.hot_regions import region_stats
from cuvil_pgc.analyze.intervals import grouped_union_length
from cuvil_pgc.analyze.passes import requires
from cuvil_pgc.analyze.runtime_api import CATEGORIES, COMPUTE_NAMES, is_comm
from cuvil_pgc.trace.schema import COUNTER_CPU_UTIL, Kind

GPU_BUSY_FRAC = 0.9    # GPU at least this busy in a region's windows: never host_bound / launch_overhead
NAME_ONLY_QUALITY = 0.4
IDLE_UTIL = 0.05       # process busy on at most this many cores during uncovered time: idle
BUSY_UTIL = 0.15       # ... at least this many: busy (host_bound); linear in between
NO_COUNTER_QUALITY = 0.7


class Rule:
    """One bottleneck class: how much of the region's time it explains, and how sure we are."""

    name = "rule"

    def explained_us(self, ev: dict[str, Any]) -> float:
        raise NotImplementedError

    def match(self, ev: dict[str, Any]) -> bool:
        return self.explained_us(ev) > 0.0

    def quality(self, ev: dict[str, Any]) -> float:
        return 1.0

    def confidence(self, ev: dict[str, Any]) -> float:
        t = ev["self_us"]
        return float(np.clip(self.explained_us(ev) / t * self.quality(ev), 0.0, 1.0)) if t > 0 else 0.0


class LaunchOverhead(Rule):
    name = "launch_overhead"

    def explained_us(self, ev):
        return ev["_c"]["launch"]


class _Work(Rule):
    side = ""

    def explained_us(self, ev):
        return ev["_c"]["work"] if ev["_side"] == self.side else 0.0

    def quality(self, ev):
        return max(ev["_known_frac"], NAME_ONLY_QUALITY)


class MemoryBandwidth(_Work):
    name = side = "memory_bandwidth"


class Compute(_Work):
    name = side = "compute"


class _Component(Rule):
    """A class explained by one component of the split (GPU path only; 0 on the CPU path)."""

    key = ""

    def explained_us(self, ev):
        return ev["_c"].get(self.key, 0.0)


class Communication(_Component):
    name, key = "communication", "comm"


class SyncWait(_Component):
    name, key = "sync_wait", "sync"


class Allocation(_Component):
    name, key = "allocation", "alloc"


class Setup(_Component):
    name, key = "setup", "setup"


class HostBound(Rule):
    name = "host_bound"

    def explained_us(self, ev):
        return ev["_c"]["host"]

    def quality(self, ev):
        return 1.0 if ev.get("cpu_util") is not None else NO_COUNTER_QUALITY


class Idle(HostBound):
    name = "idle"

    def explained_us(self, ev):
        return ev["_c"]["idle"]


_RULES = {r.name: r for r in (LaunchOverhead(), MemoryBandwidth(), Compute(), Communication(), SyncWait(),
                               Allocation(), Setup(), HostBound(), Idle())}
#: one rule per class of the vocabulary, in its order (a class without a rule is an error at import)
RULES: list[Rule] = [_RULES[name] for name in vocabulary.NAMES]
#: classes a region with the GPU at least GPU_BUSY_FRAC busy in its windows cannot get
NOT_WHEN_GPU_BUSY = ("host_bound", "launch_overhead")


@requires(region_stats)          # the regions, and their top ops in prep.extras
def attribute_bottlenecks(prep: Prepared, analysis: Analysis) -> None:
    """Pass: set ``bottleneck``, ``confidence`` and ``evidence`` on every region."""
    util = cpu_util_by_path(prep)
    names = _dominant_names(prep)
    split = prep.extras.get("gpu_windows") or split_windows(prep)
    comm_ops = comm_op_time(prep)
    for i, r in enumerate(analysis.regions):
        u = None if util is None or np.isnan(util[i]) else float(util[i])
        ev = region_evidence(prep, i, r.self_us, u, names[i], {k: float(v[i]) for k, v in split.items()},
                             float(comm_ops[i]))
        scores = {rule.name: rule.explained_us(ev) for rule in RULES}
        allowed = [rule for rule in RULES
                   if not (ev.get("gpu_busy_frac", 0.0) >= GPU_BUSY_FRAC and rule.name in NOT_WHEN_GPU_BUSY)]
        best = max(allowed, key=lambda rule: (scores[rule.name], -RULES.index(rule)))
        if scores[best.name] <= 0:
            best = RULES[-1]     # no time to explain at all: the region is empty
        r.bottleneck = best.name
        r.confidence = best.confidence(ev) if scores[best.name] > 0 else 0.0
        ev["explained_us"] = {k: float(v) for k, v in scores.items()}
        r.evidence = {k: v for k, v in ev.items() if not k.startswith("_")}


def region_evidence(prep: Prepared, i: int, self_us: float, util: float | None, names: str,
                    split: dict[str, float] | None = None, comm_op_us: float = 0.0) -> dict[str, Any]:
    w, roofs = prep.work, prep.roofs
    split = split or {}
    runtime_calls = sum(split.get(f"runtime_{c}_calls", 0.0) for c in CATEGORIES)
    gpu = bool(w.gpu_count[i] > 0 or (split.get("window", 0.0) > 0
                                      and (split.get("busy", 0.0) > 0 or runtime_calls > 0)))
    busy = float(w.gpu_time[i] if gpu else w.op_time[i])
    flops = float(w.gpu_flops[i] if gpu else w.op_flops[i])
    nbytes = float(w.gpu_bytes[i] if gpu else w.op_bytes[i])
    peak = (roofs.gpu_peak_flops or roofs.peak_flops) if gpu else roofs.peak_flops
    bw = (roofs.gpu_mem_bw or roofs.mem_bw) if gpu else roofs.mem_bw
    f_time = float(w.gpu_time[i] if gpu else w.op_flops_time[i]) if flops > 0 else 0.0
    b_time = float(w.gpu_time[i] if gpu else w.op_bytes_time[i]) if nbytes > 0 else 0.0
    ach_f = flops / (f_time * 1e-6) if f_time > 0 else None
    ach_b = nbytes / (b_time * 1e-6) if b_time > 0 else None
    intensity = flops / nbytes if flops > 0 and nbytes > 0 else None
    ev: dict[str, Any] = {
        "device": "cuda" if gpu else "cpu",
        "self_us": float(self_us),
        "op_count": float(w.op_count[i]),
        "kernel_count": float(w.gpu_count[i]),
        "median_op_us": _opt(w.op_median[i]),
        "median_kernel_us": _opt(w.gpu_median[i]),
        "op_time_us": float(w.op_time[i]),
        "kernel_time_us": float(w.gpu_time[i]),
        "flops": flops, "bytes": nbytes,
        "achieved_flops_s": ach_f, "achieved_bytes_s": ach_b,
        "frac_peak_flops": None if ach_f is None else ach_f / peak,
        "frac_peak_bw": None if ach_b is None else ach_b / bw,
        "intensity": intensity, "ridge": peak / bw if bw > 0 else None,
        "uncovered_frac": max(self_us - busy, 0.0) / self_us if self_us > 0 else 0.0,
        "dispatch_overhead_us": float(w.op_count[i] * roofs.dispatch_us),
        "fixed_cost_us": float(w.op_fixed_time[i]),
        "short_gap_us": float(w.short_gap_time[i]),
        "launch_overhead_us": float(w.gpu_count[i] * roofs.launch_us),
        "runtime_us": float(w.runtime_time[i]),
        "comm_kernel_frac": _comm_frac(prep, i),
        "comm_op_us": comm_op_us,
        "cpu_util": util,
        "dominant_ops": names,
    }
    ev["_known_frac"] = min(max(f_time, b_time) / busy, 1.0) if busy > 0 else 0.0
    ev["_side"] = _side(intensity, ev["ridge"], names)
    if gpu:
        ev.update(_gpu_evidence(split, self_us, float(w.gpu_time[i])))
        ev["uncovered_frac"] = 1.0 - ev["gpu_busy_frac"]
        ev["_c"] = _gpu_components(ev, split)
    else:
        ev["_c"] = _cpu_components(ev)
    return ev


def _gpu_evidence(split: dict[str, float], self_us: float, own_union: float) -> dict[str, Any]:
    """The GPU figures of one region: busy time in its windows, runtime time by API, idle causes."""
    win = split.get("window", 0.0)
    scale = self_us / win if win > 0 else 0.0
    busy = split.get("busy", 0.0) * scale
    return {
        "gpu_busy_us": busy,
        "gpu_busy_frac": min(busy / self_us, 1.0) if self_us > 0 else 0.0,
        "kernel_time_us": min(split.get("own_busy", 0.0) * scale, self_us),
        "kernel_busy_us": own_union,
        "comm_exposed_us": split.get("comm_exposed", 0.0) * scale,
        "runtime_by_api_us": {c: split.get(f"runtime_{c}", 0.0) for c in CATEGORIES},
        "runtime_calls_by_api": {c: split.get(f"runtime_{c}_calls", 0.0) for c in CATEGORIES},
        "gpu_idle_by_host_us": {k.removeprefix("idle_"): v * scale for k, v in split.items() if k.startswith("idle_")},
        "sync_wait_busy_us": split.get("sync_foreign", 0.0) * scale,
    }


def _opt(x: float) -> float | None:
    return None if np.isnan(x) else float(x)


def _side(intensity: float | None, ridge: float | None, names: str) -> str:
    if intensity is not None and ridge is not None:
        return "compute" if intensity >= ridge else "memory_bandwidth"
    return "compute" if COMPUTE_NAMES.search(names or "") else "memory_bandwidth"


def _cpu_components(ev: dict[str, Any]) -> dict[str, float]:
    t, ops = ev["self_us"], ev["op_time_us"]
    launch = min(ev["fixed_cost_us"] + ev["short_gap_us"], t)
    comm = min(ev["comm_op_us"], max(ops - ev["fixed_cost_us"], 0.0))     # gloo collectives run as ops
    work = max(ops - ev["fixed_cost_us"] - comm, 0.0)
    uncovered = max(t - ops - ev["short_gap_us"], 0.0)
    idle_frac = _idle_frac(ev["cpu_util"])
    return {"launch": launch, "work": work, "comm": comm, "host": uncovered * (1 - idle_frac),
            "idle": uncovered * idle_frac}


def comm_op_time(prep: Prepared) -> np.ndarray:
    """Per path: host time in collective communication ops (any nesting depth; the union per source
    and thread, weighted), e.g. ``gloo:all_reduce`` or ``c10d::allreduce_``."""
    ev, n = prep.trace.events, prep.n_paths
    ops = np.nonzero((ev["kind"] == Kind.CPU_OP) & (prep.path_pos >= 0))[0]
    if not len(ops) or not n:
        return np.zeros(n)
    names = prep.trace.strings.strings
    uniq, inv = np.unique(ev["name"][ops], return_inverse=True)
    ops = ops[np.array([is_comm(names[int(u)]) for u in uniq], dtype=bool)[inv]]
    if not len(ops):
        return np.zeros(n)
    lanes, lane_code = np.unique(prep.lane[ops], return_inverse=True)
    key = lane_code.astype(np.int64) * n + prep.path_pos[ops]
    by = grouped_union_length(ev["ts"][ops], ev["ts"][ops] + ev["dur"][ops], key, len(lanes) * n)
    w = prep.weight[ops]
    lane_w = np.zeros(len(lanes))
    lane_w[lane_code] = w
    return (by.reshape(len(lanes), n) * lane_w[:, None]).sum(axis=0)


def _gpu_components(ev: dict[str, Any], split: dict[str, float]) -> dict[str, float]:
    """Components of the region's self time from the window split (scaled to ``self_us``)."""
    t, win = ev["self_us"], split.get("window", 0.0)
    scale = t / win if win > 0 else 0.0
    idle = {k.removeprefix("idle_"): v * scale for k, v in split.items() if k.startswith("idle_")}
    comm_busy = ev["comm_exposed_us"]
    sync_busy = ev["sync_wait_busy_us"]
    idle_frac = _idle_frac(ev["cpu_util"])
    return {"work": max(ev["gpu_busy_us"] - comm_busy - sync_busy, 0.0),
            "comm": comm_busy + idle.get("comm", 0.0),
            "sync": sync_busy + idle.get("sync", 0.0),
            "alloc": idle.get("alloc", 0.0), "setup": idle.get("setup", 0.0),
            "launch": idle.get("launch", 0.0),
            "host": idle.get("op", 0.0) + idle.get("op_launch", 0.0) + idle.get("none", 0.0) * (1 - idle_frac),
            "idle": idle.get("none", 0.0) * idle_frac}


def _comm_frac(prep: Prepared, i: int) -> float:
    """Share of the region's top op / kernel time in collective communication (names)."""
    ops = prep.extras.get("top_ops", [[]] * prep.n_paths)[i] if prep.extras.get("top_ops") else []
    tot = sum(o["total_us"] for o in ops)
    return sum(o["total_us"] for o in ops if is_comm(o["name"])) / tot if tot > 0 else 0.0


def _idle_frac(util: float | None) -> float:
    """Share of uncovered time taken as idle, from the process's CPU utilization (cores busy):
    0 at BUSY_UTIL or more (on a shared machine a runnable thread may get only part of a core),
    1 at IDLE_UTIL or less, linear in between."""
    if util is None:
        return 0.0
    return float(np.clip((BUSY_UTIL - util) / (BUSY_UTIL - IDLE_UTIL), 0.0, 1.0))


def _dominant_names(prep: Prepared) -> list[str]:
    """Per path: the names of the ops/kernels holding most of its time (for the name heuristic)."""
    out = []
    for i, ops in enumerate(prep.extras.get("top_ops", [[]] * prep.n_paths)):
        kind = "kernel" if prep.work.gpu_count[i] > 0 else "op"
        out.append(" ".join([o["name"] for o in ops if o.get("kind", "op") == kind and not is_comm(o["name"])][:2]))
    return out


# Counters read as "how busy was this process", in order of preference: the CPU sampler's
# ``process_cores`` series (cores kept busy), else a plain ``cpu_util`` series (values above 1 are
# percent of one core).
UTIL_COUNTERS = (f"{COUNTER_CPU_UTIL}.process_cores", COUNTER_CPU_UTIL)


def cpu_util_by_path(prep: Prepared) -> np.ndarray | None:
    """Per path: mean process CPU utilization (fraction of one core, at most 1) over its calls,
    time-weighted; None without a utilization counter (see UTIL_COUNTERS)."""
    trace = prep.trace
    c = trace.counters
    ids = [trace.strings.get(name) for name in UTIL_COUNTERS]
    cid = next((i for i in ids if i >= 0 and len(c["ts"]) and np.any(c["name"] == i)), -1)
    if cid < 0:
        return None
    in_cores = cid == ids[0]
    ev, rr = trace.events, prep.region_rows
    a, b = ev["ts"][rr], ev["ts"][rr] + ev["dur"][rr]
    means = np.full(len(rr), np.nan)
    src_r = ev["source"][rr]
    for src in np.unique(src_r):
        sel = (c["name"] == cid) & (c["source"] == src)
        if not sel.any():
            continue
        vals = c["value"][sel]
        if not in_cores and np.nanmax(vals) > 1.0:
            vals = vals / 100.0
        vals = np.clip(vals, 0.0, 1.0)
        on = src_r == src
        means[on] = window_means(c["ts"][sel], vals, a[on], b[on])
    ok = ~np.isnan(means)
    if not ok.any():
        return None
    pos, dur = prep.path_pos[rr][ok], np.maximum(b - a, 1e-9)[ok]
    num = np.bincount(pos, weights=means[ok] * dur, minlength=prep.n_paths)
    den = np.bincount(pos, weights=dur, minlength=prep.n_paths)
    return np.where(den > 0, num / np.where(den > 0, den, 1), np.nan)


def window_means(ts: np.ndarray, values: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Mean of the step function (``values[k]`` from ``ts[k]`` on) over each window [a, b]."""
    order = np.argsort(ts, kind="stable")
    ts, values = ts[order], values[order]
    cum = np.concatenate(([0.0], np.cumsum(values[:-1] * np.diff(ts))))

    def integral(t: np.ndarray) -> np.ndarray:
        k = np.clip(np.searchsorted(ts, t, side="right") - 1, 0, len(ts) - 1)
        return cum[k] + values[k] * (t - ts[k])

    width = b - a
    point = values[np.clip(np.searchsorted(ts, a, side="right") - 1, 0, len(ts) - 1)]
    return np.where(width > 0, (integral(b) - integral(a)) / np.where(width > 0, width, 1), point)
