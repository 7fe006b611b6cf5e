"""Typed events of one file → columns of one source (before merging and sorting).

Contract: ``build_source(doc, fmt, strings, path)`` turns the complete (``ph: "X"``) events into
row columns (EVENT_COLUMNS plus ``external_id``, ``fwdbwd`` and ``lane``), the ``ph: "C"`` events
into counter rows, ``M`` events into thread/process names, and flows into links: ``ac2g`` (and
torch 1.8-1.10's ``async``/``launch``) flows give correlation ids where an event's args lack one;
``fwdbwd`` flows give the ``fwdbwd`` column (the flow id on the forward op and on the backward op
it links to, -1 elsewhere). Times stay in the file's own origin, in µs (a Kineto file with large
fractional µs is rebased to a whole µs and rounded to the ns, ``SourceColumns.shift_us``; one whose
fractional µs a float64 cannot hold, torch 2.1-2.3's Unix µs, is re-read exactly as whole ns from the
text (``build_source``'s ``exact_ns``): see ``_clock``); the reader aligns sources.
Region paths, ids and attribution are filled in by :mod:`cuvil_pgc.trace._regions`.

Kineto generations: categories are matched case-insensitively (torch 1.8-1.10 wrote ``Kernel``,
``Operator``, ``Runtime``, ``Memcpy``, ``Memset``), the lower-case ``external id`` of that format is
read, and timestamps in Unix nanoseconds (earliest ``ts`` above :data:`NS_FLOOR`) are converted to
µs from the earliest one, exactly (``SourceColumns.origin_ns``). ``displayTimeUnit`` is a display
preference in the Chrome trace format and does not change the unit of ``ts``. Every event that is
not analysed is named in ``SourceColumns.notes`` with its count: phases other than X/C/M/flows,
categories read as ``Kind.OTHER``, and ``cuda_profiler_range`` kernels (see ``schema``).

Counters: an event ``{"ph": "C", "name": N, "args": {K: V, ...}}`` gives one counter row per
numeric value, named ``N`` when the key ``K`` is ``"value"`` or equals ``N``, else ``"N.K"``
(``sm_util`` with ``{"gpu0": 40, "gpu1": 60}`` → ``sm_util.gpu0``, ``sm_util.gpu1``).

String pids/tids (Kineto's ``"Spans"`` lanes) become negative ids: ``-2 - strings.intern(s)``, so
``trace.strings[-2 - pid]`` names them back.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress, count
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import _args as A
from cuvil_pgc.trace import _ours, _region_tree
from cuvil_pgc.trace._clock import FileClock, kineto_us_clock, needs_exact
from cuvil_pgc.trace._decode import Document, Event, KinetoDocument, KinetoEvent
from cuvil_pgc.trace._repairs import UNSTAMPED, clip_overruns, drop_unstamped, overrun_note
from cuvil_pgc.trace._side_events import FLOW_KINDS, add_names, counter_columns, id_column, link_flows
from cuvil_pgc.trace.columns import StringTable, float_column
from cuvil_pgc.trace.schema import (
    CAT_PROFILER_RANGE,
    CAT_PYTHON_FUNCTION,
    CAT_TO_KIND,
    MAX_TIME_US,
    MODULE_CALL_PREFIX,
    Kind,
)

_EMPTY = msgspec.Raw(b"{}")
_KINETO_KIND = dict(CAT_TO_KIND)
_KINETO_KIND.pop("region")                       # only our files write cat "region"
_OURS_KIND = dict(CAT_TO_KIND)
_OURS_KIND.pop("user_annotation")                # our files' regions are cat "region"
_DICTS = msgspec.json.Decoder(list[dict[str, Any]])
_SHAPES = attrgetter("shapes")
_DTYPES = attrgetter("dtypes")
_KINETO_COLUMN_KINDS = {
    "external_id": None,
    "flops": np.array([Kind.CPU_OP], dtype=np.uint8),
    "bytes": np.array([Kind.MEMCPY, Kind.MEMSET], dtype=np.uint8),
    "correlation": np.array([Kind.RUNTIME, Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], dtype=np.uint8),
}
#: A file whose earliest ts is above this counts in Unix nanoseconds (1e17 µs would be year 5100).
NS_FLOOR = 1e17


@dataclass
class SourceColumns:
    """Rows and counters of one file, in file order, on the file's clock."""

    cols: dict[str, np.ndarray]
    args: A.RowArgs | dict[int, Any]             # row → dict or typed args struct
    region_path: list[str | None] | None         # ours: args.path of region rows (None elsewhere)
    region_given: np.ndarray                     # bool: the file named this row's region
    counters: dict[str, np.ndarray]
    thread_names: list[list[Any]] = field(default_factory=list)
    process_names: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # what was not analysed, with counts
    origin_ns: int | None = None                 # Unix ns of ts = 0 when the file counted in ns
    shift_us: int = 0                            # a Kineto µs file rebased: its ts = shift_us is 0 here


