"""The torch.compile hooks the compile sampler listens on: feature-detected, installed, removed.

Hooks (checked against torch 2.13; each is looked up by name and skipped with a note if absent):

- ``torch._logging.trace_structured`` -- a handler on the ``torch.__trace`` logger receives every
  structured record torch logs while compiling: chromium begin/end events of each timed block
  (``time.time_ns()`` timestamps), graph-break reasons, guard-failure reasons, FX-graph and
  AOTAutograd cache hits/misses with their key components, input tensor descriptions, and each
  frame's ``compilation_metrics``. Adding a handler to a logger needs no torch import, so the
  handler is installed at session start whether or not torch is loaded; torch keeps foreign
  handlers when it (re)configures logging. Costs nothing until torch compiles something.
  While a handler is attached torch also builds the payloads of the records it logs (graph code,
  configs); torch measures that time itself (``structured_logging_overhead_us``) and the sampler
  reports it in its status.
- ``torch._dynamo.callback_handler`` start/end callbacks -- compile windows of every trigger
  (Dynamo frames, lazy backward, runtime autotuning, cudagraph recording). Callbacks take one
  ``CallbackArgs`` in recent releases and no argument in older ones.
- ``torch._dynamo.utils.counters`` -- graph-break and cache counters, reported as deltas over the
  session; ``get_compilation_metrics()`` -- compiles the structured handler did not see.

The Dynamo hooks need ``torch._dynamo`` imported; when it is not yet imported at start they are
installed by the first structured record (which torch logs before a compile's callbacks run).
Capture on the user's thread is one tuple append; everything else happens in the writer thread.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from cuvil_pgc.instrument.samplers._compile_records import CALLBACK_RECORD

TRACE_LOGGER = "torch.__trace"
KEEP_RECORDS = frozenset({"chromium_event", "compilation_metrics", "dynamo_start", "describe_tensor",
                          "describe_source", "str"})
KEEP_ARTIFACTS = frozenset({"dynamo_graph_break_reason", "recompile_reasons", "fx_graph_cache_hit",
                            "fx_graph_cache_miss", "fx_graph_cache_bypass", "aotautograd_cache_hit",
                            "aotautograd_cache_miss", "aotautograd_cache_bypass"})
COUNTERS = {  # counters group -> keys reported as session deltas
    "inductor": ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass"),
    "aot_autograd": ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass"),
    "stats": ("unique_graphs", "calls_captured"),
}

HOOK_STRUCTURED = "torch._logging.trace_structured"
HOOK_CALLBACKS = "torch._dynamo.callback_handler"
HOOK_COUNTERS = "torch._dynamo.utils.counters"
HOOK_METRICS = "torch._dynamo.utils.get_compilation_metrics"


class StructuredTraceHandler(logging.Handler):
    """Appends the structured records the compile track needs to a deque; drops the rest."""

    def __init__(self, sink: deque, capacity: int, on_record: Callable[[], None]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink
        self.capacity = capacity
        self.dropped = 0
        self.errors = 0
        self._on_record = on_record

    def handle(self, record: logging.LogRecord) -> bool:  # no filters, no lock: one append
        try:
            md = getattr(record, "metadata", None)
            if not isinstance(md, dict) or not md:
                return False
            kind = next(iter(md))
            if kind not in KEEP_RECORDS and not (kind == "artifact" and md[kind].get("name") in KEEP_ARTIFACTS):
                return False
            if len(self.sink) >= self.capacity:
                self.dropped += 1
                return False
            self.sink.append((time.time_ns(), threading.get_native_id(), md, getattr(record, "payload", None)))
            self._on_record()
        except Exception:
            self.errors += 1
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.handle(record)


class CompileHooks:
    """Installs the hooks into ``sink``; ``remove`` takes every one of them out again."""

    def __init__(self, sink: deque, capacity: int) -> None:
        self.sink = sink
        self.used: list[str] = []
        self.notes: list[str] = []
        self.handler = StructuredTraceHandler(sink, capacity, self._maybe_install_dynamo)
        self._lock = threading.Lock()
        self._dynamo_done = False
        self._callbacks: tuple[Any, Callable, Callable] | None = None
        self._counters0: dict[str, dict[str, int]] | None = None

    # -- install / remove ----------------------------------------------------------------------
    def install(self) -> None:
        logging.getLogger(TRACE_LOGGER).addHandler(self.handler)
        self.used.append(HOOK_STRUCTURED)
        if "torch._dynamo" in sys.modules:
            self._maybe_install_dynamo()

    def remove(self) -> None:
        logging.getLogger(TRACE_LOGGER).removeHandler(self.handler)
        with self._lock:
            self._dynamo_done = True    # a late record must not install anything any more
            if self._callbacks is not None:
                handler, on_start, on_end = self._callbacks
                _remove(handler, "start", on_start)
                _remove(handler, "end", on_end)
                self._callbacks = None

    def registered(self) -> list[str]:
        """Hooks of this instance still installed in torch (empty after ``remove``)."""
        left = []
        if self.handler in logging.getLogger(TRACE_LOGGER).handlers:
            left.append(HOOK_STRUCTURED)
        if self._callbacks is not None:
            left.append(HOOK_CALLBACKS)
        return left

    def _maybe_install_dynamo(self) -> None:
        if self._dynamo_done or "torch._dynamo" not in sys.modules:
            return
        with self._lock:
            if self._dynamo_done:
                return
            self._dynamo_done = True
            self._install_callbacks()
            counters = _dynamo_attr("utils", "counters")
            if counters is not None:
                self._counters0 = _snapshot(counters)
                self.used.append(HOOK_COUNTERS)
            else:
                self.notes.append(f"{HOOK_COUNTERS} not found in this torch: no counter cross-check")

    def _install_callbacks(self) -> None:
        handler = _dynamo_attr("callback", "callback_handler")
        if handler is None or not hasattr(handler, "register_start_callback"):
            self.notes.append(f"{HOOK_CALLBACKS} not found in this torch: compile windows come from "
                              "the structured trace only")
            return
        on_start, on_end = self._callback("start"), self._callback("end")
        handler.register_start_callback(on_start)
        handler.register_end_callback(on_end)
        self._callbacks = (handler, on_start, on_end)
        self.used.append(HOOK_CALLBACKS)

    def _callback(self, event: str) -> Callable[..., None]:
        sink = self.sink

        def on_compile(*args: Any) -> None:   # CallbackArgs in torch >= 2.7, nothing before
            try:
                info = args[0] if args else None
                trigger = getattr(info, "callback_trigger", None)
                sink.append((time.time_ns(), threading.get_native_id(), {CALLBACK_RECORD: {
                    "event": event, "trigger": getattr(trigger, "name", None) or "DYNAMO",
                    "compile_id": getattr(info, "compile_id", None)}}, None))
            except Exception:
                pass

        return on_compile

    # -- read at stop --------------------------------------------------------------------------
    def counter_deltas(self) -> dict[str, int]:
        """Counters that moved during the session, ``{"group.key": delta}``, plus graph breaks."""
        counters = _dynamo_attr("utils", "counters") if self._counters0 is not None else None
        if counters is None:
            return {}
        now = _snapshot(counters)
        out = {}
        for group, keys in now.items():
            for key, value in keys.items():
                delta = value - self._counters0.get(group, {}).get(key, 0)
                if delta:
                    out[f"{group}.{key}"] = delta
        return out

    def compilation_metrics_since(self, start_unix_us: float) -> list[dict[str, Any]]:
        """torch's own compilation metrics of compiles that started after ``start_unix_us``."""
        get = _dynamo_attr("utils", "get_compilation_metrics")
        if get is None:
            return []
        self.used.append(HOOK_METRICS)
        out = []
        for m in get():
            fields = getattr(m, "__dict__", None) or {}
            start = fields.get("start_time_us") or (fields.get("start_time") or 0) * 1e6
            if start >= start_unix_us:
                out.append(dict(fields))
        return out


def _dynamo_attr(module: str, name: str) -> Any:
    mod = sys.modules.get(f"torch._dynamo.{module}")
    if mod is None and "torch._dynamo" in sys.modules:
        try:
            import importlib

            mod = importlib.import_module(f"torch._dynamo.{module}")
        except Exception:
            return None
    return getattr(mod, name, None)


def _snapshot(counters: Any) -> dict[str, dict[str, int]]:
    snap = {group: {key: int(counters[group][key]) for key in keys if key in counters.get(group, {})}
            for group, keys in COUNTERS.items()}
    snap["graph_break"] = {"total": int(sum(counters.get("graph_break", {}).values()))}
    return snap


def _remove(handler: Any, which: str, callback: Callable) -> None:
    """Unregister one callback; gone already (``torch._dynamo.reset()`` clears them) is fine."""
    remover = getattr(handler, f"remove_{which}_callback", None)
    try:
        if remover is not None:
            remover(callback)
        else:
            getattr(handler, f"{which}_callbacks").remove(callback)
    except (ValueError, AttributeError):
        pass
