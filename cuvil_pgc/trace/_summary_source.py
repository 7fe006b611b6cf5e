"""Reading aggregate summary files (format: :mod:`.summary`) as a Source with no rows.

The histograms are validated here (types, non-negative counts, buckets summing to the count) so
the analyzer can trust them; a bad file is a TraceError naming the region and the field.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace._build import SourceColumns
from cuvil_pgc.trace._metadata import check_metadata
from cuvil_pgc.trace.columns import COUNTER_COLUMNS, EVENT_COLUMNS, Source
from cuvil_pgc.trace.summary import PER_OCTAVE, SUMMARY_KEY

KEY = f'"{SUMMARY_KEY}"'.encode()
_INT_FIELDS = ("count", "sum_ns", "min_ns", "max_ns")


def looks_like_summary(data: bytes) -> bool:
    return data.lstrip()[:1] == b"{" and KEY in data[:64]


def summary_source(data: bytes, path: str, weight: float) -> Source:
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"is not valid JSON ({exc})", path=path,
                         fix="summary files are rewritten atomically; use the latest complete one") from None
    body = doc.get(SUMMARY_KEY) if isinstance(doc, dict) else None
    if not isinstance(body, dict) or not isinstance(body.get("regions"), list):
        raise TraceError("is not an aggregate summary: missing cuvil_summary.regions", path=path)
    if body.get("bucket_scheme", {}).get("per_octave") != PER_OCTAVE:
        raise TraceError(f"uses bucket scheme {body.get('bucket_scheme')!r}; this version reads per_octave {PER_OCTAVE}",
                         path=path, fix="upgrade cuvil-pgc")
    rows = [_checked_row(row, i, path) for i, row in enumerate(body["regions"])]
    notes: list[str] = []
    meta = check_metadata(body.get("metadata") or {}, path, notes, what="cuvil_summary.metadata")
    meta["summary_regions"] = rows
    return Source(path=path, format="summary", metadata=meta, rank=int(meta.get("rank") or 0), weight=weight,
                  notes=notes)


def _checked_row(row: Any, i: int, path: str) -> dict[str, Any]:
    where = f"region {i}"
    if not isinstance(row, dict) or not isinstance(row.get("path"), str) or not row["path"]:
        raise TraceError(f"{where}: 'path' must be a non-empty string", path=path)
    where = f"region {row['path']!r}"
    for name in _INT_FIELDS:
        if type(row.get(name)) is not int or row[name] < 0:
            raise TraceError(f"{where}: '{name}' must be a non-negative integer, got {row.get(name)!r}", path=path)
    buckets = row.get("buckets")
    if not isinstance(buckets, list) or not all(
            isinstance(b, list) and len(b) == 2 and all(type(x) is int and 0 <= x < 10_000 for x in b) for b in buckets):
        raise TraceError(f"{where}: 'buckets' must be [[bucket, count], ...] of small non-negative integers",
                         path=path)
    if sum(c for _, c in buckets) != row["count"]:
        raise TraceError(f"{where}: bucket counts add up to {sum(c for _, c in buckets)}, not count={row['count']}",
                         path=path)
    return row


def no_rows() -> SourceColumns:
    """The (empty) columns of a summary source."""
    cols = {col: np.zeros(0, dtype=dtype) for col, dtype in EVENT_COLUMNS.items() if col != "source"}
    cols["external_id"] = np.zeros(0, dtype=np.int64)
    cols["fwdbwd"] = np.zeros(0, dtype=np.int64)
    counters = {col: np.zeros(0, dtype=dtype) for col, dtype in COUNTER_COLUMNS.items() if col != "source"}
    return SourceColumns(cols=cols, args={}, region_path=None, region_given=np.zeros(0, dtype=bool),
                         counters=counters)