class Events:
    """Events of a document split by phase (``X`` rows, counters, metadata, flows, the rest counted)."""

    def __init__(self, events: list[Event] | list[KinetoEvent]) -> None:
        self.all = events
        self.xs = [e for e in events if e.ph == "X"]
        self.counters: list[Any] = []
        self.meta: list[Any] = []
        self.flows: list[Any] = []
        self.skipped: dict[str, int] = {}
        self.left_out: set[int] = set()        # ids of X events a repair left out (:mod:`._repairs`)
        if len(self.xs) == len(events):
            return
        by_phase = {"C": self.counters, "M": self.meta, "s": self.flows, "f": self.flows, "t": self.flows}
        for e in events:
            ph = e.ph
            if ph != "X":
                group = by_phase.get(ph)
                if group is not None:
                    group.append(e)
                else:
                    self.skipped[ph] = self.skipped.get(ph, 0) + 1

    def file_index(self, k: int, ph: str = "X") -> int:
        """Index in traceEvents of the k-th event of phase ``ph`` (error messages only)."""
        seen = -1
        for i, e in enumerate(self.all):
            if e.ph == ph and id(e) not in self.left_out:
                seen += 1
                if seen == k:
                    return i
        return -1


def build_source(doc: Document | KinetoDocument, fmt: str, strings: StringTable, path: str,
                 raw_events: Callable[[], list[Event]] | None = None,
                 exact_ns: Callable[[], list[int | None] | None] | None = None) -> SourceColumns:
    """Columns of one decoded file (see module docstring).

    ``raw_events``: decodes the file again with raw args; called only when a KinetoDocument
    (whose inline-typed args do not keep counter series) has counter events.
    ``exact_ns``: every event's ``ts`` in whole ns from its text (``_decode.exact_ns_times``); called
    only when a Kineto file's µs carry fractions a float64 cannot hold (``_clock.needs_exact``).
    """
    evs = Events(doc.trace_events)
    if fmt == "kineto":
        drop_unstamped(evs)
    exact = None
    row_ts = _row_ts(evs.xs) if fmt == "kineto" and exact_ns is not None else None
    if row_ts is not None and needs_exact(row_ts, NS_FLOOR):
        exact = exact_ns()
        if exact is not None and len(exact) == len(evs.all):
            _to_ns(evs.all, exact)
            raw_events = _in_ns(raw_events, exact) if raw_events is not None else None
            row_ts = None                  # the events now hold other times
        else:
            exact = None
    if evs.counters and raw_events is not None and isinstance(doc, KinetoDocument):
        evs.counters = [e for e in raw_events() if e.ph == "C"]
    xs = evs.xs
    cols, other_cats = basic_columns(xs, fmt, strings)
    clock = _times(cols, xs, evs, path, fmt, row_ts)
    overruns = clip_overruns(cols) if fmt == "kineto" else (0, 0.0)
    if fmt == "kineto":
        args, given, paths = kineto_args(xs, cols), np.zeros(len(xs), bool), None
    else:
        args, given, paths, refs = _our_args(xs, cols, evs, path, strings)
        tree_notes = _region_tree.fill_paths(cols, paths, evs.meta, strings, refs, given)   # schema 2: ids
    link_flows(cols, evs, strings, clock)
    if other_cats.get(CAT_PROFILER_RANGE) and raw_events is not None and fmt == "kineto":
        profiler_ranges(xs, raw_events, cols, args)
    src = SourceColumns(cols=cols, args=args, region_path=paths, region_given=given,
                        counters=counter_columns(evs, strings, path, clock), origin_ns=clock.origin_ns,
                        shift_us=clock.shift_us)
    src.thread_names, src.process_names = add_names(evs.meta, strings)
    if fmt != "kineto":
        src.notes.extend(tree_notes)
    if exact is not None:
        src.notes.append("timestamps are µs with nanosecond decimals beyond float64 precision; read exactly "
                         "from their text, from the earliest event")
    elif clock.origin_ns is not None:
        src.notes.append("timestamps are Unix nanoseconds; converted to µs (exactly, from the earliest event)")
    src.warnings = skipped_notes(evs, other_cats)
    if overruns[0]:
        src.warnings.append(overrun_note(*overruns))
    src.notes.extend(src.warnings)
    return src


