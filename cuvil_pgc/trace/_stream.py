"""Streaming a large torch.profiler (Kineto) trace: chunks of events, never the whole file at once.

Contract: ``stream_kineto(path)`` returns ``(metadata, chunks)`` or None when the file is not one
to stream (small, ours, a partial file, not laid out as ``{..., "traceEvents": [...], ...}``).
``chunks`` yields ``(events, raw_events)``: up to :data:`CHUNK_BYTES` of the array's events decoded
as ``KinetoEvent`` structs, and a function decoding the same bytes with raw args (counters and
range-profiler rows need them). ``metadata()`` (call it after the chunks) is a ``KinetoDocument``
with no events holding the top-level keys found before and after the array.

Chunks are cut after a ``}`` followed by ``,`` and ``{``; a cut inside a string fails to decode
and the previous candidate is tried. Any surprise (damaged JSON, invalid UTF-8, more than the
byte or event limit) raises ``StreamFallback``: the reader then reads the file whole, whose errors
name the problem exactly. Peak memory is a few chunks plus the columns, instead of the file's bytes,
every event's struct and the columns together (3M events: see benchmarks/analyze_speed.py).
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import msgspec

from cuvil_pgc.trace._chunks import StreamFallback
from cuvil_pgc.trace._decode import Event, KinetoDocument, KinetoEvent
from cuvil_pgc.trace._input import max_trace_bytes

#: Files at least this large are streamed (plain bytes; gzip: compressed bytes times 8).
STREAM_MIN_BYTES = 64 << 20
CHUNK_BYTES = 16 << 20
HEAD_LIMIT = 16 << 20        # the metadata before "traceEvents" is a few kB; beyond this, read it whole
#: Bytes without an event boundary after which the file is read whole (whose reader names what it
#: holds, or its size limit): gathering on, each block appended would copy all before it, and a
#: file of 12 GB of blanks in its array (a 12 MB gzip) took hours instead of ending at the limit.
MAX_EVENT_BYTES = 4 * CHUNK_BYTES
_ARRAY_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')
_OURS = re.compile(rb'"cuvil_session"|"cuvil"\s*:|"cuvil_summary"')
_EVENTS = msgspec.json.Decoder(list[KinetoEvent])
_RAW_EVENTS = msgspec.json.Decoder(list[Event])
_DOC = msgspec.json.Decoder(KinetoDocument)
_MAX_CUT_TRIES = 64


@dataclass
class Opened:
    """A large Kineto file opened for streaming: the metadata before its event array, and where the
    array's first event starts (``array_start``: an offset in the decompressed bytes)."""

    path: str
    gz: bool
    size: int                         # bytes on disk
    meta_head: KinetoDocument
    head: bytes                       # the first blocks read, up to and past the array's "["
    array_start: int
    blocks: Iterator[bytes]           # the blocks after ``head``


def open_stream(path: str, min_bytes: int | None = None) -> Opened | None:
    """The file opened for streaming, or None when it is not one to stream (see module docstring)."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            gz = f.read(2) == b"\x1f\x8b"
    except OSError:
        return None
    if (size * 8 if gz else size) < (STREAM_MIN_BYTES if min_bytes is None else min_bytes):
        return None
    blocks = _blocks(path, gz)
    head = b""
    for block in blocks:
        head += block
        m = _ARRAY_KEY.search(head)
        if m or len(head) > HEAD_LIMIT:
            break
    else:
        m = _ARRAY_KEY.search(head)
    if m is None or _OURS.search(head, 0, m.start()) or _OURS.search(head, m.end(), m.end() + 4096):
        return None
    try:
        meta_head = _DOC.decode(head[:m.end() - 1] + b"[]}")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return Opened(path, gz, size, meta_head, head, m.end(), blocks)


def merge_metadata(meta_head: KinetoDocument, tail: KinetoDocument | None) -> KinetoDocument:
    """The top-level keys found before the event array and after it, as one document with no events."""
    if tail is None:
        raise StreamFallback("the chunks were not read to the end")
    merged = {f: getattr(meta_head, f) for f in meta_head.__struct_fields__ if f != "trace_events"}
    merged.update({f: getattr(tail, f) for f in tail.__struct_fields__
                   if f != "trace_events" and getattr(tail, f) is not None})
    if merged.get("cuvil") is not None:
        raise StreamFallback("one of our files")
    return KinetoDocument(trace_events=[], **merged)


def decode_tail(rest: bytes) -> tuple[KinetoDocument, list[KinetoEvent], Callable[[], list[Event]]]:
    """The end of the file from an event boundary on: the keys after the array (a document with no
    events), the array's last events, and their raw decode."""
    try:
        doc = _DOC.decode(b'{"traceEvents":[' + rest)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StreamFallback(str(exc)) from None
    events, doc.trace_events = doc.trace_events, []
    return doc, events, lambda: _RAW_EVENTS.decode(_tail_array(rest))


