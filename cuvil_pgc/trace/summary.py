"""The aggregate summary format: per-path latency histograms instead of events.

Written by always-on aggregate sessions (``instrument.aggregate``), read by ``trace.load_trace``
(a source of format ``"summary"``), analysed by ``analyze.summary`` and merged across threads,
processes and ranks by :func:`merge_summaries`.

Histogram: bucket ``b = 8*e + s`` holds durations in ``[2**e * (1 + s/8), 2**e * (1 + (s+1)/8))``
ns — 8 linear buckets per octave, so a percentile read at a bucket's midpoint is within 6.25% of
the true value. Histograms of the same scheme merge by adding counts.

Summary file (JSON): ``{"cuvil_summary": {"schema_version", "bucket_scheme": {"per_octave": 8,
"unit": "ns"}, "metadata": {...like a trace's cuvil object...}, "regions": [{"path", "count",
"sum_ns", "min_ns", "max_ns", "buckets": [[b, count], ...]}]}}``.

Pure Python at import (the recording side imports it): numpy only inside :func:`buckets_of`.
"""

from __future__ import annotations

import math
from typing import Any

PER_OCTAVE = 8
SUMMARY_KEY = "cuvil_summary"
SUMMARY_SCHEMA_VERSION = 1
BUCKET_SCHEME = {"per_octave": PER_OCTAVE, "unit": "ns"}
_frexp = math.frexp


def bucket_of(ns: int) -> int:
    """Histogram bucket of a duration in ns (0 for durations under 1 ns)."""
    if ns <= 1:
        return 0
    mantissa, exponent = _frexp(ns)          # ns = m * 2**e with 0.5 <= m < 1
    return (exponent - 1) * PER_OCTAVE + int((mantissa * 2.0 - 1.0) * PER_OCTAVE)


def buckets_of(ns):
    """:func:`bucket_of` of every duration in an int64 array."""
    import numpy as np

    mantissa, exponent = np.frexp(ns.astype(np.float64))
    b = (exponent.astype(np.int64) - 1) * PER_OCTAVE + ((mantissa * 2.0 - 1.0) * PER_OCTAVE).astype(np.int64)
    return np.where(ns <= 1, 0, b)


def bucket_bounds(b: int) -> tuple[float, float]:
    """[low, high) of bucket b in ns."""
    octave, sub = divmod(b, PER_OCTAVE)
    base = 2.0 ** octave
    return base * (1 + sub / PER_OCTAVE), base * (1 + (sub + 1) / PER_OCTAVE)


class PathStats:
    """One path's histogram: call count, exact sum, min and max in ns, and bucket counts."""

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


def summary_document(metadata: dict[str, Any], stats: dict[str, PathStats]) -> dict[str, Any]:
    """The summary file's document for these per-path histograms (paths sorted)."""
    return {SUMMARY_KEY: {"schema_version": SUMMARY_SCHEMA_VERSION, "bucket_scheme": dict(BUCKET_SCHEME),
                          "metadata": metadata, "regions": [s.to_json(p) for p, s in sorted(stats.items())]}}


def merge_summaries(docs: list[dict[str, Any]]) -> dict[str, PathStats]:
    """Merge the ``regions`` of several summary documents (threads, processes, ranks)."""
    merged: dict[str, PathStats] = {}
    for doc in docs:
        for row in doc[SUMMARY_KEY]["regions"]:
            merged.setdefault(row["path"], PathStats()).merge(PathStats.from_json(row))
    return merged
