"""torch's structured-trace records -> ``cat: "compile"`` trace events (the compile track).

Input: raw records ``(wall_ns, native_tid, metadata, payload)`` as the compile sampler's logging
handler captured them from ``torch._logging.trace_structured`` (see ``_compile_hooks``), in the
order torch logged them, plus the sampler's own ``cuvil_callback`` records from
``torch._dynamo.callback_handler``. This module never imports torch, so it is tested with
recorded or hand-written records.

Output (DESIGN.md): ``ph: "X"`` events, ``ts``/``dur`` in trace µs, ``args`` = ``{"compile_id",
"phase", "cache", "reason", "frame", ...}``:

- one ``frame`` event per frame compile (``name`` = the frame's function; ``file``, ``line``,
  ``caller`` (the user's call site when the frame is torch's own wrapper, as for modules),
  ``graph_ops``, ``guard_count``, ``fx_cache``, ``aot_cache``, ``is_forward``, ``fail_type``;
  ``reason`` = why the compile failed, if it did), emitted when torch logs
  the compile's ``compilation_metrics`` (or at ``finish``);
- one event per timed block of the compiler (phases in ``trace.compile_phases``);
- zero-length events for graph breaks (``reason``, ``location`` "file:line", ``detail``),
  recompiles (``reason``: guard failure and changed inputs in one line; ``guards``: the raw guard
  failures), automatic-dynamic decisions (``dynamic_shapes``), and each FX-graph / AOTAutograd
  cache lookup (``cache`` hit/miss/bypass or None for "disabled", ``key``, ``status``; for a miss
  ``reason`` names the key components that differ from the previous compile of the same frame).
- compile windows of non-Dynamo triggers (lazy backward, runtime autotuning, cudagraph recording)
  from the callback handler.

Timestamps: torch's chromium events and the captured ``wall_ns`` are ``time.time_ns()`` readings;
``to_trace_us`` (the session clock's ``unix_to_us``) puts them on the trace clock.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from cuvil_pgc.instrument.samplers import _compile_explain as explain
from cuvil_pgc.trace.compile_phases import (
    AOT_CACHE,
    FRAME,
    FRAME_EVENTS,
    FX_CACHE,
    GRAPH_BREAK,
    RECOMPILE,
    phase_of,
)
from cuvil_pgc.trace.schema import CAT_COMPILE

Raw = tuple[int, int, dict, Any]
CALLBACK_RECORD = "cuvil_callback"
_COMPILE_WRAPPERS = FRAME_EVENTS | {"dynamo"}
_CACHE_ARTIFACTS = {"fx_graph_cache": FX_CACHE, "aotautograd_cache": AOT_CACHE}
_CACHE_LABEL = {FX_CACHE: "FX graph", AOT_CACHE: "AOTAutograd"}
_CACHE_STATES = ("hit", "miss", "bypass")     # others (torch logs "disabled") are recorded with cache None
_TRIGGER_PHASE = {"LAZY_BACKWARD": "lazy_backward", "TRITON_AUTOTUNING": "autotuning",
                  "CUDAGRAPH_RECORDING": "cudagraph_recording"}
_METRIC_KEYS = ("graph_op_count", "guard_count", "is_forward", "fail_type", "cache_size",
                "start_time_us", "duration_us", "start_time", "entire_frame_compile_time_s",
                "recompile_reason", "co_name", "co_filename", "co_firstlineno")


@dataclass
class _Compile:
    """What is known about one frame compile (one compile id)."""

    compile_id: str | None
    frame: str | None = None
    file: str | None = None
    line: int | None = None
    tid: int = 0
    tensors: dict[tuple, dict[str, Any]] = field(default_factory=dict)
    inputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    guards: list[str] = field(default_factory=list)
    recompile_us: float | None = None
    lookups: list[dict[str, Any]] = field(default_factory=list)
    span: tuple[float, float] | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    fail_reason: str | None = None
    caller: str | None = None     # user call site "file:line" when the frame is torch's own wrapper
    finalized: bool = False

    @property
    def label(self) -> str:
        if self.caller:
            return f"{self.frame or 'frame'} ({self.compile_id}, called at {os.path.basename(self.caller)})"
        return f"{self.frame or 'frame'} ({self.compile_id})"

    @property
    def frame_key(self) -> str | None:
        return None if self.compile_id is None else self.compile_id.rsplit("/", 1)[0]


class CompileRecordProcessor:
    """Stateful converter; ``feed`` from one thread (the session's writer), then ``finish``."""

    def __init__(self, to_trace_us: Callable[[float], float], pid: int) -> None:
        self._to_us = to_trace_us        # wall-clock µs -> trace µs
        self._pid = pid
        self._strings: dict[int, str] = {}
        self._compiles: dict[str | None, _Compile] = {}
        self._frames: dict[str | None, list[_Compile]] = {}
        self._open: dict[tuple[int, str], list[tuple[float, str | None]]] = {}
        self._current: dict[int, list[str | None]] = {}
        self._out: list[dict[str, Any]] = []
        self.counts: Counter[str] = Counter()
        self.logging_overhead_us = 0
        self._last_us = 0.0     # latest wall-clock µs seen in any record

    # -- public ------------------------------------------------------------------------------
    def feed(self, records: Iterable[Raw]) -> list[dict[str, Any]]:
        """Process records; returns the events completed by them."""
        for record in records:
            try:
                self._dispatch(*record)
            except Exception as exc:  # one malformed record must not lose the rest
                self.counts[f"unparsed:{type(exc).__name__}"] += 1
        out, self._out = self._out, []
        return out

    def finish(self) -> list[dict[str, Any]]:
        """Close what is still open (a compile running at stop) and finalize every compile."""
        end = self._last_us
        for (tid, name), stack in self._open.items():
            for start, cid in stack:
                self.counts["unfinished_spans"] += 1
                phase = phase_of(name)
                if phase == FRAME:
                    c = self._compile(cid, tid)
                    c.span = (start, max(start, end))
                    c.fail_reason = "still compiling when the session stopped"
                elif phase is not None:
                    self._span(name, phase, start, max(start, end), cid, tid,
                               reason="unfinished when the session stopped")
        self._open.clear()
        for c in list(self._compiles.values()):
            if not c.finalized:
                self._finalize(c)
        out, self._out = self._out, []
        return out

    @property
    def compiles(self) -> int:
        return sum(1 for cid in self._compiles if cid is not None)

    # -- dispatch ----------------------------------------------------------------------------
    def _dispatch(self, wall_ns: int, tid: int, md: dict, payload: Any) -> None:
        kind = next(iter(md))
        self.counts[kind] += 1
        self._last_us = max(self._last_us, wall_ns / 1000.0)
        body = md[kind]
        if kind == "chromium_event":
            event = orjson.loads(payload) if isinstance(payload, (str, bytes)) else payload
            self._chromium(event, tid)
        elif kind == "artifact":
            self._artifact(body.get("name", ""), md, payload, wall_ns / 1000.0, tid)
        elif kind == "str" and isinstance(body, (list, tuple)) and len(body) == 2:
            self._strings[body[1]] = body[0]
        elif kind == "dynamo_start":
            self._dynamo_start(self._compile(_compile_id(md), tid, starting=True), body)
        elif kind == "describe_tensor":
            self._compile(_compile_id(md), tid).tensors[(body.get("describer_id"), body.get("id"))] = {
                "size": body.get("size"), "dtype": body.get("dtype"), "stride": body.get("stride")}
        elif kind == "describe_source":
            c = self._compile(_compile_id(md), tid)
            meta = c.tensors.get((body.get("describer_id"), body.get("id")))
            if meta is not None and body.get("source"):
                c.inputs[body["source"]] = meta
        elif kind == "compilation_metrics":
            self._metrics(body, md, tid)
        elif kind == CALLBACK_RECORD:
            self._callback(body, wall_ns / 1000.0, tid)

    def _compile(self, cid: str | None, tid: int, starting: bool = False) -> _Compile:
        if cid is None and self._current.get(tid):
            cid = self._current[tid][-1]
        c = self._compiles.get(cid)
        if c is not None and starting and c.finalized and cid is not None:
            # The id was used before: torch._dynamo.reset() restarted the frame counters, so no
            # earlier compile is "the previous compile of the same frame" any more.
            self._frames.clear()
            c = None
        if c is None:
            c = self._compiles[cid] = _Compile(cid, tid=tid)
            self._frames.setdefault(c.frame_key, []).append(c)
        return c

    def _dynamo_start(self, c: _Compile, body: dict) -> None:
        stack = [(entry, self._filename(entry)) for entry in body.get("stack") or [] if isinstance(entry, dict)]
        if not stack:
            return
        last, c.file = stack[-1]
        c.frame = last.get("name") or c.frame
        c.line = last.get("line")
        if _is_torch_file(c.file):
            # torch.compile(module) compiles torch's own wrapper (``inner``): name the user's call.
            user = [(entry, name) for entry, name in stack if name and not _is_torch_file(name)]
            if user:
                c.caller = f"{user[-1][1]}:{user[-1][0].get('line')}"

    def _filename(self, entry: dict) -> str | None:
        filename = entry.get("filename")
        return self._strings.get(filename, filename if isinstance(filename, str) else None)

    # -- chromium events ---------------------------------------------------------------------
    def _chromium(self, event: dict, tid: int) -> None:
        name, ph, ts = event.get("name", ""), event.get("ph"), float(event.get("ts", 0.0))
        args = event.get("args") or {}
        cid = args.get("compile_id")
        cid = None if cid in (None, "None") else str(cid)
        if ph == "B":
            if cid is None:
                cid = self._in_flight(tid)
            if name in _COMPILE_WRAPPERS:
                self._current.setdefault(tid, []).append(cid)
                self._compile(cid, tid, starting=True)
            self._open.setdefault((tid, name), []).append((ts, cid))
        elif ph == "E":
            self._chromium_end(name, ts, cid, tid)
        elif ph == "i":
            self._instant(name, ts, args, cid, tid)

    def _in_flight(self, tid: int) -> str | None:
        """The compile a block without an id belongs to: the one running on this thread, else the
        only one running in the process (Inductor compiles kernels on worker threads)."""
        if self._current.get(tid):
            return self._current[tid][-1]
        running = {stack[-1] for stack in self._current.values() if stack}
        return running.pop() if len(running) == 1 else None

    def _chromium_end(self, name: str, ts: float, cid: str | None, tid: int) -> None:
        stack = self._open.get((tid, name))
        if not stack:
            self.counts["unmatched_end"] += 1
            return
        start, begin_cid = stack.pop()
        cid = cid or begin_cid
        if name in _COMPILE_WRAPPERS:
            current = self._current.get(tid, [])
            if begin_cid in current:
                current.reverse()
                current.remove(begin_cid)
                current.reverse()
        phase = phase_of(name)
        if phase == FRAME:
            self._compile(cid, tid).span = (start, ts)
        elif phase is not None:
            self._span(name, phase, start, ts, cid, tid)

    def _instant(self, name: str, ts: float, args: dict, cid: str | None, tid: int) -> None:
        phase = phase_of(name)
        if phase in (FX_CACHE, AOT_CACHE):
            self._lookup(self._compile(cid, tid), phase, name.rsplit("_", 1)[-1], args, ts, tid)
        elif name == "automatic_dynamic":
            reason = (f"input {explain.source_name(str(args.get('name')))} dim {args.get('dim_changed')} "
                      f"made dynamic ({args.get('reason')}: {args.get('cached')} -> {args.get('new')})")
            self._span(name, "dynamic_shapes", ts, ts, cid, tid, reason=reason)
        elif phase is not None:
            self._span(name, phase, ts, ts, cid, tid)

    def _span(self, name: str, phase: str, start: float, end: float, cid: str | None, tid: int,
              **extra: Any) -> None:
        c = self._compiles.get(cid)
        args = {"compile_id": cid, "phase": phase, "cache": None, "reason": None,
                "frame": c.frame if c is not None else None}
        args.update(extra)
        self._out.append({"ph": "X", "cat": CAT_COMPILE, "name": name, "pid": self._pid, "tid": tid,
                          "ts": self._to_us(start), "dur": max(0.0, end - start), "args": args})

    # -- artifacts -----------------------------------------------------------------------------
    def _artifact(self, name: str, md: dict, payload: Any, t_us: float, tid: int) -> None:
        c = self._compile(_compile_id(md), tid)
        if name == "dynamo_graph_break_reason":
            reason, location, detail = explain.parse_graph_break(payload if isinstance(payload, str) else None)
            self._span("graph break", GRAPH_BREAK, t_us, t_us, c.compile_id, tid,
                       reason=reason, location=location, detail=detail[:1000])
        elif name == "recompile_reasons":
            c.guards = explain.guard_reasons(payload)
            c.recompile_us = t_us
        else:
            base, _, state = name.rpartition("_")
            kind = _CACHE_ARTIFACTS.get(base)
            if kind is not None and state:
                info = orjson.loads(payload) if isinstance(payload, (str, bytes)) and payload else {}
                self._lookup(c, kind, state, info if isinstance(info, dict) else {}, t_us, tid)

    def _lookup(self, c: _Compile, kind: str, state: str, info: dict, t_us: float, tid: int) -> None:
        key = info.get("key")
        for seen in c.lookups:
            if seen["kind"] == kind and seen["key"] == key and key is not None:
                seen["ts"] = min(seen["ts"], t_us)      # the chromium instant marks the lookup itself
                seen["components"] = seen["components"] or explain.parse_components(info.get("components"))
                return
        lookup = {"kind": kind, "state": state if state in _CACHE_STATES else None, "raw_state": state,
                  "key": key, "ts": t_us, "tid": tid,
                  "status": info.get("cache_status_detailed"),
                  "bypass": info.get("cache_bypass_reason") or info.get("reason"),
                  "components": explain.parse_components(info.get("components"))}
        c.lookups.append(lookup)
        if c.finalized:
            self._emit_lookup(c, lookup, self._previous(c))

    # -- compile end -------------------------------------------------------------------------
    def _metrics(self, body: dict, md: dict, tid: int) -> None:
        cid = body.get("compile_id") or _compile_id(md)
        c = self._compile(None if cid in (None, "None") else str(cid), tid)
        c.metrics = {k: body.get(k) for k in _METRIC_KEYS if body.get(k) is not None}
        c.frame = c.frame or body.get("co_name")
        c.file = c.file or body.get("co_filename")
        c.line = c.line or body.get("co_firstlineno")
        if body.get("fail_reason"):
            c.fail_reason = str(body["fail_reason"]).splitlines()[0][:500]
        self.logging_overhead_us += int(body.get("structured_logging_overhead_us") or 0)
        self._finalize(c)

    def _finalize(self, c: _Compile) -> None:
        if c.finalized:
            return
        c.finalized = True
        if c.compile_id is None and c.span is None and not c.lookups:
            return
        previous = self._previous(c)
        self._emit_frame(c)
        guards = c.guards or ([c.metrics["recompile_reason"]] if c.metrics.get("recompile_reason") else [])
        if guards:
            changes = explain.diff_inputs(previous.inputs, c.inputs) if previous else []
            ts = c.recompile_us if c.recompile_us is not None else (c.span or (0.0,))[0]
            self._span("recompile", RECOMPILE, ts, ts, c.compile_id, c.tid,
                       reason=explain.explain_recompile(c.label, guards, changes), guards=guards[:4])
        for lookup in c.lookups:
            self._emit_lookup(c, lookup, previous)
        self._forget_older_than(c)

    def _forget_older_than(self, c: _Compile) -> None:
        """Drop the bulky comparison data of compiles no later compile will be compared with."""
        c.tensors.clear()
        for other in self._frames.get(c.frame_key, []):
            if other is not c and other.finalized and other is not self._previous(c):
                for lookup in other.lookups:
                    lookup["components"] = {}
                other.tensors.clear()

    def _emit_frame(self, c: _Compile) -> None:
        span = c.span or _metrics_span(c.metrics)
        if span is None:
            self.counts["frame_without_span"] += 1
            return
        states = {kind: _combined([lk["state"] for lk in c.lookups if lk["kind"] == kind])
                  for kind in (FX_CACHE, AOT_CACHE)}
        m = c.metrics
        self._span(c.frame or "compile", FRAME, span[0], span[1], c.compile_id, c.tid,
                   cache=states[FX_CACHE], reason=c.fail_reason, file=c.file, line=c.line, caller=c.caller,
                   fx_cache=states[FX_CACHE], aot_cache=states[AOT_CACHE],
                   graph_ops=m.get("graph_op_count"), guard_count=m.get("guard_count"),
                   is_forward=m.get("is_forward"), fail_type=m.get("fail_type"))

    def _emit_lookup(self, c: _Compile, lookup: dict, previous: _Compile | None) -> None:
        kind, state = lookup["kind"], lookup["state"]
        reason = None
        if state == "miss":
            reason = self._miss_reason(c, lookup, previous)
        elif state == "bypass":
            reason = f"{_CACHE_LABEL[kind]} cache bypassed for {c.label}: {lookup['bypass'] or 'no reason given'}"
        elif state is None:
            reason = f"{_CACHE_LABEL[kind]} cache {lookup['raw_state']} for {c.label}"
        self._span(f"{kind} {lookup['raw_state']}", kind, lookup["ts"], lookup["ts"], c.compile_id, lookup["tid"],
                   cache=state, reason=reason, key=lookup["key"], status=lookup["status"])

    def _miss_reason(self, c: _Compile, lookup: dict, previous: _Compile | None) -> str:
        kind = lookup["kind"]
        before = None
        if previous is not None:
            same_kind = [lk for lk in c.lookups if lk["kind"] == kind]
            prev_kind = [lk for lk in previous.lookups if lk["kind"] == kind]
            index = same_kind.index(lookup)
            before = prev_kind[index]["components"] if index < len(prev_kind) else None
        inputs = explain.diff_inputs(previous.inputs, c.inputs) if previous else []
        return explain.explain_cache_miss(_CACHE_LABEL[kind], c.label, lookup["key"], lookup["status"],
                                          has_previous=previous is not None, previous=before,
                                          current=lookup["components"], input_changes=inputs)

    def _previous(self, c: _Compile) -> _Compile | None:
        """The latest earlier compile of the same frame that left anything to compare with."""
        same_frame = self._frames.get(c.frame_key, [])
        if c.compile_id is None or not any(other is c for other in same_frame):
            return None
        for prev in reversed(same_frame[: next(i for i, o in enumerate(same_frame) if o is c)]):
            if prev.inputs or prev.lookups:
                return prev
        return None

    # -- compile callbacks -------------------------------------------------------------------
    def _callback(self, body: dict, t_us: float, tid: int) -> None:
        trigger = str(body.get("trigger") or "DYNAMO").rsplit(".", 1)[-1]
        if trigger == "DYNAMO":
            return      # the frame events already cover Dynamo-triggered compiles
        phase = _TRIGGER_PHASE.get(trigger, trigger.lower())
        name = f"compile ({trigger.lower()})"
        cid = body.get("compile_id")
        if body.get("event") == "start":
            self._open.setdefault((tid, name), []).append((t_us, cid))
        else:
            stack = self._open.get((tid, name))
            if stack:
                start, begin_cid = stack.pop()
                self._span(name, phase, start, t_us, cid or begin_cid, tid)


def _is_torch_file(path: str | None) -> bool:
    return bool(path) and f"{os.sep}torch{os.sep}" in str(path)


def _metrics_span(m: dict[str, Any]) -> tuple[float, float] | None:
    """A frame's wall span (µs) from compilation metrics: µs fields (torch >= 2.6) or seconds."""
    if "start_time_us" in m and "duration_us" in m:
        start = float(m["start_time_us"])
        return start, start + float(m["duration_us"])
    if "start_time" in m and "entire_frame_compile_time_s" in m:
        start = float(m["start_time"]) * 1e6
        return start, start + float(m["entire_frame_compile_time_s"]) * 1e6
    return None


def _compile_id(md: dict) -> str | None:
    frame, attempt_id = md.get("frame_id"), md.get("frame_compile_id")
    ca = md.get("compiled_autograd_id")
    if frame is None or attempt_id is None:
        return None if ca is None else f"!{ca}"
    return f"{frame}/{attempt_id}" if ca is None else f"!{ca}/{frame}/{attempt_id}"


def _combined(states: list[str | None]) -> str | None:
    """One cache state for a compile with several lookups: any miss/bypass wins over hits."""
    for state in ("miss", "bypass", "hit"):
        if state in states:
            return state
    return None
