"""A Kineto file read chunk by chunk (``_stream``, ``_parallel``) → the columns of one source.

Contract: :func:`build_kineto_chunks` gives what :func:`~._build.build_source` gives on the whole
file, without holding its bytes or its events at once: each chunk becomes a :class:`ChunkPart`
(:func:`chunk_part`, in a worker process too, with its own string table), and
:func:`assemble_chunks` joins the parts in file order and converts their times once, over the whole
file. Where only the whole-file path can decide (bad or mixed time units, ns decimals a float64
cannot hold, an error message that needs an event's index in the file) it raises
:class:`StreamFallback`, and the reader reads the file whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np

from cuvil_pgc.trace import _args as A
from cuvil_pgc.trace._build import (
    NS_FLOOR,
    Events,
    SourceColumns,
    basic_columns,
    copied_raw,
    counter_ts,
    durations,
    kineto_args,
    profiler_ranges,
    skipped_notes,
)
from cuvil_pgc.trace._clock import FileClock, kineto_us_clock, needs_exact
from cuvil_pgc.trace._decode import Event, KinetoEvent
from cuvil_pgc.trace._repairs import clip_overruns, drop_unstamped, overrun_note
from cuvil_pgc.trace._side_events import add_names, counter_columns, link_flows
from cuvil_pgc.trace.columns import StringTable, float_column
from cuvil_pgc.trace.schema import CAT_PROFILER_RANGE, MAX_TIME_US


class StreamFallback(Exception):
    """A streamed file needs the whole-file path (which reports its problem precisely)."""


class _Collected:
    """Non-X events gathered over the chunks of a streamed file (the shape ``Events`` has)."""

    def __init__(self) -> None:
        self.flows: list[Any] = []
        self.counters: list[Any] = []
        self.meta: list[Any] = []
        self.skipped: dict[str, int] = {}

    def file_index(self, k: int, ph: str = "X") -> int:
        raise StreamFallback("an error message needs the event's index in the file")


@dataclass
class ChunkPart:
    """One chunk of a streamed Kineto file as columns (:func:`chunk_part`), interned into its own
    ``strings`` when it was built in a worker process (:meth:`reintern` maps them to the file's)."""

    cols: dict[str, np.ndarray]
    exact: np.ndarray | None             # the ts as exact ints when the chunk counts in Unix ns
    args: A.RowArgs
    other_cats: dict[str, int]
    rest: _Collected
    strings: list[str] | None = None

    def reintern(self, strings: StringTable) -> None:
        """Name and string pid/tid codes of this part's own table → codes of ``strings``."""
        if self.strings is None:
            return
        table = np.array([strings.intern(s) for s in self.strings] or [0], dtype=np.int64)
        cols = self.cols
        cols["name"] = table[cols["name"]].astype(np.int32)
        for col in ("pid", "tid"):
            ids = cols[col]
            named = ids <= -2                        # -2 - index: a string pid/tid (see id_column)
            if named.any():
                ids[named] = -2 - table[-2 - ids[named]]
        self.strings = None


def chunk_part(events: list[KinetoEvent], raw_events: Callable[[], list[Event]], strings: StringTable) -> ChunkPart:
    """Columns of one chunk of a streamed Kineto file (see :func:`build_kineto_chunks`)."""
    evs = Events(events)
    drop_unstamped(evs)
    rest = _Collected()
    if evs.counters:      # typed args drop counter series: read them raw, as copies
        rest.counters = [msgspec.structs.replace(e, args=copied_raw(e.args)) for e in raw_events() if e.ph == "C"]
    xs = evs.xs
    cols, cats = basic_columns(xs, "kineto", strings)
    ts_values = [e.ts for e in xs]
    cols["ts"] = float_column(ts_values)
    cols["dur"] = durations(xs, evs.skipped)
    big = not len(xs) or (bool(np.isfinite(cols["ts"]).all()) and float(cols["ts"].min()) > NS_FLOOR)
    exact = np.array([int(v) for v in ts_values], dtype=np.int64) if big else None
    args = kineto_args(xs, cols)
    if cats.get(CAT_PROFILER_RANGE):
        profiler_ranges(xs, raw_events, cols, args)
    rest.flows, rest.meta, rest.skipped = evs.flows, evs.meta, evs.skipped
    return ChunkPart(cols, exact, args, cats, rest)


def build_kineto_chunks(chunks: Iterable[tuple[list[KinetoEvent], Callable[[], list[Event]]]],
                        strings: StringTable, path: str) -> SourceColumns:
    """Columns of a Kineto file read chunk by chunk (``_stream``): the same result as
    :func:`build_source` on the whole file, without holding its bytes or its events at once.
    Raises StreamFallback where the whole-file path must decide (bad times)."""
    return assemble_chunks((chunk_part(events, raw, strings) for events, raw in chunks), strings, path)


def assemble_chunks(parts_in: Iterable[ChunkPart], strings: StringTable, path: str) -> SourceColumns:
    """One source's columns from its chunks' parts, in file order (each released as it is read)."""
    parts: list[dict[str, np.ndarray]] = []
    exact: list[np.ndarray | None] = []
    arg_parts: list[A.RowArgs] = []
    other_cats: dict[str, int] = {}
    rest = _Collected()
    for part in parts_in:
        part.reintern(strings)
        parts.append(part.cols)
        exact.append(part.exact)
        arg_parts.append(part.args)
        rest.counters += part.rest.counters
        rest.flows += part.rest.flows
        rest.meta += part.rest.meta
        for table, more in ((rest.skipped, part.rest.skipped), (other_cats, part.other_cats)):
            for k, v in more.items():
                table[k] = table.get(k, 0) + v
    if not parts:
        raise StreamFallback("no events")
    cols = {k: np.concatenate([p.pop(k) for p in parts]) for k in list(parts[0])}   # one column at a time
    del parts
    args = A.RowArgs.concat(arg_parts, [len(p.codes) for p in arg_parts])
    del arg_parts
    ts = cols["ts"]
    if len(ts) and bool(np.isfinite(ts).all()) and float(ts.min()) > NS_FLOOR:
        if any(e is None for e in exact):
            raise StreamFallback("mixed time units")
        ints = np.concatenate(exact)
        clock = FileClock(origin_ns=int(ints.min()))
        cols["ts"], cols["dur"] = (ints - clock.origin_ns) / 1000.0, cols["dur"] / 1000.0
    elif needs_exact(ts, NS_FLOOR):
        raise StreamFallback("µs timestamps with ns decimals beyond float64 precision: read whole, exactly")
    else:
        clock = kineto_us_clock(ts, counter_ts(rest.counters))
        cols["ts"] = clock.us(ts)
    del exact
    for col in (cols["ts"], cols["dur"]):
        if (~np.isfinite(col) | (col < 0) | (col > MAX_TIME_US)).any():
            raise StreamFallback("bad times")
    overruns = clip_overruns(cols)
    link_flows(cols, rest, strings, clock)
    src = SourceColumns(cols=cols, args=args, region_path=None, region_given=np.zeros(len(cols["ts"]), bool),
                        counters=counter_columns(rest, strings, path, clock), origin_ns=clock.origin_ns,
                        shift_us=clock.shift_us)
    src.thread_names, src.process_names = add_names(rest.meta, strings)
    if clock.origin_ns is not None:
        src.notes.append("timestamps are Unix nanoseconds; converted to µs (exactly, from the earliest event)")
    src.warnings = skipped_notes(rest, other_cats)
    if overruns[0]:
        src.warnings.append(overrun_note(*overruns))
    src.notes.extend(src.warnings)
    return src
