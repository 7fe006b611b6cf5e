"""Reading one large Kineto file on several cores: pieces of its event array decoded and turned into
columns in worker processes side by side, then assembled in file order.

Contract: ``read_parallel(path, strings, max_events)`` returns ``(metadata, SourceColumns)`` — the
same as :func:`~cuvil_pgc.trace._chunks.build_kineto_chunks` over ``_stream`` gives — or None when the
file is not one to read this way; it raises StreamFallback when the file needs the sequential
reader after all (which then reports any problem exactly as it would have).

How: the parent reads only the head (the metadata before the array) and, near every
:func:`piece_bytes` step, a small window to find an event boundary (``}`` ``,`` ``{``). Each worker
reads its byte range of the file and decodes it as a JSON array: a boundary look-alike inside a
string or a nested object makes that decode fail (an unterminated string, an unclosed bracket), so
pieces that all decode were cut at true boundaries; any failure falls back. Workers intern strings
into their own table; the parent maps them to the file's (``ChunkPart.reintern``).

When: plain (not gzip) files the streaming reader would read, on Linux (workers are forked, so
they start in milliseconds with everything imported), from a process with no other thread (a fork
copies only the calling thread, and locks other threads hold would stay held in the child; a
progress display's refresh thread is stopped for the fork, ``_pool.paused_for_fork``), with at
least two usable cores or ``CUVIL_READ_WORKERS`` >= 2 (0 or 1 turns it off), and not inside a
worker of ``_pool`` (``analyze --engine local`` already keeps every core busy with one trace each).
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import sys
from collections.abc import Iterator
from multiprocessing.connection import Connection

from cuvil_pgc._pool import in_pool_worker, paused_for_fork, usable_cores
from cuvil_pgc.errors import ConfigError
from cuvil_pgc.trace import _stream
from cuvil_pgc.trace._build import SourceColumns
from cuvil_pgc.trace._chunks import ChunkPart, StreamFallback, assemble_chunks, chunk_part
from cuvil_pgc.trace._decode import KinetoDocument
from cuvil_pgc.trace._input import max_trace_bytes
from cuvil_pgc.trace.columns import StringTable

ENV_READ_WORKERS = "CUVIL_READ_WORKERS"
MAX_WORKERS = 8
#: Bytes read after a piece's target offset to find the next event boundary (then a larger window).
_WINDOW = 1 << 16
_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


def read_workers() -> int:
    """Worker processes for one large file: ``CUVIL_READ_WORKERS``, else the usable cores (at most 8)."""
    text = os.environ.get(ENV_READ_WORKERS)
    if text:
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"environment variable {ENV_READ_WORKERS}={text!r} is not an integer",
                              fix="set it to the number of processes reading one large trace (0: one)") from None
        return max(value, 0)
    return min(usable_cores(), MAX_WORKERS)


def reads_in_parallel_here() -> bool:
    """Whether this process reads large plain traces with forked workers (module docstring's "When";
    threads of ours that can pause for the fork, a progress display's, do not count)."""
    return (read_workers() >= 2 and sys.platform == "linux" and not in_pool_worker()
            and "fork" in multiprocessing.get_all_start_methods())


def read_parallel(path: str, strings: StringTable, max_events: int) -> tuple[KinetoDocument, SourceColumns] | None:
    """See module docstring."""
    if not reads_in_parallel_here() or _gzipped(path):
        return None
    workers = read_workers()
    opened = _stream.open_stream(path)
    if opened is None or opened.size > max_trace_bytes():
        return None
    ranges = piece_ranges(path, opened.array_start, opened.size, piece_bytes(opened.size, workers))
    if len(ranges) < 2:
        return None
    tail: list[KinetoDocument] = []
    with paused_for_fork() as safe:
        if not safe:
            return None
        try:
            pool = _Workers(min(workers, len(ranges)))
        except OSError:                     # no process to be had (limits): read it in this one
            return None
    with pool:
        def parts() -> Iterator[ChunkPart]:
            seen = 0
            for part, doc, count in pool.map(path, ranges):
                seen += count
                if seen > max_events:
                    raise StreamFallback("over the event limit")     # the whole-file path says so
                if doc is not None:
                    tail.append(doc)
                yield part

        cols = assemble_chunks(parts(), strings, path)
    return _stream.merge_metadata(opened.meta_head, tail[0] if tail else None), cols


class _Workers:
    """Forked processes reading pieces, each over its own pipe. Results are received and unpickled
    by this (the main) thread: unpickled in a helper thread, as ``ProcessPoolExecutor`` does, their
    arrays land in that thread's malloc arena, which measured +190 MB of peak RSS at 3M events."""

    def __init__(self, n: int) -> None:
        ctx = multiprocessing.get_context("fork")
        self.conns: list[Connection] = []
        self.procs: list[multiprocessing.process.BaseProcess] = []
        for _ in range(n):
            mine, theirs = ctx.Pipe()
            proc = ctx.Process(target=_serve, args=(theirs,), daemon=True)
            proc.start()
            theirs.close()
            self.conns.append(mine)
            self.procs.append(proc)

    def map(self, path: str, ranges: list[tuple[int, int, bool]]) -> Iterator[tuple[ChunkPart, KinetoDocument | None, int]]:
        """Each piece's result in file order; piece i goes to worker i mod n, at most two ahead each."""
        n = len(self.conns)
        for i, piece in enumerate(ranges[:2 * n]):
            _send(self.conns[i % n], (path, *piece))
        for i in range(len(ranges)):
            conn = self.conns[i % n]
            try:
                ok, result = conn.recv()
            except (EOFError, OSError) as exc:
                raise StreamFallback(f"a reading worker died ({exc!r})") from None
            if not ok:
                raise StreamFallback(result)
            if i + 2 * n < len(ranges):
                _send(conn, (path, *ranges[i + 2 * n]))
            yield result

    def __enter__(self) -> _Workers:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *rest: object) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
            conn.close()
        for proc in self.procs:
            if exc_type is None:         # done: each worker is waiting for its next task
                proc.join(timeout=5)
            if proc.is_alive():          # stopped early: a worker may be blocked sending a result
                proc.kill()
            proc.join()


