"""Streaming, crash-safe trace writer.

While a session records, events go to ``<path>.partial`` one JSON value per line, each line
ending in a comma, flushed to the OS at every flush interval: after a SIGKILL the reader
recovers every complete line. ``close()`` appends the tail (final metadata), fsyncs and renames
the partial onto ``path`` in one ``os.replace``, so ``path`` is either absent, the previous file,
or the complete new trace. ``.gz`` paths are written as gzip with a sync flush per interval, which
keeps the partial file decodable up to the last flush.
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


class TraceWriter:
    """Appends events to ``<path>.partial`` and finishes ``path`` atomically."""

    def __init__(self, path: str | os.PathLike[str], header: dict[str, Any]) -> None:
        self.path = os.fspath(path)
        self.partial_path = self.path + PARTIAL_SUFFIX
        self.events_written = 0
        if os.path.exists(self.partial_path):
            raise SessionError(
                f"{self.partial_path} already exists: another session is writing it, or one crashed",
                path=self.path,
                fix=f"recover it with `cuvil-pgc summary {self.partial_path}`, then move or delete it",
            )
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise SessionError(f"directory {parent} does not exist", path=self.path,
                               fix="create it or choose another output path")
        self._raw = open(create_private(self.partial_path), "wb")  # noqa: SIM115 - closed in close(); 0600 by default
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", compresslevel=5) \
            if self.path.endswith(".gz") else None
        self._out = self._gz or self._raw
        session_event = {"ph": "M", "name": META_SESSION_EVENT, "pid": header.get("pid", 0), "tid": 0,
                         "args": header}
        self._out.write(_HEAD + dumps(session_event) + b",\n")
        self.flush()

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
        """Make everything written so far survive a crash of this process."""
        if self._gz is not None:
            self._gz.flush(zlib.Z_SYNC_FLUSH)
        self._raw.flush()

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
        try:
            if self._gz is not None:
                self._gz.flush(zlib.Z_SYNC_FLUSH)
            self._raw.close()
        except OSError:
            pass
