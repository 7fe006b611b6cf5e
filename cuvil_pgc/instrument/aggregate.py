"""Always-on aggregates: regions folded into per-path latency histograms instead of events.

For servers that run for weeks: memory stays bounded (at most ``max_paths`` paths per thread,
each a fixed log-bucketed histogram, and bounded per-thread buffers of ended regions that are
folded off the user's threads), nothing is written per call, and the summary file is
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

from cuvil_pgc._version import __version__
from cuvil_pgc.instrument import region as _region
from cuvil_pgc.instrument._buffers import RegionRecorder
from cuvil_pgc.instrument.region import frame_path

log = logging.getLogger("cuvil_pgc")

PER_OCTAVE = 8
SUMMARY_KEY = "cuvil_summary"
SUMMARY_SCHEMA_VERSION = 1
FOLD_INTERVAL_S = 0.1   # buffers are checked this often: 2**18 slots per thread take 2.6M regions/s
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

    def add_many(self, count: int, sum_ns: int, min_ns: int, max_ns: int) -> None:
        """Fold in ``count`` durations with that sum, minimum and maximum (buckets apart)."""
        self.count += count
        self.sum_ns += sum_ns
        self.min_ns = min(self.min_ns, min_ns)
        self.max_ns = max(self.max_ns, max_ns)

    def merge(self, other: PathStats) -> None:
        self.add_many(other.count, other.sum_ns, other.min_ns, other.max_ns)
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


class AggregateRecorder(RegionRecorder):
    """A region sink folding completed regions into per-thread, per-path histograms.

    Regions are appended to per-thread buffers exactly as for a trace (in C where the accelerator
    is built), and :meth:`fold` — called by the aggregate thread when a buffer is a quarter full
    (checked every ``FOLD_INTERVAL_S``) and before every snapshot — turns a batch into histogram
    counts with numpy, off the user's threads. At most ``max_paths`` paths per thread; further
    paths are dropped and counted (``dropped_paths``), as are regions that found a buffer full
    (``dropped()``).
    """

    def __init__(self, max_paths: int = 10_000, capacity: int = 1 << 18) -> None:
        super().__init__(capacity)
        self.max_paths = max_paths
        self.dropped_paths = 0
        self._tables: dict[int, _ThreadTable] = {}      # id(ThreadBuffer) -> its table
        self._fold_lock = threading.Lock()

    def fullest(self) -> int:
        """Events waiting in the fullest thread buffer."""
        with self._lock:
            return max((len(b.events) for b in self.buffers), default=0)

    def fold(self) -> None:
        """Fold what the buffers hold into the histograms (any thread; one fold at a time)."""
        with self._fold_lock:
            for buf, frames in self.drain():
                table = self._tables.get(id(buf))
                if table is None:
                    table = self._tables[id(buf)] = _ThreadTable()
                self.dropped_paths += table.add(frames, self.max_paths)

    def snapshot(self) -> dict[str, PathStats]:
        """All threads' histograms merged (the owning threads keep recording meanwhile)."""
        self.fold()
        merged: dict[str, PathStats] = {}
        with self._fold_lock:
            for table in self._tables.values():
                for path, stats in zip(table.index, table.stats, strict=True):
                    merged.setdefault(path, PathStats()).merge(stats)
        return merged


class _ThreadTable:
    """One thread's histograms: ``index`` numbers its paths (path -> i), ``stats[i]`` holds them."""

    def __init__(self) -> None:
        self.index: dict[str, int] = {}
        self.stats: list[PathStats] = []

    def add(self, frames: list, max_paths: int) -> int:
        """Fold ended frames in; returns how many were dropped for want of a path slot."""
        import numpy as np

        idx_bytes, dur_bytes = _fold_index(frames, self.index, max_paths)
        idx, dur = np.frombuffer(idx_bytes, np.int64), np.frombuffer(dur_bytes, np.int64)
        self.stats += [PathStats() for _ in range(len(self.index) - len(self.stats))]
        keep = idx >= 0
        dropped = int(len(keep) - keep.sum())
        if dropped:
            idx, dur = idx[keep], dur[keep]
        if len(idx) == 0:
            return dropped
        order = np.argsort(idx, kind="stable")
        idx, dur = idx[order], dur[order]
        starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
        paths = idx[starts]
        counts = np.diff(np.r_[starts, len(idx)])
        sums = np.add.reduceat(dur, starts)
        lows, highs = np.minimum.reduceat(dur, starts), np.maximum.reduceat(dur, starts)
        for i, n, total, low, high in zip(paths.tolist(), counts.tolist(), sums.tolist(), lows.tolist(),
                                          highs.tolist(), strict=True):
            self.stats[i].add_many(n, total, low, high)
        keys, key_counts = np.unique(idx * 4096 + buckets_of(dur), return_counts=True)
        for key, n in zip(keys.tolist(), key_counts.tolist(), strict=True):
            buckets = self.stats[key >> 12].buckets
            buckets[key & 4095] = buckets.get(key & 4095, 0) + n
        return dropped


def buckets_of(ns):
    """:func:`bucket_of` of every duration in an int64 array."""
    import numpy as np

    mantissa, exponent = np.frexp(ns.astype(np.float64))
    b = (exponent.astype(np.int64) - 1) * PER_OCTAVE + ((mantissa * 2.0 - 1.0) * PER_OCTAVE).astype(np.int64)
    return np.where(ns <= 1, 0, b)


def _fold_index_py(frames: list, index: dict[str, int], max_paths: int) -> tuple[bytes, bytes]:
    """Pure-Python ``_fastregion.fold_index``: path numbers and durations as int64 bytes."""
    import array

    numbers = array.array("q")
    for frame in frames:
        path = frame[4] or frame_path(frame)
        i = index.get(path)
        if i is None and len(index) < max_paths:
            i = index[path] = len(index)
        numbers.append(-1 if i is None else i)
    return numbers.tobytes(), array.array("q", [f[5] - f[2] for f in frames]).tobytes()


