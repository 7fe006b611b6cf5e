"""Per-device GPU figures of a trace, the ones HolisticTraceAnalysis (HTA) users know, computed on
the columns (numpy, no per-event Python objects).

Pass :func:`gpu_figures` fills ``analysis.trace["gpu"]``, keyed by device (``"cuda:0"``; with
several sources ``"rank1/cuda:0"``, a source without a rank by its index), and
``analysis.trace["gpu_top_kernels"]`` (trace-wide). GPU work is the kernel, memcpy and memset rows;
a device is a (source, pid) pair (Kineto and our files write the device index as the GPU rows'
pid), a stream a tid on it. Per device:

- ``kernel_count`` / ``kernel_us`` (sum of durations), the same for ``memcpy`` and ``memset``;
- ``busy_us``: the union of all GPU work intervals (overlapping streams counted once);
  ``span_us``: first start to last end; ``idle_us`` = span - busy (HTA's temporal breakdown);
- ``idle_causes_us``: each gap of the device's busy union, by the event that ends it —
  ``host_wait`` when that event's launch (the runtime call with its correlation id) started after
  the gap began (the CPU had not yet enqueued it), else ``kernel_wait`` when the gap is shorter
  than :data:`KERNEL_WAIT_US` (back-to-back launch latency), else ``other`` (waiting on an event,
  a sync, another stream). HTA's rules, applied to the device's union so that the causes add up to
  ``idle_us``; ``streams[s]["idle_causes_us"]`` gives HTA's own per-stream figures (gaps between
  consecutive events of one stream; HTA sums negative gaps of overlapping events too, we count
  them as 0).
- ``streams[s]``: events, busy union, idle causes and ``queue_length`` (outstanding operations:
  +1 at a launch call whose GPU work runs on the stream, -1 when that work starts; ``mean`` and
  ``max`` over the change points as HTA's summary has them, ``time_mean`` weighted by time);
- ``launch_delay_us``: from the end of a launch call (:data:`LAUNCH_CALLS`, memcpy/memset calls
  included as in HTA's default) to the start of its GPU work, clipped at 0: ``count``, ``p50``,
  ``p95``, ``mean``, and ``longer_than_kernel``, the launches whose CPU call outlasted the GPU work
  it launched (kernels that small are launch-bound);
- ``kinds``: ``compute`` / ``communication`` / ``memory`` (count, sum_us, union_us), with kernel
  kinds as HTA defines them (:func:`kernel_kind`), and ``comm_compute_overlap``: the time
  communication and compute kernels run at once, over communication time (HTA's ratio);
- ``top_kernels``: the kernels holding most GPU time (name, kind, count, sum/mean/min/max µs,
  share of the device's kernel time); ``profiler_ranges``: CUPTI range-profiler kernels
  (count, FLOPs from their SASS counters; their times are synthetic and not GPU time).

Where we differ from HTA on purpose (see README): timestamps keep their ns fractions (HTA rounds
start up and end down to whole µs), GPU work whose launch is outside the trace still counts (HTA's
queue length and launch statistics drop it, and its idle breakdown calls its gap ``other``), every
rank and device is reported (HTA analyses rank 0 unless told), ``cuLaunchKernel`` (Triton) counts
as a launch, and ``rccl`` kernels are communication.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from cuvil_pgc.analyze import intervals
from cuvil_pgc.analyze._prepare import Prepared
from cuvil_pgc.analyze.analysis import Analysis
from cuvil_pgc.analyze.bottleneck import attribute_bottlenecks
from cuvil_pgc.analyze.passes import requires
from cuvil_pgc.trace.columns import Trace
from cuvil_pgc.trace.schema import CAT_PROFILER_RANGE, Kind

#: Idle gaps shorter than this are back-to-back launch latency (HTA's ``consecutive_kernel_delay``
#: default of 30, compared with µs timestamps, though its docstring says ns).
KERNEL_WAIT_US = 30.0
#: Runtime / driver calls that put work on a stream (HTA's list, plus cuLaunchKernel and the Ex forms).
LAUNCH_CALLS = frozenset((
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchCooperativeKernel",
    "cudaMemcpyAsync", "cudaMemsetAsync", "hipLaunchKernel", "hipExtModuleLaunchKernel", "hipModuleLaunchKernel",
    "hipMemcpyAsync", "hipMemsetAsync", "hipMemcpyWithStream"))
_COMM = re.compile(r"^[nr]ccl.*Kernel")                    # HTA: ^nccl.*Kernel
_NOT_COMPUTE = re.compile(r"(^[nr]ccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")    # HTA's, kept as it is
_GPU = np.array([Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], dtype=np.uint8)
KINDS = ("compute", "communication", "memory", "other")
TOP_KERNELS = 10


def kernel_kind(name: str, kind: int = Kind.KERNEL) -> str:
    """``communication`` (NCCL/RCCL kernels), ``memory`` (memcpy, memset, dma), ``compute``, or
    ``other`` (HTA's rules: names matching its not-compute pattern, e.g. ``...Sync``)."""
    if kind in (Kind.MEMCPY, Kind.MEMSET) or name.startswith(("Memcpy", "Memset", "dma")):
        return "memory"
    if _COMM.match(name):
        return "communication"
    return "other" if _NOT_COMPUTE.match(name) else "compute"


@requires(attribute_bottlenecks)  # regions, and the evidence it adds to
def gpu_figures(prep: Prepared, analysis: Analysis) -> None:
    """Pass: ``analysis.trace["gpu"]`` and ``["gpu_top_kernels"]`` (see module docstring), and per
    region the GPU work counts by kind (``evidence["gpu_work"]``)."""
    trace = prep.trace
    figures, top = device_figures(trace)
    if figures:
        analysis.trace["gpu"] = figures
        analysis.trace["gpu_top_kernels"] = top
    _region_work(prep, analysis)


def device_figures(trace: Trace) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """``({device: figures}, trace-wide top kernels)`` of a Trace."""
    ev = trace.events
    gpu = np.nonzero(np.isin(ev["kind"], _GPU))[0]
    ranges = _profiler_range_rows(trace)
    if not len(gpu) and not len(ranges):
        return {}, []
    launch_ts, launch_end, launch_ok = _launches(trace, gpu)
    kinds = _kernel_kinds(trace, gpu)
    keys = ev["source"][gpu].astype(np.int64) << 32 | (ev["pid"][gpu] & 0xFFFFFFFF)
    out: dict[str, dict[str, Any]] = {}
    for key in np.unique(keys).tolist():
        sel = np.nonzero(keys == key)[0]
        label, fig = _device(trace, gpu[sel], kinds[sel], launch_ts[sel], launch_end[sel], launch_ok[sel])
        out[label] = fig
    for label, fig in _range_figures(trace, ranges).items():
        out.setdefault(label, {"device": label}).update(fig)
    return out, _top_kernels(trace, gpu, kinds)


# ------------------------------------------------------------------ one device

def _device(trace: Trace, rows: np.ndarray, kinds: np.ndarray, launch_ts: np.ndarray, launch_end: np.ndarray,
            launched: np.ndarray) -> tuple[str, dict[str, Any]]:
    ev = trace.events
    ts, dur, kind = ev["ts"][rows], ev["dur"][rows], ev["kind"][rows]
    end = ts + dur
    src, pid = int(ev["source"][rows[0]]), int(ev["pid"][rows[0]])
    label = _device_label(trace, src, pid)
    s, e, opener = intervals.merge_with_openers(ts, end)
    busy = float(np.sum(e - s))
    span = float(end.max() - ts.min()) if len(ts) else 0.0
    fig: dict[str, Any] = {"device": label, "source": src, "rank": trace.sources[src].rank if trace.sources else 0}
    name = _device_name(trace, src, pid)
    if name:
        fig["name"] = name
    for k, what in ((Kind.KERNEL, "kernel"), (Kind.MEMCPY, "memcpy"), (Kind.MEMSET, "memset")):
        m = kind == k
        fig[f"{what}_count"] = int(m.sum())
        fig[f"{what}_us"] = float(dur[m].sum())
    fig.update(busy_us=busy, span_us=span, idle_us=max(span - busy, 0.0),
               busy_frac=busy / span if span > 0 else None)
    gap_start, gap_end = e[:-1], s[1:]
    fig["idle_causes_us"] = _causes(gap_start, gap_end, launch_ts[opener[1:]], launched[opener[1:]])
    fig["streams"] = _streams(trace, rows, ts, end, launch_ts, launched)
    fig["launch_delay_us"] = _launch_delay(ts, dur, launch_ts, launch_end, launched, rows, ev)
    fig["kinds"], fig["comm_compute_overlap"] = _kinds(ts, end, dur, kinds)
    fig["top_kernels"] = _top_kernels(trace, rows, kinds)
    return label, fig


def _causes(gap_start: np.ndarray, gap_end: np.ndarray, launch_ts: np.ndarray, launched: np.ndarray) -> dict[str, float]:
    gap = np.maximum(gap_end - gap_start, 0.0)
    host = launched & (launch_ts > gap_start)
    kernel = ~host & (gap < KERNEL_WAIT_US)
    other = ~host & ~kernel
    return {"host_wait": float(gap[host].sum()), "kernel_wait": float(gap[kernel].sum()),
            "other": float(gap[other].sum())}


def _streams(trace: Trace, rows: np.ndarray, ts: np.ndarray, end: np.ndarray, launch_ts: np.ndarray,
             launched: np.ndarray) -> dict[str, dict[str, Any]]:
    tid = trace.events["tid"][rows]
    out: dict[str, dict[str, Any]] = {}
    for t in np.unique(tid).tolist():
        m = np.nonzero(tid == t)[0]
        m = m[np.argsort(ts[m], kind="stable")]
        s, e = ts[m], end[m]
        prev_end = e[:-1]                       # HTA: the previous event's end, in start order
        causes = _causes(prev_end, s[1:], launch_ts[m][1:], launched[m][1:])
        out[_stream_label(trace, int(t))] = {
            "events": int(len(m)), "busy_us": intervals.union_length(s, e), "idle_causes_us": causes,
            "queue_length": _queue_length(s, launch_ts[m], launched[m])}
    return out


def _queue_length(gpu_ts: np.ndarray, launch_ts: np.ndarray, launched: np.ndarray) -> dict[str, float | None]:
    """+1 at each launch, -1 at the start of its GPU work (launched work only, as HTA)."""
    if not launched.any():
        return {"mean": None, "max": None, "time_mean": None}
    t = np.concatenate([launch_ts[launched], gpu_ts[launched]])
    step = np.concatenate([np.ones(int(launched.sum())), -np.ones(int(launched.sum()))])
    order = np.lexsort((-step, t))                # on ties the launch first
    t, q = t[order], np.cumsum(step[order])
    held = np.diff(t)
    time_mean = float(np.sum(q[:-1] * held) / held.sum()) if len(held) and held.sum() > 0 else float(q.mean())
    return {"mean": float(q.mean()), "max": float(q.max()), "time_mean": time_mean}


def _launch_delay(ts: np.ndarray, dur: np.ndarray, launch_ts: np.ndarray, launch_end: np.ndarray,
                  launched: np.ndarray, rows: np.ndarray, ev: dict[str, np.ndarray]) -> dict[str, Any]:
    if not launched.any():
        return {"count": 0, "p50": None, "p95": None, "mean": None, "longer_than_kernel": 0}
    corr = ev["correlation"][rows]
    idx = np.nonzero(launched)[0]
    idx = idx[np.lexsort((ts[idx], corr[idx]))]   # one per launch: its earliest GPU work (graphs launch many)
    first = np.ones(len(idx), dtype=bool)
    first[1:] = corr[idx][1:] != corr[idx][:-1]
    idx = idx[first]
    delay = np.maximum(ts[idx] - launch_end[idx], 0.0)
    cpu_dur = launch_end[idx] - launch_ts[idx]
    return {"count": int(len(idx)), "p50": float(np.percentile(delay, 50)), "p95": float(np.percentile(delay, 95)),
            "mean": float(delay.mean()), "longer_than_kernel": int(np.sum(cpu_dur > dur[idx]))}


def _kinds(ts: np.ndarray, end: np.ndarray, dur: np.ndarray, kinds: np.ndarray) -> tuple[dict[str, Any], dict | None]:
    out: dict[str, Any] = {}
    merged: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for code, k in enumerate(KINDS):
        m = kinds == code
        if not m.any():
            continue
        merged[k] = intervals.merge(ts[m], end[m])
        out[k] = {"count": int(m.sum()), "sum_us": float(dur[m].sum()),
                  "union_us": float(np.sum(merged[k][1] - merged[k][0]))}
    if "communication" not in merged:
        return out, None
    comm = out["communication"]["union_us"]
    both = intervals.intersection_length(merged["communication"], merged["compute"]) if "compute" in merged else 0.0
    return out, {"comm_us": comm, "overlap_us": both, "ratio": both / comm if comm > 0 else None}


# ------------------------------------------------------------------ shared lookups

def _launches(trace: Trace, gpu: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per GPU row: start and end of its launch call (same source and correlation id, a name in
    LAUNCH_CALLS), and whether it has one."""
    ev = trace.events
    n = len(gpu)
    launch_ts, launch_end, ok = np.full(n, np.nan), np.full(n, np.nan), np.zeros(n, dtype=bool)
    launch_names = np.array([trace.strings.get(s) for s in LAUNCH_CALLS], dtype=np.int64)
    rt = np.nonzero((ev["kind"] == Kind.RUNTIME) & (ev["correlation"] >= 0)
                    & np.isin(ev["name"], launch_names[launch_names >= 0]))[0]
    if not len(rt) or not n:
        return launch_ts, launch_end, ok
    key_rt = ev["source"][rt].astype(np.int64) << 48 | ev["correlation"][rt]
    order = np.argsort(key_rt, kind="stable")
    key_rt, rt = key_rt[order], rt[order]
    key = ev["source"][gpu].astype(np.int64) << 48 | ev["correlation"][gpu]
    pos = np.minimum(np.searchsorted(key_rt, key), len(key_rt) - 1)
    ok = (key_rt[pos] == key) & (ev["correlation"][gpu] >= 0)
    launch_ts[ok] = ev["ts"][rt[pos[ok]]]
    launch_end[ok] = launch_ts[ok] + ev["dur"][rt[pos[ok]]]
    return launch_ts, launch_end, ok


def _kernel_kinds(trace: Trace, gpu: np.ndarray) -> np.ndarray:
    """Per GPU row, the index in KINDS of its kernel kind; each distinct (name, kind) classified once."""
    ev = trace.events
    if not len(gpu):
        return np.zeros(0, dtype=np.int8)
    key = ev["name"][gpu].astype(np.int64) * 8 + ev["kind"][gpu]
    uniq, inv = np.unique(key, return_inverse=True)
    codes = np.array([KINDS.index(kernel_kind(trace.strings[int(k) // 8], int(k) % 8)) for k in uniq.tolist()],
                     dtype=np.int8)
    return codes[inv.reshape(-1)]


def _top_kernels(trace: Trace, rows: np.ndarray, kinds: np.ndarray) -> list[dict[str, Any]]:
    ev = trace.events
    is_kernel = ev["kind"][rows] == Kind.KERNEL
    rows, kinds = rows[is_kernel], kinds[is_kernel]
    if not len(rows):
        return []
    ids, dur = ev["name"][rows], ev["dur"][rows]
    uniq, inv = np.unique(ids, return_inverse=True)
    total = np.bincount(inv, weights=dur)
    count = np.bincount(inv)
    lo, hi = np.full(len(uniq), np.inf), np.full(len(uniq), -np.inf)
    np.minimum.at(lo, inv, dur)
    np.maximum.at(hi, inv, dur)
    all_us = float(dur.sum())
    kind_of = np.zeros(len(uniq), dtype=np.int8)
    kind_of[inv.reshape(-1)] = kinds
    out = []
    for j in np.argsort(-total, kind="stable")[:TOP_KERNELS].tolist():
        out.append({"name": trace.strings[int(uniq[j])], "kind": KINDS[kind_of[j]], "count": int(count[j]),
                    "sum_us": float(total[j]),
                    "mean_us": float(total[j] / count[j]), "min_us": float(lo[j]), "max_us": float(hi[j]),
                    "share": float(total[j] / all_us) if all_us > 0 else 0.0})
    return out


def _profiler_range_rows(trace: Trace) -> np.ndarray:
    if not any(CAT_PROFILER_RANGE in w for s in trace.sources for w in s.warnings):
        return np.zeros(0, dtype=np.int64)
    other = trace.of_kind(Kind.OTHER)
    return np.array([r for r in other.tolist() if (trace.args.get(r) or {}).get("cat") == CAT_PROFILER_RANGE],
                    dtype=np.int64) if len(other) else np.zeros(0, dtype=np.int64)


def _range_figures(trace: Trace, rows: np.ndarray) -> dict[str, dict[str, Any]]:
    ev = trace.events
    out: dict[str, dict[str, Any]] = {}
    for r in rows.tolist():
        args = trace.args.get(r) or {}
        device = args.get("device") if isinstance(args.get("device"), int) else int(ev["pid"][r])
        fig = out.setdefault(_device_label(trace, int(ev["source"][r]), device),
                             {"profiler_ranges": {"count": 0, "flops": 0.0}})["profiler_ranges"]
        fig["count"] += 1
        if not np.isnan(ev["flops"][r]):
            fig["flops"] += float(ev["flops"][r])
    return out


def _device_label(trace: Trace, src: int, pid: int) -> str:
    base = f"cuda:{pid}" if pid >= 0 else f"gpu:{trace.strings[-2 - pid]}"
    if len(trace.sources) <= 1:
        return base
    return f"rank{trace.sources[src].rank}/{base}" if _ranks_distinct(trace) else f"source{src}/{base}"


def _ranks_distinct(trace: Trace) -> bool:
    ranks = [s.rank for s in trace.sources]
    return len(set(ranks)) == len(ranks)


def _device_name(trace: Trace, src: int, pid: int) -> str | None:
    if not trace.sources:
        return None
    for d in trace.sources[src].metadata.get("devices") or []:
        if isinstance(d, dict) and d.get("id") == pid and isinstance(d.get("name"), str):
            return d["name"]
    return None


_DIGITS = re.compile(r"(\d+)\s*$")


def _stream_label(trace: Trace, tid: int) -> str:
    """Kineto writes the stream as the tid: an int, or ``"stream 7"`` in torch 1.8-1.10."""
    if tid >= 0:
        return str(tid)
    text = trace.strings[-2 - tid]
    m = _DIGITS.search(text)
    return m.group(1) if m else text


# ------------------------------------------------------------------ per region

def _region_work(prep: Prepared, analysis: Analysis) -> None:
    """``evidence["gpu_work"]`` = {"kernels", "memcpys", "memsets"} of each region with GPU work."""
    g = prep.gpu_rows
    if not len(g) or not prep.n_paths:
        return
    pos, kind = prep.path_pos[g], prep.trace.events["kind"][g]
    counts = {what: np.bincount(pos[kind == k], weights=prep.weight[g][kind == k], minlength=prep.n_paths)
              for k, what in ((Kind.KERNEL, "kernels"), (Kind.MEMCPY, "memcpys"), (Kind.MEMSET, "memsets"))}
    index = {p: i for i, p in enumerate(prep.paths)}
    for r in analysis.regions:
        i = index.get(r.path)
        if i is None:
            continue
        work = {what: float(c[i]) for what, c in counts.items()}
        if any(work.values()):
            r.evidence["gpu_work"] = work


def work_label(evidence: dict[str, Any]) -> str | None:
    """``"1 kernel, 16 memcpys"``: what a region's GPU work is, by kind (None without GPU work)."""
    work = evidence.get("gpu_work")
    if not work:
        return None
    parts = []
    for what, one in (("kernels", "kernel"), ("memcpys", "memcpy"), ("memsets", "memset")):
        n = work.get(what) or 0
        if n:
            parts.append(f"{n:,.0f} {one if round(n) == 1 else what}")
    return ", ".join(parts) or None
