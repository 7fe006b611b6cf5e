"""Per-thread region buffers between the user's threads and the trace writer.

Each recording thread appends ``(frame, end_ns)`` to its own deque; the writer thread pops from
the left. ``deque.append`` and ``deque.popleft`` are atomic, so nothing is lost between the two
sides and the user's thread never takes a lock. A full buffer drops the event and counts it.
"""

from __future__ import annotations

import threading
from collections import deque


class ThreadBuffer:
    __slots__ = ("events", "dropped", "tid", "thread_name")

    def __init__(self, tid: int, thread_name: str) -> None:
        self.events: deque = deque()
        self.dropped = 0
        self.tid = tid
        self.thread_name = thread_name


class RegionRecorder:
    """The session's region sink: per-thread bounded buffers (see region.Recorder)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
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
            events.append((frame, end_ns))
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
            n = len(buf.events) if limit is None else min(limit, len(buf.events))
            if n:
                pop = buf.events.popleft
                out.append((buf, [pop() for _ in range(n)]))
        return out

    def dropped(self) -> int:
        with self._lock:
            return sum(b.dropped for b in self.buffers)