def _row_ts(xs: list[Any]) -> np.ndarray:
    return float_column([e.ts for e in xs])


def _to_ns(events: list[Any], exact: list[int | None]) -> None:
    """The events in whole ns, in place: ``ts`` from ``exact``, ``dur`` (small, so exact in a float) x 1000."""
    for e, t in zip(events, exact, strict=True):
        if t is not None:
            e.ts = t
        if type(e.dur) in (int, float) and math.isfinite(e.dur):
            e.dur = round(e.dur * 1000)


def _in_ns(raw_events: Callable[[], list[Event]], exact: list[int | None]) -> Callable[[], list[Event]]:
    def events() -> list[Event]:
        decoded = raw_events()
        if len(decoded) == len(exact):
            _to_ns(decoded, exact)
        return decoded
    return events


#: SASS instruction counters of the CUPTI range profiler and the FLOPs per instruction (Kineto's
#: ``kineto__cuda_core_flops`` metric expands to them; an FMA is two FLOPs).
SASS_FLOPS = {f"smsp__sass_thread_inst_executed_op_{op}_pred_on.sum": 2 if "fma" in op else 1
              for op in ("ffma", "fmul", "fadd", "hfma", "hmul", "hadd", "dfma", "dmul", "dadd")}


def profiler_ranges(xs: list[KinetoEvent], raw_events: Callable[[], list[Event]], cols: dict[str, np.ndarray],
                     args: A.RowArgs) -> None:
    """``cuda_profiler_range`` rows: their counters as args (``{"cat", "counters"}``) and FLOPs from
    the SASS instruction counters when recorded."""
    rows = [i for i, e in enumerate(xs) if e.cat == CAT_PROFILER_RANGE]
    raw_xs = [e for e in raw_events() if e.ph == "X"]
    if len(raw_xs) != len(xs):
        return
    decoded = _DICTS.decode(b"[" + b",".join(raw_xs[r].args or _EMPTY for r in rows) + b"]")
    for r, d in zip(rows, decoded, strict=True):
        counters = {k: v for k, v in d.items() if type(v) in (int, float)}
        args[r] = {"cat": CAT_PROFILER_RANGE, "counters": counters}
        if SASS_FLOPS.keys() & counters.keys():
            cols["flops"][r] = float(sum(counters.get(k, 0) * f for k, f in SASS_FLOPS.items()))


def skipped_notes(evs: Events, other_cats: dict[str, int]) -> list[str]:
    """What the reader did not analyse, with counts (the user must never lose events silently)."""
    notes = []
    phases = {ph: n for ph, n in evs.skipped.items() if ph not in (NO_DURATION, NEGATIVE_DURATION, UNSTAMPED)}
    if phases:
        notes.append("ignored events of phase " + ", ".join(
            f"{ph or '(none)'!r} x{n}" for ph, n in sorted(phases.items())))
    if evs.skipped.get(NO_DURATION):
        notes.append(f"{evs.skipped[NO_DURATION]:,} complete (X) events have no duration (dur): read as 0 µs")
    if evs.skipped.get(NEGATIVE_DURATION):
        notes.append(f"{evs.skipped[NEGATIVE_DURATION]:,} complete (X) events have a negative duration (dur): read "
                     "as 0 µs (torch.profiler writes -1 for an event still running when the profile stopped)")
    if evs.skipped.get(UNSTAMPED):
        notes.append(f"{evs.skipped[UNSTAMPED]:,} events at ts 0 with no duration, in a trace whose other events "
                     "are stamped on an absolute clock, were left out (Kineto writes activities it has no "
                     "timestamps for so)")
    ranges = other_cats.pop(CAT_PROFILER_RANGE, 0)
    if ranges:
        notes.append(f"{ranges:,} {CAT_PROFILER_RANGE} events (CUPTI range-profiler kernels: hardware counters "
                     "per kernel, times synthesised by Kineto) are kept as other events and counted per device "
                     "in trace.gpu, not as GPU busy time")
    if other_cats:
        notes.append("kept as other events, not analysed: " + ", ".join(
            f"{cat or '(no cat)'!r} x{n:,}" for cat, n in sorted(other_cats.items())))
    return notes


