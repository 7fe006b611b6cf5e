"""Getting a trace file's bytes: path resolution, size limits, gzip, UTF-8.

Contract:
- ``resolve(path)`` returns the file to read: ``path`` itself, or ``path + ".partial"`` when only
  the partial file of a crashed session exists. Missing files and directories raise TraceError.
- ``read_bytes(path, partial)`` returns the decoded-ready bytes. Gzip is recognised by its magic
  bytes, not the extension, and decompressed chunk by chunk into one growing buffer (no second
  copy) with a cap checked after every chunk: the size a gzip header or trailer claims is never
  trusted or preallocated, so a gzip bomb is refused when it passes the cap, long before memory
  runs out. A partial ``.gz`` (sync-flushed, no trailer) is read up to the last decodable byte; a
  corrupt or truncated finished ``.gz`` raises TraceError.
- The cap (:func:`max_trace_bytes`) is ``CUVIL_MAX_TRACE_BYTES`` when set, else what the loader can
  hold: a quarter of the memory available when the file is opened (psutil, and the cgroup limit
  where one is set), since decoding a trace takes about three times its size (measured: a 35 MB
  Kineto trace peaks at 2.8x). Plain files larger than the cap are refused before reading.
- Bytes must be UTF-8 (a leading BOM is dropped); the first invalid byte is reported by offset.
"""

from __future__ import annotations

import codecs
import io
import os
import re
import zlib
from dataclasses import dataclass, field

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace.other_formats import HEAD_BYTES, not_a_trace
from cuvil_pgc.trace.schema import PARTIAL_SUFFIX

ENV_MAX_TRACE_BYTES = "CUVIL_MAX_TRACE_BYTES"
#: Decoding a trace takes about this many times its decompressed size in memory (measured 2.8x).
MEMORY_PER_BYTE = 4
#: The cap never goes below this, however little memory is free (small traces still load).
MIN_TRACE_BYTES = 64 << 20
_CHUNK = 4 << 20
_GZIP_MAGIC = b"\x1f\x8b"
_NOT_SPACE = re.compile(rb"\S")


@dataclass
class RawInput:
    """The bytes of one trace file, ready for JSON decoding."""

    path: str                 # the file actually read
    data: bytes
    partial: bool             # a `.partial` file of an unfinished session
    notes: list[str] = field(default_factory=list)