def _send(conn: Connection, task: tuple) -> None:
    try:
        conn.send(task)
    except OSError as exc:                  # the worker is gone (BrokenPipeError)
        raise StreamFallback(f"a reading worker died ({exc!r})") from None


def _serve(conn: Connection) -> None:
    """A worker's loop: read pieces until told to stop; any failure is reported, never raised.
    Ctrl-C is the parent's to handle (it stops the workers)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while True:
        try:
            task = conn.recv()
        except (EOFError, OSError):
            return
        if task is None:
            return
        try:
            reply = (True, _read_piece(*task))
        except StreamFallback as exc:
            reply = (False, str(exc))
        except Exception as exc:       # the parent falls back to the sequential reader, which reports
            reply = (False, f"{type(exc).__name__}: {exc}")
        try:
            conn.send(reply)
        except (OSError, ValueError):
            return


def _gzipped(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(2) == b"\x1f\x8b"
    except OSError:
        return True               # the sequential reader reports it


def piece_bytes(size: int, workers: int) -> int:
    """Bytes per piece: every worker gets one at least, none more than ``_stream.CHUNK_BYTES``
    (a piece's bytes and events are a worker's memory)."""
    return max(1, min(_stream.CHUNK_BYTES, -(-size // workers)))


def piece_ranges(path: str, start: int, size: int, step: int) -> list[tuple[int, int, bool]]:
    """``(first byte, end byte, last)`` of each piece: cut at the first event boundary after every
    ``step`` bytes (a piece ends after the ``}``, the next starts at the ``{``); the last runs to the
    end of the file (``end`` -1)."""
    out: list[tuple[int, int, bool]] = []
    with open(path, "rb") as f:
        target = start + step
        while target < size:
            cut = _boundary_after(f, target, size)
            if cut is None:
                break
            end, following = cut
            out.append((start, end, False))
            start, target = following, following + step
    out.append((start, -1, True))
    return out


def _boundary_after(f, target: int, size: int) -> tuple[int, int] | None:
    """(the end of the event before the first boundary at or after ``target``, the next event's start)."""
    window = _WINDOW
    while target < size:
        f.seek(target)
        data = f.read(window)
        m = _BOUNDARY.search(data)
        if m:
            return target + m.start() + 1, target + m.end() - 1
        if len(data) < window:
            return None
        target += window - 16          # a boundary split by the window's end is found next time
        window *= 2
    return None


def _read_piece(path: str, start: int, end: int, last: bool) -> tuple[ChunkPart, KinetoDocument | None, int]:
    """In a worker: one piece's events as a ChunkPart in its own string table; the keys after the
    array for the last piece; the number of events."""
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read() if end < 0 else f.read(end - start)
    if not data.isascii():
        try:
            data.decode("utf-8")
        except UnicodeDecodeError:
            raise StreamFallback("not UTF-8") from None
    doc = None
    if last:
        doc, events, raw = _stream.decode_tail(data)
    else:
        events, raw = _stream.decode_events(data)
    del data
    strings = StringTable()
    part = chunk_part(events, raw, strings)
    part.strings = strings.strings
    return part, doc, len(events)
