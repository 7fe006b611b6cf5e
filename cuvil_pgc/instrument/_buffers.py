"""Per-thread region buffers between the user's threads and the trace writer.

Each recording thread appends its ended region frames to its own list; the writer thread takes what a
list holds and deletes that prefix. Under the GIL an append and a prefix deletion are each atomic,
so nothing is lost between the two sides and the user's thread never takes a lock. A full buffer
drops the event and counts it. The C regions (``_fastregion.c``) append to the same lists: they
call ``_register`` once per thread and per recorder (told apart by ``serial``).
"""

from __future__ import annotations

import itertools
import threading


class ThreadBuffer:
    __slots__ = ("events", "dropped", "tid", "thread_name")

    def __init__(self, tid: int, thread_name: str) -> None:
        self.events: list = []
        self.dropped = 0
        self.tid = tid
        self.thread_name = thread_name


_serials = itertools.count(1)


class RegionRecorder:
    """The session's region sink: per-thread bounded buffers (see region.Recorder)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.serial = next(_serials)
        self.buffers: list[ThreadBuffer] = []
        self._tls = threading.local()
        self._lock = threading.Lock()

    def record(self, frame: list, end_ns: int) -> None:
        try:
            buf = self._tls.buf
        except AttributeError:
            buf = self._register()
        events = buf.events
        if len(events) < self.capacity:
            events.append(frame)
        else:
            buf.dropped += 1

    def _register(self) -> ThreadBuffer:
        thread = threading.current_thread()
        buf = ThreadBuffer(threading.get_native_id(), thread.name)
        with self._lock:
            self.buffers.append(buf)
        self._tls.buf = buf
        return buf

    def drain(self, limit: int | None = None) -> list[tuple[ThreadBuffer, list]]:
        """Pop what each buffer holds now (at most ``limit`` per buffer). Writer thread only."""
        with self._lock:
            buffers = list(self.buffers)
        out = []
        for buf in buffers:
            events = buf.events
            n = len(events) if limit is None else min(limit, len(events))
            if n:
                taken = events[:n]
                del events[:n]
                out.append((buf, taken))
        return out

    def dropped(self) -> int:
        with self._lock:
            return sum(b.dropped for b in self.buffers)
