"""JSON → typed events: one msgspec pass over a whole trace file, plus crash recovery.

Contract:
- ``decode_document(raw)`` decodes a Chrome trace (object form with ``traceEvents``, or the bare
  array form) into a :class:`Document`: a list of typed event structs and the top-level metadata
  keys our files and Kineto's write. Our files (recognised by the ``cuvil_session`` header, or
  by a ``cuvil`` key) give :class:`Event` with raw ``args`` (free-form dicts, batch-decoded by the
  caller); other traces give :class:`KinetoEvent` with ``args`` decoded inline into
  :class:`~cuvil_pgc.trace._args.KinetoArgs`. No dict is built per event.
- ``recover_partial(raw)`` reads back the complete lines of a ``.partial`` file (one JSON value
  per line followed by a comma); a cut-off last line, or any damaged line, is skipped and noted.
- Every failure is a TraceError naming the file, what is wrong and where (byte offset or JSON
  path such as ``$.traceEvents[12].ts``), and whether recovery applies to a truncated file.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

import msgspec

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace._args import NO_ARGS, Int64, KinetoArgs
from cuvil_pgc.trace._input import RawInput
from cuvil_pgc.trace.other_formats import HEAD_BYTES, json_not_a_trace
from cuvil_pgc.trace.schema import META_DROPPED_EVENT, META_SESSION_EVENT, PARTIAL_SUFFIX

_NO_RAW = msgspec.Raw(b"")
_NAN = float("nan")


class _EventFields(msgspec.Struct, gc=False):
    """The fields of a Chrome trace event the reader uses (both kinds of file)."""

    ph: str = ""
    cat: str = ""
    name: str = ""
    pid: Int64 | str = 0
    tid: Int64 | str = 0
    ts: int | float = _NAN       # ints kept exact: Unix-ns timestamps do not fit a float64 to the ns
    dur: int | float = _NAN     # an X event without one: read as 0 and counted (see _build.durations)
    id: Int64 | str | None = None


class Event(_EventFields, gc=False):
    """One event of our files; ``args`` decoded later, in a batch."""

    args: msgspec.Raw = _NO_RAW


class KinetoEvent(_EventFields, gc=False):
    """One event of a torch.profiler / Chrome trace, with its args decoded inline."""

    args: KinetoArgs = NO_ARGS


_RENAME = {"trace_events": "traceEvents", "schema_version": "schemaVersion",
           "device_properties": "deviceProperties", "compute_properties": "computeProperties",
           "distributed_info": "distributedInfo",
           "base_time_ns": "baseTimeNanoseconds", "display_time_unit": "displayTimeUnit",
           "trace_name": "traceName"}


class _Metadata(msgspec.Struct, kw_only=True, rename=_RENAME):
    """Top-level keys of our files (``cuvil``) and of Kineto's, next to ``traceEvents``."""

    cuvil: dict[str, Any] | None = None
    schema_version: Any = None
    device_properties: list[Any] | None = None
    compute_properties: list[Any] | None = None     # torch 1.8's name for deviceProperties
    distributed_info: dict[str, Any] | None = None
    base_time_ns: Int64 | None = None
    display_time_unit: str | None = None
    trace_name: str | None = None
    trace_id: str | None = None
    host_name: str | None = None
    record_shapes: Any = None
    cuda_driver_version: Any = None
    cuda_runtime_version: Any = None
    cupti_version: Any = None
    hip_runtime_version: Any = None
    roctracer_version: Any = None


class Document(_Metadata, kw_only=True, rename=_RENAME):
    """One of our files."""

    trace_events: list[Event]


class KinetoDocument(_Metadata, kw_only=True, rename=_RENAME):
    """A torch.profiler (Kineto) or other Chrome trace."""

    trace_events: list[KinetoEvent]


_DECODERS = {
    (fmt, array): msgspec.json.Decoder(list[ev] if array else doc)
    for fmt, ev, doc in (("cuvil", Event, Document), ("kineto", KinetoEvent, KinetoDocument))
    for array in (False, True)
}
_event_decoder = msgspec.json.Decoder(Event)
_OURS_MARK = re.compile(rb'"name"\s*:\s*"cuvil_session"')
_FIRST_CHAR = re.compile(rb"\S")
_CUVIL_KEY = re.compile(rb'"cuvil"\s*:')
_HEAD = b'{"traceEvents":['


def decode_document(raw: RawInput) -> Document | KinetoDocument:
    """Decode one whole trace file (see module docstring)."""
    data = raw.data
    first = _FIRST_CHAR.search(data)
    array = first is not None and first.group() == b"["
    fmt = "cuvil" if _OURS_MARK.search(data, 0, 4096) else "kineto"
    try:
        doc = _decode(raw, fmt, array)
    except TraceError:
        if fmt == "kineto" and not array and _CUVIL_KEY.search(data):   # ours without its header event
            return _decode(raw, "cuvil", array)
        raise
    if fmt == "kineto" and doc.cuvil is not None:
        doc = _decode(raw, "cuvil", array)
    return doc


def _decode(raw: RawInput, fmt: str, array: bool) -> Document | KinetoDocument:
    try:
        decoded = _DECODERS[fmt, array].decode(raw.data)
    except msgspec.ValidationError as exc:
        raise _validation_error(raw, exc) from None
    except msgspec.DecodeError as exc:
        raise _decode_error(raw, exc) from None
    if array:
        return (Document if fmt == "cuvil" else KinetoDocument)(trace_events=decoded)
    return decoded


def decode_as_ours(raw: RawInput) -> Document:
    """Decode with raw (untyped) args, e.g. to read the counter series of a Kineto file."""
    first = _FIRST_CHAR.search(raw.data)
    return _decode(raw, "cuvil", first is not None and first.group() == b"[")