def max_trace_bytes() -> int:
    """The decompressed size cap: ``CUVIL_MAX_TRACE_BYTES`` when set, else memory available / 4."""
    text = os.environ.get(ENV_MAX_TRACE_BYTES)
    if not text:
        return max(MIN_TRACE_BYTES, available_memory() // MEMORY_PER_BYTE)
    try:
        value = int(text)
    except ValueError:
        raise TraceError(f"environment variable {ENV_MAX_TRACE_BYTES}={text!r} is not an integer",
                         fix="set it to a byte count such as 17179869184") from None
    if value <= 0:
        raise TraceError(f"environment variable {ENV_MAX_TRACE_BYTES}={value} must be positive")
    return value


def available_memory() -> int:
    """Bytes this process can still allocate: the system's available memory, less under a cgroup limit."""
    import psutil

    room = psutil.virtual_memory().available
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            limit = f.read().strip()
        if limit != "max":
            with open("/sys/fs/cgroup/memory.current", encoding="ascii") as f:
                room = min(room, int(limit) - int(f.read().strip()))
    except (OSError, ValueError):
        pass
    return max(room, 0)


def resolve(path: str) -> tuple[str, bool]:
    """The file to read for ``path`` and whether it is a partial file."""
    if path.endswith(PARTIAL_SUFFIX):
        _check_file(path)
        return path, True
    if os.path.exists(path):
        _check_file(path)
        return path, False
    partial = path + PARTIAL_SUFFIX
    if os.path.isfile(partial):
        return partial, True
    raise TraceError("no such file (and no partial file of an unfinished session next to it)", path=path,
                     fix="check the path; traces are written where profile(path) was told")


def _check_file(path: str) -> None:
    if os.path.isdir(path):
        raise TraceError("is a directory, not a trace file", path=path,
                         fix="pass the .trace.json or .trace.json.gz file inside it")
    if not os.path.exists(path):
        raise TraceError("no such file", path=path)
    if not os.path.isfile(path):
        raise TraceError("is not a regular file", path=path)


def read_bytes(path: str, partial: bool) -> RawInput:
    """Read, decompress and UTF-8-check one trace file (see module docstring)."""
    cap = max_trace_bytes()
    try:
        with open(path, "rb") as f:
            first = f.read(HEAD_BYTES)
            f.seek(0)
            other = not_a_trace(path, first)
            if other is not None:
                raise other
            head = first[:2]
            if head == _GZIP_MAGIC:
                raw = RawInput(path, b"", partial)
                raw.data = _gunzip(f, path, cap, partial, raw.notes)
            else:
                if os.fstat(f.fileno()).st_size > cap:
                    raise _too_big(path, cap, "")
                raw = RawInput(path, f.read(), partial)
    except OSError as exc:
        raise TraceError(f"cannot be read: {exc.strerror or exc}", path=path) from None
    if not _NOT_SPACE.search(raw.data):
        what = "decompresses to nothing" if head == _GZIP_MAGIC else "is empty"
        raise TraceError(f"{what}: no trace events", path=path,
                         fix="the session that wrote it may have been killed before its first flush")
    if raw.data.startswith(codecs.BOM_UTF8):
        raw.data = raw.data[len(codecs.BOM_UTF8):]
    _check_utf8(raw.data, path)
    return raw


def _too_big(path: str, cap: int, what: str) -> TraceError:
    why = "" if os.environ.get(ENV_MAX_TRACE_BYTES) else \
        f" here (a 1/{MEMORY_PER_BYTE} share of the memory available: decoding needs ~3x the size)"
    return TraceError(f"{what}holds more than {cap:,} bytes, the limit for one trace{why}", path=path,
                      fix=f"free memory, or set {ENV_MAX_TRACE_BYTES} to a larger byte count if this machine "
                          "has the memory")


def _gunzip(f, path: str, cap: int, partial: bool, notes: list[str]) -> bytes:
    """Decompress all gzip members with a size cap; tolerate a cut-off stream only for partials."""
    out = io.BytesIO()          # one growing buffer; getvalue() hands it over without a copy
    dec = zlib.decompressobj(16 + zlib.MAX_WBITS)
    while True:
        chunk = dec.unconsumed_tail or f.read(_CHUNK)
        saved = dec.copy() if partial else None
        try:
            piece = dec.decompress(chunk, _CHUNK) if chunk else dec.flush()
        except zlib.error as exc:
            if saved is not None:
                out.write(_up_to_damage(saved, chunk, cap - out.tell(), path, cap))
            return _gzip_damage(path, partial, notes, out, f"corrupt gzip data ({exc})")
        if out.tell() + len(piece) > cap:
            raise _too_big(path, cap, "decompressed, it ")
        out.write(piece)
        if not chunk and not dec.eof:
            break
        if dec.eof:
            rest = dec.unused_data
            if not rest.lstrip(b"\0"):
                rest = f.read(_CHUNK)
                if not rest.lstrip(b"\0"):
                    return out.getvalue()
            if not rest.startswith(_GZIP_MAGIC):
                return _gzip_damage(path, partial, notes, out, "unexpected bytes after the gzip stream")
            dec = zlib.decompressobj(16 + zlib.MAX_WBITS)
            f.seek(f.tell() - len(rest))
    if not dec.eof:
        return _gzip_damage(path, partial, notes, out, "the gzip stream ends early (no trailer)")
    return out.getvalue()


def _up_to_damage(dec, chunk: bytes, room: int, path: str, cap: int, step: int = 512) -> bytes:
    """What ``chunk`` decompresses to before the byte where it is damaged (partial files only)."""
    good: list[bytes] = []
    size = 0
    for start in range(0, len(chunk), step):
        try:
            piece = dec.decompress(chunk[start:start + step])
        except zlib.error:
            break
        size += len(piece)
        if size > room:
            raise _too_big(path, cap, "decompressed, it ")
        good.append(piece)
    return b"".join(good)


def _gzip_damage(path: str, partial: bool, notes: list[str], out: io.BytesIO, problem: str) -> bytes:
    if partial:
        notes.append(f"{problem}; read the {out.tell():,} bytes before it")
        return out.getvalue()
    raise TraceError(f"{problem}: the file looks truncated or damaged", path=path,
                     fix="a finished trace is written atomically, so this file was cut or altered after "
                         "writing; recover from its .partial file if the session crashed, or re-record")


def _check_utf8(data: bytes, path: str) -> None:
    if data.isascii():
        return
    start = 0
    while start < len(data):
        end = min(start + _CHUNK, len(data))
        while end < len(data) and end > start and data[end] & 0xC0 == 0x80:
            end -= 1        # never split a multi-byte character between chunks
        try:
            data[start:end].decode("utf-8")
        except UnicodeDecodeError as exc:
            offset = start + exc.start
            raise TraceError(f"is not UTF-8 text: invalid byte 0x{data[offset]:02x} at byte {offset:,}",
                             path=path, fix="trace files are UTF-8 JSON; re-export it or check for corruption") \
                from None
        start = end
