"""Operator capture: aten operators from torch.profiler as ``cpu_op`` events, attributed to regions.

Contract (sampler name ``torch_ops``, DESIGN.md "Trace file"):

- ``start`` enables the Kineto profiler with CPU activity only (CUDA activity belongs to the cupti
  sampler, and two CUPTI subscribers cannot coexist), ``record_shapes`` from the session config,
  and ``profile_all_threads`` where this torch has it, so threads that existed before the session
  and threads started during it are both captured. All profiler start-up cost is paid here,
  before the user's code runs. Ops become available only when the profiler stops, so nothing is
  emitted by ``flush`` and a crash loses the ops (regions and counters are still streamed).
- ``stop`` disables the profiler and reads ``kineto_results.events()`` directly (no
  FunctionEvent / EventList building). Each ``cpu_op`` becomes an X event with
  ``args: {"region_id", "shapes", "dtypes", "flops", "bytes", "depth"}`` and ``bytes_partial: true``
  when the output size could not be inferred (see ``op_cost``). Profiler bookkeeping is skipped:
  only Kineto activity type ``cpu_op`` is kept, so ``ProfilerStep#N``, ``record_function`` ranges
  (``user_annotation``), ``[memory]`` instants and Python-function events never appear as ops.
  Ops whose end was not recorded (still running on another thread at stop) are dropped and
  counted under ``dropped["torch_ops"]``.
- Cost: while recording, torch.profiler's per-op callbacks run on the user's threads; that is
  the whole step-time overhead of op capture (nothing of ours runs per op). On the (shared, busy)
  machine this was written on: about 2.2 µs of CPU per aten op with ``record_shapes``, 1.4 µs
  without (benchmarks/profile_overhead.py). Kineto holds every op in memory until stop, where reading and
  converting them costs a few µs per op (``status["disable_ms"]`` is torch's share,
  ``status["process_ms"]`` ours). Record bounded windows (a schedule, or a few hundred steps)
  rather than hours.
- ``depth`` is the op's nesting depth on its thread: 0 for an op called from Python, 1 for the
  ops it dispatches to (aten::linear → aten::addmm), and so on. FLOP and byte estimates cover an
  op's whole call, so totals are sums over depth-0 ops.

Clock alignment. ``_KinetoEvent.start_ns()`` is Unix-epoch wall time in ns: Kineto stamps events
with its approximate (TSC) clock and converts them with its own (approximate, wall) pairs. Regions
are stamped with ``time.perf_counter_ns()`` (CLOCK_MONOTONIC). Going from one to the other through
the wall clock is off by a few µs or more on a loaded machine, so ``start`` and ``stop`` stamp
clock marks into the profiler's stream, each between two monotonic reads, and ops are placed by
the offset those marks measure (``_kineto_clock``; ``status["clock"]`` reports its error bound and
drift). The marks are profiler ranges named ``cuvil_pgc::clock_mark#...``; they never appear as ops.

Thread ids. ``start_thread_id()`` is a small per-profiler counter (1, 2, ...), not an OS id. For
CPU ops ``device_resource_id()`` is Kineto's system thread id (``gettid()``), which equals
``threading.get_native_id()`` of the recording thread, the id regions are recorded under; so
``tid`` of an op is that value and ops line up with regions on the same thread row.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

import numpy as np

from cuvil_pgc._quiet import kineto_chatter
from cuvil_pgc.instrument.samplers._kineto_clock import MARK_PREFIX, OpClock, stamp_marks
from cuvil_pgc.instrument.samplers.base import Sampler, SamplerContext
from cuvil_pgc.instrument.samplers.op_cost import CONCRETE_OPS, VIEW_OPS, estimate_cost
from cuvil_pgc.trace import schema

log = logging.getLogger("cuvil_pgc")

_OP_ACTIVITY = "cpu_op"
#: what to do where the program runs a torch.profiler of its own (one per process)
_OWN_PROFILER_FIX = "profile with ops=False (--no-ops) and keep the program's own torch.profiler trace"


class TorchOpSampler(Sampler):
    """aten operators from torch.profiler (Kineto, CPU activity), attributed to regions."""

    name = "torch_ops"
    needs_regions = True

    def __init__(self) -> None:
        super().__init__()
        self._ctx: SamplerContext | None = None
        self._profiler: Any = None
        self._start_marks: list[tuple[str, int, int]] = []

    def unavailable(self) -> str | None:
        try:
            import torch
            import torch.autograd.profiler as autograd_profiler
        except Exception as exc:
            return f"torch is not importable ({type(exc).__name__}: {exc}); install torch to capture operators"
        if not torch.autograd.kineto_available():
            return "this torch build has no Kineto profiler; operator capture needs a build with USE_KINETO"
        if getattr(autograd_profiler, "_is_profiler_enabled", False) or torch.autograd._profiler_enabled():
            return f"torch.profiler is already recording in this process; stop it, or {_OWN_PROFILER_FIX}"
        return None

    def start(self, ctx: SamplerContext) -> None:
        self._ctx = ctx
        self._profiler, notes = _start_profiler(ctx.config)
        self._start_marks = stamp_marks("start")
        if notes:
            self.status["notes"] = notes

    def stop(self) -> None:
        profiler, self._profiler = self._profiler, None
        ctx = self._ctx
        if profiler is None or ctx is None:
            return
        import torch.autograd.profiler as autograd_profiler

        if not getattr(autograd_profiler, "_is_profiler_enabled", True):
            # stopped by another: the program's own torch.profiler took over the process's one
            # profiler when it started and ended it when it stopped; what ours recorded is gone.
            # (torch.autograd._profiler_enabled() cannot tell: it answers for the calling thread)
            reason = (f"the program ran its own torch.profiler, which takes over the process's only profiler: "
                      f"no operators here (they are in the program's own trace); {_OWN_PROFILER_FIX}")
            log.warning("cuvil-pgc: sampler %s disabled (%s)", self.name, reason)
            self.status.update(status=schema.STATUS_FAILED, reason=reason)
            return
        stop_marks = stamp_marks("stop")
        t0 = time.perf_counter()
        with kineto_chatter():
            profiler.__exit__(None, None, None)
        t1 = time.perf_counter()
        # Tens of thousands of small lists and dicts: without this, each pass of the cyclic GC over
        # the heap torch built costs more than the conversion itself.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            kineto_events = profiler.kineto_results.events()
            ops, incomplete = read_ops(kineto_events, ctx.config.record_shapes)
            ctx.count_dropped(self.name, incomplete)
            clock = OpClock.measured(ctx.clock, self._start_marks, stop_marks, ops.marks)
            events = to_trace_events(ops, ctx, clock)
            if ctx.config.with_stack or ctx.config.profile_memory:
                from cuvil_pgc.instrument.samplers._torch_extras import extra_events

                events += extra_events(kineto_events, ctx, clock)
        finally:
            if gc_was_enabled:
                gc.enable()
        ctx.emit(events)
        self.status.update(ops=len(events), threads=len(set(ops.tids)), clock=clock.status(),
                           disable_ms=round((t1 - t0) * 1e3, 3),
                           process_ms=round((time.perf_counter() - t1) * 1e3, 3))


def _start_profiler(config: Any) -> tuple[Any, list[str]]:
    """Enable the Kineto profiler (CPU activity); returns it and notes on degraded features."""
    from torch.autograd.profiler import profile

    notes: list[str] = []
    # use_device stays None: CPU activity only, so CUPTI is left to the cupti sampler.
    profiler = profile(use_kineto=True, use_cpu=True, record_shapes=config.record_shapes,
                       with_stack=config.with_stack, profile_memory=config.profile_memory,
                       experimental_config=_experimental_config(notes, config.profile_memory))
    with kineto_chatter():
        profiler.__enter__()
    return profiler, notes


def _experimental_config(notes: list[str], profile_memory: bool = False) -> Any:
    if profile_memory:     # torch drops memory events when profiling all threads
        notes.append("profile_memory: ops and allocations of the thread that started the session (and "
                     "threads it spawns through torch) only; torch records no allocations with profile_all_threads")
        return None
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(profile_all_threads=True)
    except Exception:
        notes.append("this torch has no profile_all_threads: only ops of the thread that started "
                     "the session (and threads it spawns through torch) are captured")
        return None


class OpColumns:
    """Kept ops as parallel lists (one entry per op, in Kineto's order), and the Kineto start of
    each clock mark by name (``_kineto_clock``)."""

    __slots__ = ("names", "starts", "ends", "tids", "shapes", "dtypes", "concrete", "marks")

    def __init__(self) -> None:
        self.names: list[str] = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.tids: list[int] = []
        self.shapes: list[list[list[int]]] = []
        self.dtypes: list[list[str]] = []
        self.concrete: list[Any] = []
        self.marks: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.names)


def read_ops(kineto_events: Any, with_shapes: bool = True) -> tuple[OpColumns, int]:
    """The ``cpu_op`` events of a Kineto result as columns; returns (ops, incomplete count)."""
    ops = OpColumns()
    incomplete = 0
    for ev in kineto_events:
        if not _is_op(ev):
            continue
        start, dur = ev.start_ns(), ev.duration_ns()
        name = ev.name()
        if name.startswith(MARK_PREFIX):
            ops.marks[name] = start
            continue
        if dur < 0:
            incomplete += 1
            continue
        ops.names.append(name)
        ops.starts.append(start)
        ops.ends.append(start + dur)
        ops.tids.append(ev.device_resource_id())
        if with_shapes:
            ops.shapes.append(ev.shapes())
            ops.dtypes.append(ev.dtypes())
            ops.concrete.append(ev.concrete_inputs() if name in CONCRETE_OPS else None)
    return ops, incomplete


def _is_op(ev: Any) -> bool:
    try:
        return ev.activity_type() == _OP_ACTIVITY
    except AttributeError:  # torch without activity_type(): drop annotations and bookkeeping by name
        name = ev.name()
        return not (ev.is_user_annotation() or name.startswith(("ProfilerStep#", "[")))


def nesting_depths(tids: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Depth of each interval among the intervals of its thread (0 = not inside another)."""
    n = len(starts)
    depth = np.zeros(n, dtype=np.int64)
    if not n:
        return depth
    # Thread, start ascending, end descending: a parent sorts before its children; Kineto's own
    # order (parent first) breaks exact ties.
    order = np.lexsort((np.arange(n), -ends, starts, tids))
    stack: list[int] = []
    prev_tid = None
    s_l, e_l, t_l = starts[order].tolist(), ends[order].tolist(), tids[order].tolist()
    out = [0] * n
    for i in range(n):
        if t_l[i] != prev_tid:
            stack.clear()
            prev_tid = t_l[i]
        while stack and stack[-1] <= s_l[i]:
            stack.pop()
        out[i] = len(stack)
        stack.append(e_l[i])
    depth[order] = out
    return depth


def to_trace_events(ops: OpColumns, ctx: SamplerContext, clock: OpClock) -> list[dict[str, Any]]:
    """Chrome-trace X events on the trace clock (``clock``: Kineto's times on it), each with its
    region, shapes and cost estimate."""
    if not len(ops):
        return []
    tids = np.asarray(ops.tids, dtype=np.int64)
    starts_ns = np.asarray(ops.starts, dtype=np.int64)
    ends_ns = np.asarray(ops.ends, dtype=np.int64)
    ts = clock.to_us(starts_ns)
    dur = (ends_ns - starts_ns) / 1000.0
    depth = nesting_depths(tids, starts_ns, ends_ns)
    region_of = _region_ids(ctx, tids, ts)
    with_shapes = bool(ops.shapes)
    costs: dict[Any, Any] = {}
    pid, cat = ctx.pid, schema.CAT_CPU_OP
    events = []
    for i, (name, tid, t, d, lvl, region) in enumerate(zip(
            ops.names, tids.tolist(), ts.tolist(), dur.tolist(), depth.tolist(), region_of, strict=True)):
        args: dict[str, Any] = {"region_id": region, "shapes": None, "dtypes": None, "flops": None,
                                "bytes": None, "depth": lvl}
        if with_shapes:
            _add_cost(args, name, ops.shapes[i], ops.dtypes[i], ops.concrete[i], costs)
        events.append({"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": t, "dur": d,
                       "args": args})
    return events


def _region_ids(ctx: SamplerContext, tids: np.ndarray, ts: np.ndarray) -> list[int | None]:
    index, ids = ctx.region_index()
    if not len(index):
        return [None] * len(ts)
    return [ids[j] if j >= 0 else None for j in index.innermost(tids, ts).tolist()]


def _add_cost(args: dict[str, Any], name: str, shapes: list, dtypes: list, concrete: Any,
              cache: dict[Any, Any]) -> None:
    args["shapes"] = shapes
    args["dtypes"] = dtypes
    if name in VIEW_OPS:        # a third of a typical op stream: no data moved, nothing to compute
        args["flops"] = args["bytes"] = 0
        return
    # Steady-state inference repeats the same calls every step: memoise by the recorded inputs.
    key = (name, tuple(map(tuple, shapes)), tuple(dtypes), None if concrete is None else repr(concrete))
    cost = cache.get(key)
    if cost is None:
        cost = cache[key] = estimate_cost(name, shapes, dtypes, concrete)
    args["flops"] = cost.flops
    args["bytes"] = cost.bytes
    if cost.partial:
        args["bytes_partial"] = True
