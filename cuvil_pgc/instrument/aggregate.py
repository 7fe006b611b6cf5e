"""Always-on aggregates: regions folded into per-path latency histograms instead of events.

For servers that run for weeks: memory stays bounded (at most ``max_paths`` paths per thread,
each a fixed log-bucketed histogram), nothing is written per call, and the summary file is
rewritten atomically every ``flush_s`` seconds. ``analyze``, ``report`` and ``diff`` read a
summary like a trace (no timeline; calls, totals, means and percentiles per path).

Histogram: bucket ``b = 8*e + s`` holds durations in ``[2**e * (1 + s/8), 2**e * (1 + (s+1)/8))``
ns — 8 linear buckets per octave, so a percentile read at a bucket's midpoint is within 6.25% of
the true value. Histograms of the
same scheme merge by adding counts, across threads, processes and ranks (:func:`merge_summaries`).

Summary file (JSON): ``{"cuvil_summary": {"schema_version", "bucket_scheme": {"per_octave": 8,
"unit": "ns"}, "metadata": {...like a trace's cuvil object...}, "regions": [{"path", "count",
"sum_ns", "min_ns", "max_ns", "buckets": [[b, count], ...]}]}}``.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import threading
import time
from typing import Any

from cuvil_pgc.instrument import region as _region
from cuvil_pgc.instrument.region import frame_path

log = logging.getLogger("cuvil_pgc")

PER_OCTAVE = 8
SUMMARY_KEY = "cuvil_summary"
SUMMARY_SCHEMA_VERSION = 1
_frexp = math.frexp


def bucket_of(ns: int) -> int:
    """Histogram bucket of a duration in ns (0 for durations under 1 ns)."""
    if ns <= 1:
        return 0
    mantissa, exponent = _frexp(ns)          # ns = m * 2**e with 0.5 <= m < 1
    return (exponent - 1) * PER_OCTAVE + int((mantissa * 2.0 - 1.0) * PER_OCTAVE)


def bucket_bounds(b: int) -> tuple[float, float]:
    """[low, high) of bucket b in ns."""
    octave, sub = divmod(b, PER_OCTAVE)
    base = 2.0 ** octave
    return base * (1 + sub / PER_OCTAVE), base * (1 + (sub + 1) / PER_OCTAVE)


class PathStats:
    __slots__ = ("count", "sum_ns", "min_ns", "max_ns", "buckets")

    def __init__(self) -> None:
        self.count = 0
        self.sum_ns = 0
        self.min_ns = 1 << 62
        self.max_ns = 0
        self.buckets: dict[int, int] = {}

    def add(self, ns: int) -> None:
        self.count += 1
        self.sum_ns += ns
        if ns < self.min_ns:
            self.min_ns = ns
        if ns > self.max_ns:
            self.max_ns = ns
        b = bucket_of(ns)
        self.buckets[b] = self.buckets.get(b, 0) + 1

    def merge(self, other: PathStats) -> None:
        self.count += other.count
        self.sum_ns += other.sum_ns
        self.min_ns = min(self.min_ns, other.min_ns)
        self.max_ns = max(self.max_ns, other.max_ns)
        for b, c in list(other.buckets.items()):
            self.buckets[b] = self.buckets.get(b, 0) + c

    def to_json(self, path: str) -> dict[str, Any]:
        return {"path": path, "count": self.count, "sum_ns": self.sum_ns, "min_ns": self.min_ns,
                "max_ns": self.max_ns, "buckets": sorted(self.buckets.items())}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> PathStats:
        stats = cls()
        stats.count, stats.sum_ns = int(doc["count"]), int(doc["sum_ns"])
        stats.min_ns, stats.max_ns = int(doc["min_ns"]), int(doc["max_ns"])
        stats.buckets = {int(b): int(c) for b, c in doc["buckets"]}
        return stats


class AggregateRecorder:
    """A region sink (see region.Recorder) folding completed regions into per-thread histograms."""

    def __init__(self, max_paths: int = 10_000) -> None:
        self.max_paths = max_paths
        self.dropped = 0
        self._tls = threading.local()
        self._tables: list[dict[str, PathStats]] = []
        self._lock = threading.Lock()

    def record(self, frame: list, end_ns: int) -> None:
        try:
            table = self._tls.table
        except AttributeError:
            table = self._tls.table = {}
            with self._lock:
                self._tables.append(table)
        path = frame[4] or _cache_path(frame)
        stats = table.get(path)
        if stats is None:
            if len(table) >= self.max_paths:
                self.dropped += 1
                return
            stats = table[path] = PathStats()
        stats.add(end_ns - frame[2])

    def snapshot(self) -> dict[str, PathStats]:
        """All threads' histograms merged (the owning threads keep recording meanwhile)."""
        merged: dict[str, PathStats] = {}
        with self._lock:
            tables = list(self._tables)
        for table in tables:
            for path, stats in dict(table).items():
                merged.setdefault(path, PathStats()).merge(stats)
        return merged


def _cache_path(frame: list) -> str:
    path = frame_path(frame)
    frame[4] = path
    return path


def merge_summaries(docs: list[dict[str, Any]]) -> dict[str, PathStats]:
    """Merge the ``regions`` of several summary documents (threads, processes, ranks)."""
    merged: dict[str, PathStats] = {}
    for doc in docs:
        for row in doc[SUMMARY_KEY]["regions"]:
            merged.setdefault(row["path"], PathStats()).merge(PathStats.from_json(row))
    return merged


class AggregateSession:
    """Always-on aggregation into ``path`` (a ``.summary.json``), rewritten every ``flush_s``."""

    def __init__(self, path: str, flush_s: float = 10.0, max_paths: int = 10_000) -> None:
        self.path = os.fspath(path)
        self.flush_s = flush_s
        self.recorder = AggregateRecorder(max_paths)
        self.start_unix_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.flushes = 0

    def start(self) -> AggregateSession:
        _region.attach(self.recorder)
        self._thread = threading.Thread(target=self._loop, name="cuvil-pgc-aggregate", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> str:
        _region.detach(self.recorder)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
        self.flush()
        return self.path

    def __enter__(self) -> AggregateSession:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def step(self) -> None:
        """Accepted for symmetry with other sessions; aggregates need no steps."""

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_s):
            self.flush()

    def document(self) -> dict[str, Any]:
        from cuvil_pgc.instrument.session import _rank_and_world

        rank, world = _rank_and_world()
        regions = [s.to_json(p) for p, s in sorted(self.recorder.snapshot().items())]
        meta = {"host": socket.gethostname(), "pid": os.getpid(), "rank": rank, "world_size": world,
                "python": sys.version.split()[0], "torch": getattr(sys.modules.get("torch"), "__version__", None),
                "start_unix_ns": self.start_unix_ns, "end_unix_ns": time.time_ns(), "command": list(sys.argv),
                "dropped": {"aggregate_paths": self.recorder.dropped}}
        return {SUMMARY_KEY: {"schema_version": SUMMARY_SCHEMA_VERSION,
                              "bucket_scheme": {"per_octave": PER_OCTAVE, "unit": "ns"},
                              "metadata": meta, "regions": regions}}

    def flush(self) -> None:
        """Rewrite the summary file atomically. Never raises into the host program."""
        try:
            from pathlib import Path

            from cuvil_pgc._fsutil import write_atomic
            from cuvil_pgc.trace.writer import dumps

            write_atomic(Path(self.path), dumps(self.document()))
            self.flushes += 1
        except Exception as exc:
            log.warning("cuvil-pgc: writing the aggregate summary %s failed: %s", self.path, exc)