def decode_events(body: bytes) -> tuple[list[KinetoEvent], Callable[[], list[Event]]]:
    """Events between two event boundaries (``{...}, ..., {...}``), typed, and their raw decode."""
    array = b"".join((b"[", body, b"]"))
    try:
        events = _EVENTS.decode(array)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise StreamFallback(str(exc)) from None
    return events, lambda: _RAW_EVENTS.decode(array)


def stream_kineto(path: str, min_bytes: int | None = None) -> tuple[Callable[[], KinetoDocument],
                                                                      Iterator[tuple[list[KinetoEvent], Any]]] | None:
    """See module docstring."""
    opened = open_stream(path, min_bytes)
    if opened is None:
        return None
    state: dict[str, Any] = {"tail": None}

    def chunks() -> Iterator[tuple[list[KinetoEvent], Any]]:
        rest = opened.head[opened.array_start:]
        for block in opened.blocks:
            rest += block
            if len(rest) < CHUNK_BYTES:
                continue
            decoded, rest = _cut(rest)
            if decoded is not None:
                yield decoded
            elif len(rest) > MAX_EVENT_BYTES:     # no profiler writes such an event: read it whole
                raise StreamFallback(f"no event boundary in {len(rest):,} bytes")
        state["tail"], events, raw = decode_tail(rest)
        yield events, raw

    return lambda: merge_metadata(opened.meta_head, state["tail"]), chunks()


def _cut(rest: bytes) -> tuple[tuple[list[KinetoEvent], Callable[[], list[Event]]] | None, bytes]:
    """(the decoded events before the last event boundary, the bytes from that boundary on)."""
    pos = len(rest)
    for _ in range(_MAX_CUT_TRIES):
        j = rest.rfind(b"{", 0, pos)
        if j <= 0:
            return None, rest
        pos = j
        k = _skip_space_back(rest, j - 1)
        if k < 0 or rest[k] != _COMMA:
            continue
        k = _skip_space_back(rest, k - 1)
        if k < 0 or rest[k] != _CLOSE:
            continue
        array = b"".join((b"[", memoryview(rest)[:k + 1], b"]"))      # one copy, no slices
        try:
            events = _EVENTS.decode(array)
        except msgspec.DecodeError:          # the cut fell inside a string: try an earlier one
            continue
        except msgspec.ValidationError as exc:
            raise StreamFallback(str(exc)) from None
        return (events, lambda array=array: _RAW_EVENTS.decode(array)), rest[j:]
    raise StreamFallback("no event boundary found")


_COMMA, _CLOSE = ord(","), ord("}")
_SPACE = frozenset(b" \t\r\n")


def _skip_space_back(data: bytes, k: int) -> int:
    while k >= 0 and data[k] in _SPACE:
        k -= 1
    return k


def _tail_array(rest: bytes) -> bytes:
    """The last chunk's events as a JSON array, for the raw re-decode (metadata keys dropped)."""
    doc = msgspec.json.decode(b'{"traceEvents":[' + rest, type=dict[str, msgspec.Raw])
    return bytes(doc["traceEvents"])


def _blocks(path: str, gz: bool) -> Iterator[bytes]:
    cap, total = max_trace_bytes(), 0
    opener = gzip.open if gz else open
    try:
        with opener(path, "rb") as f:
            while True:
                block = f.read(CHUNK_BYTES)
                if not block:
                    return
                total += len(block)
                if total > cap:
                    raise StreamFallback("over the size limit")
                if not block.isascii():
                    try:
                        block.decode("utf-8")
                    except UnicodeDecodeError as exc:   # a character cut at the block's end is fine
                        if exc.reason != "unexpected end of data" or exc.start < len(block) - 3:
                            raise StreamFallback("not UTF-8") from None
                yield block
    except (OSError, EOFError, zlib.error) as exc:
        raise StreamFallback(str(exc)) from None
