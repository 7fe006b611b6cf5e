"""The compile sampler: torch.compile's compilations as the session's compile track.

Runs when ``SessionConfig.compile`` is true. Every compilation torch performs while the session
records becomes ``cat: "compile"`` events (see ``_compile_records`` for the event shapes): a
``frame`` span per compiled frame, its phases (Dynamo, AOTAutograd, Inductor lowering, codegen,
kernel compilation, autotuning), graph breaks with reason and source location, recompiles with
the guard failure and the changed inputs, and FX-graph / AOTAutograd cache hits, misses and
bypasses with an explanation of each miss.

Cost: nothing is imported at start (torch included); the hooks (``_compile_hooks``) cost
nothing until torch compiles. Capture on the compiling thread appends one tuple per record; the
writer thread turns records into events at each flush. Nothing raises into the user's program.

Status (``cuvil.samplers.compile``): ``hooks`` (the torch hooks used), ``notes`` (hooks this
torch lacks), ``compiles``, ``events``, ``counters`` (torch's counter deltas over the session, a
cross-check), ``torch_logging_overhead_ms`` (torch's own measure of the structured-logging time
the hooks caused), ``clock_drift_us`` (largest gap seen between the wall clock torch stamps
events with and the session's monotonic clock; compile events are placed on the wall clock).
"""

from __future__ import annotations

import importlib.util
import threading
import time
from collections import deque
from typing import Any

from cuvil_pgc.instrument.samplers._compile_hooks import CompileHooks
from cuvil_pgc.instrument.samplers._compile_records import CompileRecordProcessor
from cuvil_pgc.instrument.samplers.base import Sampler, SamplerContext

#: Structured records held between two flushes at most; beyond, records are dropped and counted.
RECORD_CAPACITY = 500_000
#: Wall-vs-monotonic drift (µs) above which the status carries a note.
DRIFT_NOTE_US = 1000.0


class CompileSampler(Sampler):
    """Records torch.compile activity through torch's own hooks."""

    name = "compile"

    def __init__(self, capacity: int = RECORD_CAPACITY) -> None:
        super().__init__()
        self._sink: deque = deque()
        self._capacity = capacity
        self._hooks: CompileHooks | None = None
        self._processor: CompileRecordProcessor | None = None
        self._ctx: SamplerContext | None = None
        self._lock = threading.Lock()
        self._events = 0
        self._drift_us = 0.0

    def unavailable(self) -> str | None:
        if importlib.util.find_spec("torch") is None:
            return "torch is not installed: no torch.compile to record"
        return None

    def start(self, ctx: SamplerContext) -> None:
        self._ctx = ctx
        clock = ctx.clock
        self._processor = CompileRecordProcessor(lambda us: clock.unix_to_us(us * 1000.0), ctx.pid)
        self._hooks = CompileHooks(self._sink, self._capacity)
        self._hooks.install()
        self.status["hooks"] = self._hooks.used

    def flush(self) -> None:
        with self._lock:
            self._drain()

    def stop(self) -> None:
        with self._lock:
            hooks, processor = self._hooks, self._processor
            if hooks is None or processor is None:
                return
            hooks.remove()
            self._drain()
            self._feed_unseen_metrics(hooks, processor)
            self._send(processor.finish())
            self._report(hooks, processor)
            self._hooks = None

    def hooks_registered(self) -> list[str]:
        """The torch hooks this sampler still has installed (empty once stopped)."""
        return [] if self._hooks is None else self._hooks.registered()

    # -- internals -----------------------------------------------------------------------------
    def _drain(self) -> None:
        if self._processor is None or not self._sink:
            return
        pop = self._sink.popleft
        records = [pop() for _ in range(len(self._sink))]
        self._send(self._processor.feed(records))
        self._measure_drift()

    def _send(self, events: list[dict[str, Any]]) -> None:
        if events and self._ctx is not None:
            self._events += len(events)
            self._ctx.emit(events)

    def _feed_unseen_metrics(self, hooks: CompileHooks, processor: CompileRecordProcessor) -> None:
        """Compiles torch recorded in its metrics that the structured handler did not see."""
        if processor.counts.get("compilation_metrics"):
            return
        start_us = self._ctx.clock.start_unix_ns / 1000.0
        unseen = [(time.time_ns(), 0, {"compilation_metrics": m}, None)
                  for m in hooks.compilation_metrics_since(start_us)]
        if unseen:
            hooks.notes.append(f"{len(unseen)} compiles known only from get_compilation_metrics() (no phases)")
            self._send(processor.feed(unseen))

    def _measure_drift(self) -> None:
        clock = self._ctx.clock
        wall = time.time_ns() - clock.start_unix_ns
        mono = time.perf_counter_ns() - clock.start_mono_ns
        self._drift_us = max(self._drift_us, abs(wall - mono) / 1000.0)

    def _report(self, hooks: CompileHooks, processor: CompileRecordProcessor) -> None:
        dropped = hooks.handler.dropped
        if dropped:
            self._ctx.count_dropped("compile", dropped)
        notes = list(hooks.notes)
        if self._drift_us > DRIFT_NOTE_US:
            notes.append(f"wall clock moved {self._drift_us / 1000:.1f} ms against the monotonic clock "
                         "during the session; compile events may be offset by up to that")
        if hooks.handler.errors:
            notes.append(f"{hooks.handler.errors} structured records could not be captured")
        if processor.compiles and not processor.counts.get("chromium_event"):
            notes.append("this torch logged no chromium events: frames without a phase breakdown")
        unparsed = sum(n for k, n in processor.counts.items() if k.startswith("unparsed:"))
        if unparsed:
            notes.append(f"{unparsed} structured records could not be read")
        self.status.update(hooks=list(dict.fromkeys(hooks.used)), notes=notes, compiles=processor.compiles,
                           events=self._events, counters=hooks.counter_deltas(),
                           torch_logging_overhead_ms=round(processor.logging_overhead_us / 1000.0, 3),
                           clock_drift_us=round(self._drift_us, 1))