#: the pid of every event in torch <= 1.7's ``export_chrome_trace`` (operators, without a ``cat``)
LEGACY_CPU_PID = "CPU functions"


def basic_columns(xs: list[Event], fmt: str, strings: StringTable) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The columns every row has, and the count of rows per category read as Kind.OTHER."""
    n = len(xs)
    kinds_of = _KINETO_KIND if fmt == "kineto" else _OURS_KIND
    other = int(Kind.OTHER)
    cats = [e.cat for e in xs]
    distinct = list(dict.fromkeys(cats))
    code_of = {c: i for i, c in enumerate(distinct)}
    codes = np.array(list(map(code_of.__getitem__, cats)), dtype=np.int32)
    kind_of_code = np.array([kinds_of.get(c.lower(), other) for c in distinct] or [other], dtype=np.uint8)
    kind = kind_of_code[codes] if n else np.zeros(0, dtype=np.uint8)
    if fmt == "kineto" and "" in code_of:      # torch <= 1.7's export: operators, no category, pid "CPU functions"
        legacy = (codes == code_of[""]) & np.array([e.pid == LEGACY_CPU_PID for e in xs], dtype=bool)
        kind[legacy] = Kind.CPU_OP
        codes = np.where(legacy, -1, codes)
    if fmt == "kineto" and CAT_PYTHON_FUNCTION in code_of:
        codes = _module_calls_are_regions(xs, kind, codes, code_of[CAT_PYTHON_FUNCTION])
    per_code = np.bincount(codes[codes >= 0], minlength=len(distinct))
    other_cats = {c: int(per_code[i]) for i, c in enumerate(distinct) if kind_of_code[i] == other and per_code[i]}
    cols = {
        "kind": kind,
        "name": np.array(_interned([e.name for e in xs], strings), dtype=np.int32),
        "pid": id_column([e.pid for e in xs], strings),
        "tid": id_column([e.tid for e in xs], strings),
    }
    for col in ("region", "region_id", "parent_id", "correlation", "external_id", "fwdbwd"):
        cols[col] = np.full(n, -1, dtype=np.int32 if col == "region" else np.int64)
    cols["flops"] = np.full(n, np.nan)
    cols["bytes"] = np.full(n, np.nan)
    return cols, other_cats


def _times(cols: dict[str, np.ndarray], xs: list[Event], evs: Events, path: str, fmt: str,
           row_ts: np.ndarray | None = None) -> FileClock:
    """``ts`` / ``dur`` columns in µs; returns the clock that converted them (``_clock``).
    ``row_ts``: the events' ``ts`` as floats where the caller has them already (:func:`_row_ts`)."""
    ts = _row_ts(xs) if row_ts is None else row_ts
    dur = durations(xs, evs.skipped)
    clock = FileClock()
    if len(ts) and np.isfinite(ts).all() and float(ts.min()) > NS_FLOOR and float(ts.max()) < 2**63:
        exact = np.array([int(e.ts) for e in xs], dtype=np.int64)   # ints beyond 2**53 stay exact
        clock = FileClock(origin_ns=int(exact.min()))
        ts = (exact - clock.origin_ns) / 1000.0
        dur = dur / 1000.0
    elif fmt == "kineto":
        clock = kineto_us_clock(ts, counter_ts(evs.counters))   # refuses what _check_times would
        ts = clock.us(ts)
    _check_times(ts, dur, evs, path)
    cols["ts"], cols["dur"] = ts, dur
    return clock


