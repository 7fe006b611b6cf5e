"""Several traces as one: the files of one ``load_trace`` call, ranks of a job, repeated runs.

Merging lives with the data (like pyinstrument's ``Session.combine``), and there is one merge:
``load_trace`` merges the files it reads with :func:`combine`, and :func:`merge_traces` merges
Traces already loaded (what ``analyze`` does with a list of them) through the same function.

- **Clock** (:func:`align`): each part knows, or not, the Unix time of its ``ts = 0``
  (``origin_ns``). The part whose first row is earliest in absolute time sets the merged zero, the
  other anchored parts keep their distance to it, and a part without an anchor starts at 0.
- **Rows**: concatenated and sorted by ``ts``, longer first on ties (so a parent precedes the
  children that start with it); counters by ``ts`` (stable). Strings are interned into one table,
  string pids and tids (``-2 - index``) follow their strings, ``source`` indices are shifted so
  each part keeps its sources (their ``rank`` and ``weight``),
  sparse ``args`` re-keyed to the new rows without decoding them.
- **Columns**: every EVENT_COLUMNS column; an extra column (:data:`EXTRA_COLUMNS`) only when every
  part has it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from cuvil_pgc.trace._args import ArgsMap, RowArgs
from cuvil_pgc.trace.columns import COUNTER_COLUMNS, EVENT_COLUMNS, EXTRA_COLUMNS, Source, StringTable, Trace


@dataclass
class Part:
    """One input of :func:`combine`: columns whose ``name``/``region`` index the merged StringTable.

    ``events`` and ``counters`` may omit ``source`` (then all rows are this part's first source);
    ``combine`` takes the columns out of these dicts as it goes (peak memory about one copy).
    """

    events: dict[str, np.ndarray]
    counters: dict[str, np.ndarray]
    args: RowArgs | Mapping[int, Any]   # row -> args as stored (not decoded)
    sources: int = 1                     # how many sources the part brings
    origin_ns: int | None = None         # Unix ns of the part's ts = 0, when known
    extra: tuple[str, ...] = field(default=())  # extra event columns it carries


def first_ts(*ts: np.ndarray) -> float | None:
    """The earliest of these ``ts`` columns (events, counters), None when they hold no row."""
    mins = [float(a.min()) for a in ts if len(a)]
    return min(mins) if mins else None


def align(origins_ns: Sequence[int | None], firsts_us: Sequence[float | None]) -> list[float]:
    """Per part, the µs to add to its ts so that all share one clock starting at the earliest row.

    The earliest anchored row is found relative to its own part's origin, in µs, not through whole
    Unix nanoseconds: a part whose ts carry fractions of a nanosecond (1.6875 µs) would otherwise
    start half a nanosecond off zero. A part without an origin (or rows) starts at 0."""
    anchored = [(o, f) for o, f in zip(origins_ns, firsts_us, strict=True) if o is not None and f is not None]
    if anchored:
        base = anchored[0][0]
        zero_origin, zero_first = min(anchored, key=lambda a: (a[0] - base) / 1000.0 + a[1])
    offsets = []
    for origin, first in zip(origins_ns, firsts_us, strict=True):
        if origin is None or first is None:
            offsets.append(-(first or 0.0))
        else:
            offsets.append((origin - zero_origin) / 1000.0 - zero_first)
    return offsets


def combine(parts: list[Part], offsets: Sequence[float], strings: StringTable, sources: list[Source]) -> Trace:
    """One Trace of ``parts`` shifted by ``offsets`` (see the module docstring)."""
    sizes = [len(p.events["ts"]) for p in parts]
    bases = np.cumsum([0] + [p.sources for p in parts])[:-1].tolist()
    ts = np.concatenate([p.events.pop("ts") + off for p, off in zip(parts, offsets, strict=True)])
    dur = np.concatenate([p.events.pop("dur") for p in parts])
    order = np.lexsort((-dur, ts))
    events = {"ts": ts[order], "dur": dur[order]}
    del ts, dur
    extra = {c: EXTRA_COLUMNS[c] for c in EXTRA_COLUMNS if all(c in p.extra for p in parts)}
    for col, dtype in {**EVENT_COLUMNS, **extra}.items():     # one column at a time: peak ~1x
        if col in events:
            continue
        if col == "source":
            whole = np.concatenate([_sources(p.events, n, base) for p, n, base in zip(parts, sizes, bases, strict=True)])
        else:
            whole = np.concatenate([p.events.pop(col) for p in parts]).astype(dtype, copy=False)
        events[col] = whole[order]
        del whole
    for p in parts:
        p.events.clear()
    rank_of_row = np.empty(len(order), dtype=np.int64)
    rank_of_row[order] = np.arange(len(order))
    args = _combine_args(parts, sizes, rank_of_row)
    counters = _combine_counters(parts, offsets, bases)
    return Trace(strings=strings, events=events, counters=counters, args=args, sources=sources)


def merge_traces(traces: list[Trace]) -> Trace:
    """One Trace holding the rows of all ``traces``, aligned on wall-clock time (module docstring).

    Each trace is anchored by its first source's metadata as ``load_trace`` records it
    (``start_unix_ns``, ``ts_offset_us``); the sources are copied, their metadata shared."""
    if len(traces) == 1:
        return traces[0]
    strings = StringTable()
    parts = [_part(t, strings) for t in traces]
    offsets = align([p.origin_ns for p in parts], [first_ts(p.events["ts"], p.counters["ts"]) for p in parts])
    sources = [Source(path=s.path, format=s.format, metadata=s.metadata, rank=s.rank, weight=s.weight,
                      recovered=s.recovered, notes=list(s.notes), warnings=list(s.warnings))
               for t in traces for s in t.sources]
    return combine(parts, offsets, strings, sources)


def _part(trace: Trace, strings: StringTable) -> Part:
    """A loaded trace as a Part: strings re-interned into ``strings``, nothing else copied."""
    remap = np.array([strings.intern(s) for s in trace.strings.strings] + [-1], dtype=np.int64)
    events = {c: _remapped(c, trace.events[c], remap) for c in (*EVENT_COLUMNS, *EXTRA_COLUMNS) if c in trace.events}
    counters = {c: _remapped(c, trace.counters[c], remap) for c in COUNTER_COLUMNS}
    return Part(events=events, counters=counters, args=trace.args, sources=max(len(trace.sources), 1),
                origin_ns=_origin_ns(trace), extra=tuple(c for c in EXTRA_COLUMNS if c in trace.events))


def _remapped(col: str, values: np.ndarray, remap: np.ndarray) -> np.ndarray:
    if col in ("name", "region"):
        return remap[np.where(values >= 0, values, len(remap) - 1)]
    if col in ("pid", "tid") and (values <= -2).any():      # string ids: -2 - index into strings
        named = values <= -2
        return np.where(named, -2 - remap[np.where(named, -2 - values, len(remap) - 1)], values)
    return values


def _origin_ns(trace: Trace) -> int | None:
    """Unix ns of the trace's ts = 0, from its first source's anchor (None when it has none)."""
    if not trace.sources:
        return None
    meta = trace.sources[0].metadata
    start = meta.get("start_unix_ns") if isinstance(meta, dict) else None
    offset = meta.get("ts_offset_us", 0.0) if isinstance(meta, dict) else 0.0
    if type(start) is not int or not isinstance(offset, (int, float)):
        return None
    if trace.sources[0].format != "kineto":
        return start - round(offset * 1000.0)        # ours: start_unix_ns is the file's ts = 0
    # Kineto: the reader stores the wall time of the source's earliest event
    mine = trace.events["source"] == 0
    first = first_ts(trace.events["ts"][mine], trace.counters["ts"][trace.counters["source"] == 0])
    return start - round((first or 0.0) * 1000.0)


def _sources(columns: dict[str, np.ndarray], n: int, base: int) -> np.ndarray:
    own = columns.pop("source", None)
    if own is None:
        return np.full(n, base, dtype=np.int16)
    return (own.astype(np.int64) + base).astype(np.int16)


def _combine_args(parts: list[Part], sizes: list[int], rank_of_row: np.ndarray) -> ArgsMap:
    """Every part's args as one int32 column of codes (in merged row order) into their values."""
    whole = RowArgs.concat([p.args for p in parts], sizes)
    for p in parts:
        p.args = {}
    codes = np.empty(len(whole.codes), dtype=np.int32)
    codes[rank_of_row] = whole.codes
    return ArgsMap(codes=codes, values=whole.values)


def _combine_counters(parts: list[Part], offsets: Sequence[float], bases: list[int]) -> dict[str, np.ndarray]:
    sizes = [len(p.counters["ts"]) for p in parts]
    counters = {col: np.concatenate([p.counters[col] for p in parts]).astype(dtype, copy=False)
                for col, dtype in COUNTER_COLUMNS.items() if col not in ("source", "ts")}
    counters["source"] = np.concatenate([_sources(p.counters, n, base)
                                         for p, n, base in zip(parts, sizes, bases, strict=True)])
    counters["ts"] = np.concatenate([p.counters["ts"].astype(np.float64, copy=False) + off
                                     for p, off in zip(parts, offsets, strict=True)])
    order = np.argsort(counters["ts"], kind="stable")
    return {col: counters[col][order] for col in COUNTER_COLUMNS}
