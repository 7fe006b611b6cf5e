"""Streaming, crash-safe trace writer.

While a session records, events go to ``<path>.partial`` one JSON value per line, each line
ending in a comma, flushed to the OS at every flush interval: after a SIGKILL the reader
recovers every complete line. ``close()`` appends the tail (final metadata), fsyncs and renames
the partial onto ``path`` in one ``os.replace``, so ``path`` is either absent, the previous file,
or the complete new trace. ``.gz`` paths are written as gzip with a sync flush per interval, which
keeps the partial file decodable up to the last flush.

A partial already at ``<path>.partial`` is moved aside when its writer is gone and refused with
:class:`PartialInUse` when one is writing it (trace._leftover). The file is unbuffered (each
batch is one write), so a forked child holds no bytes of its parent's trace; :meth:`disown`
makes sure it never writes or finishes it either. A writer that cannot start (no space, no
permission) removes the partial it created: nothing is left to block the next start.
"""

from __future__ import annotations

import gzip
import os
import zlib
from collections.abc import Iterable
from typing import Any

import orjson

from cuvil_pgc._fsutil import create_private, fsync_dir
from cuvil_pgc.errors import SessionError
from cuvil_pgc.trace._leftover import Leftover, make_room
from cuvil_pgc.trace.schema import META_SESSION_EVENT, PARTIAL_SUFFIX

_HEAD = b'{"traceEvents":[\n'
_OPTS = orjson.OPT_SERIALIZE_NUMPY


def dumps(obj: Any) -> bytes:
    """Serialise one JSON value; strings that are not valid UTF-8 are replaced, never raised."""
    try:
        return orjson.dumps(obj, option=_OPTS, default=_fallback)
    except TypeError:
        return orjson.dumps(_sanitize(obj), option=_OPTS, default=_fallback)


def _fallback(value: Any) -> Any:
    return repr(value)


def _sanitize(obj: Any) -> Any:
    if isinstance(obj, str):
        return obj.encode("utf-8", "replace").decode("utf-8")
    if isinstance(obj, dict):
        return {_sanitize(str(k)): _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_sanitize(v) for v in obj]
    return obj


class PartialInUse(SessionError):
    """Another live process is writing ``<path>.partial``."""

    def __init__(self, leftover: Leftover, path: str) -> None:
        super().__init__(f"{leftover.partial} is being written: {leftover.reason}", path=path,
                         fix="give each process its own output path")
        self.leftover = leftover


class TraceWriter:
    """Appends events to ``<path>.partial`` and finishes ``path`` atomically.

    ``leftover`` says what was found at the partial path and moved aside (None: nothing)."""

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = os.fspath(path)
        self.partial_path = self.path + PARTIAL_SUFFIX
        self.events_written = 0
        self._disowned = False
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise SessionError(f"directory {parent} does not exist", path=self.path,
                               fix="create it or choose another output path")
        self.leftover = make_room(self.partial_path)
        if self.leftover is not None and self.leftover.live:
            raise PartialInUse(self.leftover, self.path)
        self._raw = _PartialFile(self.partial_path)
        try:
            self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=5) \
                if self.path.endswith(".gz") else None
            self._out = self._gz or self._raw
            session_event = {"ph": "M", "name": META_SESSION_EVENT, "pid": header.get("pid", 0), "tid": 0,
                             "args": header}
            self._out.write(_HEAD + dumps(session_event) + b",\n")
            self.flush()
        except BaseException:
            self._raw.close()
            os.unlink(self.partial_path)      # holds nothing yet; it must not block the next start
            raise

    def write_events(self, events: Iterable[dict[str, Any]]) -> int:
        """Append events (already in trace clock); returns how many were written."""
        chunk = [dumps(ev) + b",\n" for ev in events]
        if chunk:
            self._out.write(b"".join(chunk))
            self.events_written += len(chunk)
        return len(chunk)

    def write_raw(self, data: bytes, count: int) -> None:
        """Append pre-serialised event lines (each ending in ``,\\n``)."""
        self._out.write(data)
        self.events_written += count

    def flush(self) -> None:
        """Make everything written so far survive a crash of this process, and touch the file:
        its modification time is the heartbeat that tells a live writer from a dead one."""
        if self._disowned:
            return
        if self._gz is not None:
            self._gz.flush(zlib.Z_SYNC_FLUSH)
        self._raw.flush()
        os.utime(self._raw.fileno())

    def disown(self) -> None:
        """In a forked child: never write to, finish or remove the parent's partial file."""
        self._disowned = True
        if self._gz is not None:
            self._gz.fileobj = None           # closing the GzipFile must not write a gzip trailer
        self._out = _Refuse()
        self._raw.close()                     # the child's copy of the descriptor only

    def close(self, last_events: list[dict[str, Any]], metadata: dict[str, Any]) -> str:
        """Write the tail, fsync, and atomically replace ``path``. Returns ``path``."""
        if not last_events:
            raise ValueError("close() needs at least one final event (process name)")
        body = b",\n".join(dumps(ev) for ev in last_events)
        tail = b'\n],\n"cuvil":' + dumps(metadata) + b',\n"displayTimeUnit":"ms"}\n'
        self._out.write(body + tail)
        self.events_written += len(last_events)
        if self._gz is not None:
            self._gz.close()
        self._raw.flush()
        os.fsync(self._raw.fileno())
        self._raw.close()
        os.replace(self.partial_path, self.path)
        fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        return self.path

    def abandon(self) -> None:
        """Close without finishing: the partial file stays for recovery."""
        if self._disowned:
            return
        try:
            if self._gz is not None:
                self._gz.flush(zlib.Z_SYNC_FLUSH)
            self._raw.close()
        except OSError:
            pass


class _PartialFile:
    """The partial file, unbuffered: each write reaches the OS whole, so no process (a forked
    child included) ever holds bytes of it that a later flush or finalizer could write."""

    def __init__(self, path: str) -> None:
        self._fd = create_private(path)      # never through a symlink; 0600 unless CUVIL_PGC_TRACE_MODE

    def write(self, data: bytes) -> int:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]
        return len(data)

    def flush(self) -> None:
        """Nothing is buffered here."""

    def fileno(self) -> int:
        return self._fd

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


class _Refuse:
    """What a disowned writer writes into: nothing (a forked child's session must not write)."""

    def write(self, data: bytes) -> int:
        raise OSError("this trace belongs to the parent process (the session was forked)")