def counter_ts(counters: list[Any]) -> np.ndarray:
    """The finite ``ts`` of counter events (they may start before the first row)."""
    ts = float_column([e.ts for e in counters if type(e.ts) in (int, float)])
    return ts[np.isfinite(ts)]


def _interned(values: list[str], strings: StringTable) -> list[int]:
    table = {s: strings.intern(s) for s in dict.fromkeys(values)}
    return list(map(table.__getitem__, values))


#: the key of ``skipped`` that counts X events without a ``dur`` (not a phase)
NO_DURATION = "X without dur"
#: the key of ``skipped`` that counts X events with a negative ``dur`` (not a phase)
NEGATIVE_DURATION = "X with negative dur"


def durations(xs: list[Event], skipped: dict[str, int]) -> np.ndarray:
    """The ``dur`` column: an X event without one lasts 0 µs (as Chrome's viewer draws it), counted
    in ``skipped[NO_DURATION]`` so the reader says how many; so does one with a negative ``dur``,
    counted in ``skipped[NEGATIVE_DURATION]``: torch.profiler writes ``-1`` for a CPU event still
    running when the profile stopped (pytorch/pytorch#150131), and Kineto wrote negative ones from
    zero end times (pytorch/kineto#646), so real traces hold them; refused, the whole trace was."""
    dur = float_column([e.dur for e in xs])
    missing = np.isnan(dur)
    if missing.any():
        dur[missing] = 0.0
        skipped[NO_DURATION] = skipped.get(NO_DURATION, 0) + int(missing.sum())
    negative = np.isfinite(dur) & (dur < 0)            # -inf is damage, refused with the rest
    if negative.any():
        dur[negative] = 0.0
        skipped[NEGATIVE_DURATION] = skipped.get(NEGATIVE_DURATION, 0) + int(negative.sum())
    return dur


def _check_times(ts: np.ndarray, dur: np.ndarray, evs: Events, path: str) -> None:
    for col, what in ((ts, "timestamp (ts)"), (dur, "duration (dur)")):
        bad = ~np.isfinite(col) | (col < 0) | (col > MAX_TIME_US)
        if bad.any():
            k = int(np.argmax(bad))
            value = float(col[k])
            problem = "missing" if math.isnan(value) and col is ts else f"{value!r}"
            ev = evs.xs[k]
            raise TraceError(f"event #{evs.file_index(k)} ({ev.cat or 'no cat'} {ev.name!r}) has {problem} "
                             f"{what}; it must be a number of microseconds in [0, {MAX_TIME_US:.0e}]",
                             path=path, fix="the file is damaged or was not written by a trace exporter")


def _decode_batch(decoder: msgspec.json.Decoder, xs: list[Event], rows: list[int], evs: Events,
                  path: str) -> list[Any]:
    raws = [xs[r].args or _EMPTY for r in rows]
    try:
        return decoder.decode(b"[" + b",".join(raws) + b"]")
    except msgspec.ValidationError as exc:
        text = str(exc)
        where = text.rsplit(" - at `$[", 1)
        k, tail = (int(where[1].split("]", 1)[0]), where[1].split("]", 1)[1].rstrip("`")) \
            if len(where) == 2 else (0, "")
        ev = xs[rows[k]]
        index = evs.file_index(rows[k])
        raise TraceError(f"event #{index} ({ev.cat} {ev.name!r}): wrong type at `$.traceEvents[{index}].args"
                         f"{tail}`: {where[0]}", path=path,
                         fix="the file does not follow the Chrome/Kineto trace format") from None