class _Timed(msgspec.Struct, gc=False):
    ts: Decimal | None = None


class _TimedDocument(msgspec.Struct, rename={"trace_events": "traceEvents"}):
    trace_events: list[_Timed]


_TIMED = {False: msgspec.json.Decoder(_TimedDocument), True: msgspec.json.Decoder(list[_Timed])}


def exact_ns_times(raw: RawInput) -> list[int | None] | None:
    """Every event's ``ts`` (µs as written) in whole ns, read from its decimal text, in file order:
    ``1712166698123456.789`` is 1712166698123456789 here, 1712166698123456.75 in a float64. None
    where a ``ts`` is not a number (the typed decode reports that)."""
    first = _FIRST_CHAR.search(raw.data)
    array = first is not None and first.group() == b"["
    try:
        decoded = _TIMED[array].decode(raw.data)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None
    events = decoded if array else decoded.trace_events
    return [None if e.ts is None or not e.ts.is_finite() else int((e.ts * 1000).to_integral_value())
            for e in events]


def _validation_error(raw: RawInput, exc: msgspec.ValidationError) -> TraceError:
    text = str(exc)
    if "missing required field `traceEvents`" in text:
        other = json_not_a_trace(raw.path, raw.data[:HEAD_BYTES])
        if other is not None:
            return other
        return TraceError("is JSON but has no `traceEvents` list, so it is not a Chrome/Kineto trace",
                          path=raw.path, fix="pass a trace written by cuvil-pgc or torch.profiler")
    if text.startswith("Expected `object`, got") and " - at `" not in text:
        return TraceError(f"is JSON but not a trace object ({text.lower()})", path=raw.path,
                          fix="a trace is an object with a `traceEvents` list")
    return TraceError(f"wrong type in the trace: {text}", path=raw.path,
                      fix="the file does not follow the Chrome trace format; re-export it")


def _decode_error(raw: RawInput, exc: msgspec.DecodeError) -> TraceError:
    text = str(exc)
    if "truncated" in text:
        return TraceError(f"is not complete JSON: it ends after {len(raw.data):,} bytes and looks truncated; "
                          + _recovery_hint(raw), path=raw.path)
    return TraceError(f"is not valid JSON: {text}", path=raw.path,
                      fix="the file is damaged or not a trace; re-export it")


def _recovery_hint(raw: RawInput) -> str:
    if raw.partial:
        return "the partial file holds no complete events to recover"
    if raw.data.startswith(_HEAD + b"\n"):
        return (f"it has the line-per-event layout of a cuvil-pgc trace, so its complete events can be "
                f"recovered: rename it to {raw.path}{PARTIAL_SUFFIX} and load that")
    return ("it is not a cuvil-pgc streaming trace, so there is nothing to recover line by line; "
            "re-export or re-record it")


def recover_partial(raw: RawInput) -> tuple[Document | KinetoDocument, list[str]]:
    """Events of every complete line of a partial file, and notes on what was skipped."""
    data = raw.data
    notes: list[str] = []
    if data.rstrip().endswith(b"}"):     # a session that crashed after writing its tail?
        try:
            return decode_document(raw), ["the partial file is complete JSON (the session ended before "
                                          "renaming it)"]
        except TraceError:
            pass
    if not data.startswith(_HEAD):
        raise TraceError("is a partial trace but does not start like one ({\"traceEvents\":[)", path=raw.path,
                         fix="it was not written by cuvil-pgc, or it is damaged beyond recovery")
    body = data[len(_HEAD):]
    end = body.rfind(b",\n")
    complete, rest = (body[:end], body[end + 2:]) if end >= 0 else (b"", body)
    if rest.strip():
        notes.append(f"dropped an incomplete last line of {len(rest.strip()):,} bytes")
    try:
        events = _DECODERS["cuvil", True].decode(b"[" + complete + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError):
        events = _lines_one_by_one(complete, notes)
    return Document(trace_events=events), notes


def _lines_one_by_one(complete: bytes, notes: list[str]) -> list[Event]:
    events: list[Event] = []
    bad = 0
    for line in complete.split(b",\n"):
        if not line.strip():
            continue
        try:
            events.append(_event_decoder.decode(line))
        except (msgspec.DecodeError, msgspec.ValidationError):
            bad += 1
    if bad:
        notes.append(f"skipped {bad} damaged line(s)")
    return events


def session_header(doc: Document | KinetoDocument) -> dict[str, Any] | None:
    """The ``cuvil_session`` header event's args (our files write it first), if present."""
    for ev in doc.trace_events[:8]:
        if ev.ph == "M" and ev.name == META_SESSION_EVENT and isinstance(ev.args, msgspec.Raw) and ev.args:
            try:
                value = msgspec.json.decode(ev.args)
            except msgspec.DecodeError:
                return None
            return value if isinstance(value, dict) else None
    return None


def partial_drop_counts(doc: Document | KinetoDocument) -> dict[str, int] | None:
    """The latest ``cuvil_dropped`` counters of a partial file (per source, non-negative ints
    kept), or None when it has none (written before schema 2, or nothing was dropped)."""
    for ev in reversed(doc.trace_events):
        if ev.ph == "M" and ev.name == META_DROPPED_EVENT and isinstance(ev.args, msgspec.Raw) and ev.args:
            try:
                value = msgspec.json.decode(ev.args)
            except msgspec.DecodeError:
                continue
            if isinstance(value, dict):
                return {k: v for k, v in value.items() if type(v) is int and v >= 0}
    return None
