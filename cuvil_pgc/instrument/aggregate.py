"""Always-on aggregates: regions folded into per-path latency histograms instead of events.

For servers that run for weeks: memory stays bounded (at most ``max_paths`` paths per thread,
each a fixed log-bucketed histogram, and bounded per-thread buffers of ended regions that are
folded off the user's threads), nothing is written per call, and the summary file is
rewritten atomically every ``flush_s`` seconds. ``analyze``, ``report`` and ``diff`` read a
summary like a trace (no timeline; calls, totals, means and percentiles per path).

The histogram scheme and the summary file's format are the trace data's
(:mod:`cuvil_pgc.trace.summary`); this module records into them.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import time
from typing import Any

from cuvil_pgc._version import __version__
from cuvil_pgc.instrument import region as _region
from cuvil_pgc.instrument._accel import fastregion
from cuvil_pgc.instrument._buffers import RegionRecorder
from cuvil_pgc.instrument._ranks import rank_and_world
from cuvil_pgc.instrument.region import frame_path
from cuvil_pgc.trace.summary import PathStats, buckets_of, summary_document

log = logging.getLogger("cuvil_pgc")

FOLD_INTERVAL_S = 0.1   # buffers are checked this often: 2**18 slots per thread take 2.6M regions/s


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


_fold_index = fastregion.fold_index if fastregion is not None else _fold_index_py


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

            exporter = self._metrics_exporter or exporter_from_env()
            if exporter is None:
                self.otel_status = {"status": "disabled", "reason": "OTEL_METRICS_EXPORTER=none"}
                return
            resource = resource_for(socket.gethostname(), rank_and_world()[0], self.model, self.build_version)
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
        rank, world = rank_and_world()
        stats = self.recorder.snapshot()
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
        return summary_document(meta, stats)

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
