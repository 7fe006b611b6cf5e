"""Trace: the columnar, in-memory form of one or more trace files.

Every event is one row across numpy columns; strings (names, region paths) are interned into
``strings`` and the columns hold their indices. Rows are sorted by ``ts``. Extra per-event data
that few rows have (region attributes, kernel launch configuration, operator shapes, compile
details) lives in the sparse ``args`` mapping, keyed by row.

Conventions:
- ``ts`` / ``dur`` in microseconds, ``ts`` from the start of the earliest source.
- ``region`` is the interned path of the region a row belongs to (its own path for region rows,
  the innermost enclosing region for ops, kernels and runtime calls), -1 for none.
- ``flops`` / ``bytes`` are NaN when unknown.
- ``source`` indexes ``sources`` (one per file read; ``rank`` and ``weight`` live there).
- Optional extra columns from ``load_trace``: ``events["external_id"]`` (int64, Kineto's
  ``External id`` linking ops, launches and kernels; -1 none) and ``events["fwdbwd"]`` (int64, the
  id of the ``fwdbwd`` flow from a forward op to its backward op, on both; -1 none). Code that
  builds Traces may omit them.
- ``args`` from ``load_trace`` is a ``trace._args.ArgsMap``: a ``dict[int, dict]`` decoded per row
  on first read (use ``.get``/``[]``/``in``/``items``, not ``isinstance(args, dict)``), held as an
  int32 column of codes into deduplicated values (a loop's operators share one entry), not a
  per-row dict; ``raw_items()`` gives (rows, stored values) without decoding them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil_pgc.trace.schema import Kind

#: the smallest integer a float64 cannot hold (JSON numbers may have any number of digits)
FLOAT_OVERFLOW = 2**1024


def float_column(values: Any) -> np.ndarray:
    """``values`` (numbers as a file wrote them) as float64, an integer beyond float's range as an
    infinity of its sign, for the reader's range checks to name; NumPy raises OverflowError on it."""
    try:
        return np.array(values, dtype=np.float64)
    except OverflowError:
        return np.array([(math.inf if v > 0 else -math.inf) if type(v) is int and abs(v) >= FLOAT_OVERFLOW else v
                         for v in values], dtype=np.float64)

EVENT_COLUMNS: dict[str, np.dtype] = {
    "kind": np.dtype(np.uint8),
    "name": np.dtype(np.int32),
    "ts": np.dtype(np.float64),
    "dur": np.dtype(np.float64),
    "pid": np.dtype(np.int64),
    "tid": np.dtype(np.int64),
    "region": np.dtype(np.int32),
    "region_id": np.dtype(np.int64),
    "parent_id": np.dtype(np.int64),
    "flops": np.dtype(np.float64),
    "bytes": np.dtype(np.float64),
    "correlation": np.dtype(np.int64),
    "source": np.dtype(np.int16),
}

#: Optional event columns ``load_trace`` adds (module docstring); code that builds Traces may omit them.
EXTRA_COLUMNS: dict[str, np.dtype] = {"external_id": np.dtype(np.int64), "fwdbwd": np.dtype(np.int64)}

COUNTER_COLUMNS: dict[str, np.dtype] = {
    "name": np.dtype(np.int32),
    "ts": np.dtype(np.float64),
    "value": np.dtype(np.float64),
    "pid": np.dtype(np.int64),
    "source": np.dtype(np.int16),
}


@dataclass
class Source:
    """One file that went into a Trace."""

    path: str
    format: str                 # "cuvil", "kineto" or "summary"
    metadata: dict[str, Any]    # our `cuvil` object, or what a Kineto file says of itself
    rank: int = 0
    weight: float = 1.0
    recovered: bool = False     # read back from a partial file after a crash
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # events not analysed, with counts (also in notes)


class StringTable:
    """Interned strings: index <-> str."""

    def __init__(self, strings: list[str] | None = None) -> None:
        self.strings: list[str] = list(strings or [])
        self._index = {s: i for i, s in enumerate(self.strings)}

    def intern(self, s: str) -> int:
        i = self._index.get(s)
        if i is None:
            i = self._index[s] = len(self.strings)
            self.strings.append(s)
        return i

    def get(self, s: str) -> int:
        """Index of ``s``, or -1 if it was never interned."""
        return self._index.get(s, -1)

    def __getitem__(self, i: int) -> str:
        return self.strings[i]

    def __len__(self) -> int:
        return len(self.strings)


@dataclass
class Trace:
    """Events and counters of one or more trace files, as columns (see module docstring)."""

    strings: StringTable
    events: dict[str, np.ndarray]
    counters: dict[str, np.ndarray]
    args: dict[int, dict[str, Any]]
    sources: list[Source]

    def __post_init__(self) -> None:
        n = len(self.events["ts"])
        for col, dtype in EVENT_COLUMNS.items():
            arr = self.events[col]
            if len(arr) != n or arr.dtype != dtype:
                raise ValueError(f"column {col}: {len(arr)} x {arr.dtype}, expected {n} x {dtype}")

    def __len__(self) -> int:
        return len(self.events["ts"])

    def __getattr__(self, col: str) -> np.ndarray:
        events = self.__dict__.get("events")
        if events is not None and col in events:
            return events[col]
        raise AttributeError(col)

    def string(self, i: int) -> str | None:
        return None if i < 0 else self.strings[i]

    def of_kind(self, kind: Kind) -> np.ndarray:
        """Row indices of one event kind."""
        return np.nonzero(self.events["kind"] == kind)[0]

    @property
    def duration_us(self) -> float:
        """Wall span of the trace: first event start to last event end."""
        if not len(self):
            return 0.0
        ts, dur = self.events["ts"], self.events["dur"]
        return float(np.max(ts + dur) - np.min(ts))

    @property
    def metadata(self) -> dict[str, Any]:
        """Metadata of the first source (the common single-file case)."""
        return self.sources[0].metadata if self.sources else {}


def empty_columns(spec: dict[str, np.dtype], n: int = 0) -> dict[str, np.ndarray]:
    return {col: np.zeros(n, dtype=dtype) for col, dtype in spec.items()}