def kineto_args(xs: list[KinetoEvent], cols: dict[str, np.ndarray]) -> A.RowArgs:
    """Columns from the inline-decoded args; the sparse args entries (materialised lazily)."""
    kinds = cols["kind"]
    for col, only in _KINETO_COLUMN_KINDS.items():   # each column from the categories Kineto writes it for
        getter = attrgetter("args." + col)
        if only is None:
            cols[col][:] = list(map(getter, xs))
            continue
        rows = np.nonzero(np.isin(kinds, only))[0]
        if len(rows):
            cols[col][rows] = list(map(getter, map(xs.__getitem__, rows.tolist())))
    gpu_side = np.nonzero(np.isin(kinds, FLOW_KINDS) & (cols["external_id"] < 0))[0]
    if len(gpu_side):                                  # torch 1.8-1.10: "external id"
        cols["external_id"][gpu_side] = list(map(attrgetter("args.external_id_v1"),
                                                 map(xs.__getitem__, gpu_side.tolist())))
    args = A.RowArgs(len(xs))
    launched = np.nonzero(np.isin(kinds, FLOW_KINDS))[0]          # kernels, runtime calls, memcpy, memset
    args.put(launched, list(map(attrgetter("args"), map(xs.__getitem__, launched.tolist()))))
    ops = np.nonzero(kinds == Kind.CPU_OP)[0].tolist()
    op_args = [xs[r].args for r in ops]
    with_shapes = list(map(_SHAPES, op_args))
    codes, shared = _shared_op_args(list(compress(op_args, with_shapes)))
    args.put(np.array(list(compress(ops, with_shapes)), dtype=np.int64), shared, codes)
    others = np.nonzero(kinds == Kind.OTHER)[0]
    if len(others):
        cats = [xs[r].cat for r in others.tolist()]
        distinct = list(dict.fromkeys(cats))
        code_of = {c: i for i, c in enumerate(distinct)}
        args.put(others, [A.CatArgs(c) for c in distinct], np.array([code_of[c] for c in cats], dtype=np.int64))
    return args


def _module_calls_are_regions(xs: list[Event], kind: np.ndarray, codes: np.ndarray, code: int) -> np.ndarray:
    """torch.profiler's module calls (``python_function`` rows named ``nn.Module: ...``, see
    ``schema``) become region rows, in place in ``kind``; the codes with theirs taken out of the
    counts of other events."""
    rows = np.nonzero(codes == code)[0]
    calls = rows[np.array([xs[r].name.startswith(MODULE_CALL_PREFIX) for r in rows.tolist()], dtype=bool)]
    kind[calls] = Kind.REGION
    codes = codes.copy()
    codes[calls] = -1
    return codes


def _shared_op_args(op_args: list[A.KinetoArgs]) -> tuple[np.ndarray, list[A.KinetoArgs]]:
    """Operator args (record_shapes rows) as a code per row into one shared struct per distinct
    (shapes, dtypes), holding copies of those bytes: a loop repeats the same ops, and the structs
    must not keep the file's (or a streamed chunk's) bytes alive. Every step runs in C (key bytes
    by ``map``, first row per key by ``dict.setdefault``), 2.5x faster than a Python loop."""
    if not op_args:
        return np.zeros(0, dtype=np.int64), []
    keys = map(b"\0".join, zip(map(_SHAPES, op_args), map(_DTYPES, op_args), strict=True))
    first_of_key: dict[bytes, int] = {}
    first_rows = np.fromiter(map(first_of_key.setdefault, keys, count()), dtype=np.int64, count=len(op_args))
    firsts, codes = np.unique(first_rows, return_inverse=True)      # codes in order of first appearance
    shared = [msgspec.structs.replace(a, shapes=copied_raw(a.shapes), dtypes=copied_raw(a.dtypes),
                                      external_id=-1, external_id_v1=-1, correlation=-1)
              for a in map(op_args.__getitem__, firsts.tolist())]
    return codes.astype(np.int64, copy=False), shared


def copied_raw(raw: msgspec.Raw) -> msgspec.Raw:
    return msgspec.Raw(bytes(raw)) if raw else raw


def _our_args(xs: list[Event], cols: dict[str, np.ndarray], evs: Events, path: str,
              strings: StringTable) -> tuple[dict[int, Any], np.ndarray, list[str | None], dict[int, int]]:
    """Our files: column keys in one typed pass (see ``_ours``), the rest raw until read."""
    rows = list(range(len(xs)))
    parsed = _decode_batch(_ours.DECODER, xs, rows, evs, path)

    def fail(r: int, problem: str) -> TraceError:
        return TraceError(f"event #{evs.file_index(r)} ({xs[r].cat} {xs[r].name!r}): {problem}", path=path,
                          fix="the file does not follow the cuvil-pgc trace schema (DESIGN.md)")

    return _ours.fill_columns(parsed, [e.args for e in xs], cols, strings, [e.cat for e in xs], fail)