_fold_index = _region._accel.fold_index if _region._accel is not None else _fold_index_py


def merge_summaries(docs: list[dict[str, Any]]) -> dict[str, PathStats]:
    """Merge the ``regions`` of several summary documents (threads, processes, ranks)."""
    merged: dict[str, PathStats] = {}
    for doc in docs:
        for row in doc[SUMMARY_KEY]["regions"]:
            merged.setdefault(row["path"], PathStats()).merge(PathStats.from_json(row))
    return merged


class AggregateSession:
    """Always-on aggregation into ``path`` (a ``.summary.json``), rewritten every ``flush_s``.

    With ``otel=True`` (or ``CUVIL_OTEL=1``), or an ``otel_metrics_exporter``, every summary written
    is also exported as OpenTelemetry metrics (``instrument.otel_metrics``); ``model`` and
    ``build_version`` become resource attributes there."""

    def __init__(self, path: str, flush_s: float = 10.0, max_paths: int = 10_000, otel: bool | None = None,
                 otel_metrics_exporter: Any = None, model: str | None = None,
                 build_version: str | None = None) -> None:
        self.path = os.fspath(path)
        self.flush_s = flush_s
        self.recorder = AggregateRecorder(max_paths)
        self.start_unix_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.flushes = 0
        self.otel = otel if otel is not None else os.environ.get("CUVIL_OTEL", "") not in ("", "0")
        self.model, self.build_version = model, build_version
        self._metrics_exporter = otel_metrics_exporter
        self.metrics: Any = None              # OtelMetricsExporter while exporting
        self.otel_status: dict[str, Any] | None = None
        self.pid = os.getpid()

    def start(self) -> AggregateSession:
        import numpy  # noqa: F401  (the folds use it; imported here, not in the first fold's time)

        self._start_metrics()
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
        if self.metrics is not None:
            self.metrics.shutdown()
        return self.path

    def _start_metrics(self) -> None:
        """The OpenTelemetry metrics export, when asked for; a failure is logged, never raised."""
        if not (self.otel or self._metrics_exporter is not None):
            return
        try:
            from cuvil_pgc.instrument.otel_metrics import OtelMetricsExporter, exporter_from_env, resource_for
            from cuvil_pgc.instrument.session import _rank_and_world

            exporter = self._metrics_exporter or exporter_from_env()
            if exporter is None:
                self.otel_status = {"status": "disabled", "reason": "OTEL_METRICS_EXPORTER=none"}
                return
            resource = resource_for(socket.gethostname(), _rank_and_world()[0], self.model, self.build_version)
            self.metrics = OtelMetricsExporter(exporter, resource)
            self.otel_status = {"status": "ok"}
        except Exception as exc:  # never into the host program
            log.warning("cuvil-pgc: OpenTelemetry metrics export disabled (%s)", exc)
            self.otel_status = {"status": "unavailable", "reason": str(exc)}

    def __enter__(self) -> AggregateSession:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def step(self) -> None:
        """Accepted for symmetry with other sessions; aggregates need no steps."""

    def _loop(self) -> None:
        next_flush = time.monotonic() + self.flush_s
        while not self._stop.wait(min(FOLD_INTERVAL_S, self.flush_s)):
            if self.recorder.fullest() >= self.recorder.capacity // 4:   # big batches: cheap folds
                try:
                    self.recorder.fold()
                except Exception as exc:    # never into the host program; the flush reports too
                    log.warning("cuvil-pgc: folding region histograms failed: %s", exc)
            if time.monotonic() >= next_flush:
                self.flush()
                next_flush = time.monotonic() + self.flush_s

    def document(self) -> dict[str, Any]:
        from cuvil_pgc.instrument.session import _rank_and_world

        rank, world = _rank_and_world()
        regions = [s.to_json(p) for p, s in sorted(self.recorder.snapshot().items())]
        meta = {"version": __version__, "host": socket.gethostname(), "pid": os.getpid(), "rank": rank,
                "world_size": world,
                "python": sys.version.split()[0], "torch": getattr(sys.modules.get("torch"), "__version__", None),
                "start_unix_ns": self.start_unix_ns, "end_unix_ns": time.time_ns(), "command": list(sys.argv),
                "dropped": {"aggregate_paths": self.recorder.dropped_paths,
                            "aggregate_regions": self.recorder.dropped()}}
        if self.otel_status is not None:
            meta["samplers"] = {"otel_metrics": dict(self.otel_status)}
        if self.metrics is not None:
            meta["dropped"]["otel_metrics"] = self.metrics.dropped
            meta["samplers"]["otel_metrics"]["exported"] = self.metrics.exported
        return {SUMMARY_KEY: {"schema_version": SUMMARY_SCHEMA_VERSION,
                              "bucket_scheme": {"per_octave": PER_OCTAVE, "unit": "ns"},
                              "metadata": meta, "regions": regions}}

    def flush(self) -> None:
        """Rewrite the summary file atomically. Never raises into the host program, and never
        from a forked child: the summary is its parent's."""
        if os.getpid() != self.pid:
            return
        try:
            from pathlib import Path

            from cuvil_pgc._fsutil import trace_file_mode, write_atomic
            from cuvil_pgc.trace.writer import dumps

            doc = self.document()
            write_atomic(Path(self.path), dumps(doc), mode=trace_file_mode())
            self.flushes += 1
        except Exception as exc:
            log.warning("cuvil-pgc: writing the aggregate summary %s failed: %s", self.path, exc)
            return
        if self.metrics is not None:
            self.metrics.submit(doc)
