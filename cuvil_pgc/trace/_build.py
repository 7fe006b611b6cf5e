"""Typed events of one file → columns of one source (before merging and sorting).

Contract: ``build_source(doc, fmt, strings, path)`` turns the complete (``ph: "X"``) events into
row columns (EVENT_COLUMNS plus ``external_id`` and ``lane``), the ``ph: "C"`` events into counter
rows, ``M`` events into thread/process names, and ``ac2g`` flows into correlation ids where an
event's args lack one. Times stay in the file's own units and origin; the reader aligns sources.
Region paths, ids and attribution are filled in by :mod:`cuvil_pgc.trace._regions`.

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
from itertools import compress
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import _args as A
from cuvil_pgc.trace import _ours, _region_tree
from cuvil_pgc.trace._decode import Document, Event, KinetoDocument, KinetoEvent
from cuvil_pgc.trace.columns import StringTable
from cuvil_pgc.trace.schema import CAT_TO_KIND, Kind

_EMPTY = msgspec.Raw(b"{}")
_KINETO_KIND = dict(CAT_TO_KIND)
_KINETO_KIND.pop("region")                       # only our files write cat "region"
_OURS_KIND = dict(CAT_TO_KIND)
_OURS_KIND.pop("user_annotation")                # our files' regions are cat "region"
_DICTS = msgspec.json.Decoder(list[dict[str, Any]])
_COLUMN_KEYS = ("correlation", "flops", "bytes", "external_id")
_SHAPES = attrgetter("shapes")
_KINETO_COLUMN_KINDS = {
    "external_id": None,
    "flops": np.array([Kind.CPU_OP], dtype=np.uint8),
    "bytes": np.array([Kind.MEMCPY, Kind.MEMSET], dtype=np.uint8),
    "correlation": np.array([Kind.RUNTIME, Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], dtype=np.uint8),
}
#: Largest ts / dur accepted (µs; about year 5100 as Unix time): beyond it a file is damaged.
MAX_TIME_US = 1e17


@dataclass
class SourceColumns:
    """Rows and counters of one file, in file order, on the file's clock."""

    cols: dict[str, np.ndarray]
    args: dict[int, Any]                         # row → dict or typed args struct
    region_path: list[str | None] | None         # ours: args.path of region rows (None elsewhere)
    region_given: np.ndarray                     # bool: the file named this row's region
    counters: dict[str, np.ndarray]
    thread_names: list[list[Any]] = field(default_factory=list)
    process_names: list[list[Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class _Events:
    """Events of a document split by phase (``X`` rows, counters, metadata, flows, the rest counted)."""

    def __init__(self, events: list[Event] | list[KinetoEvent]) -> None:
        self.all = events
        self.xs = [e for e in events if e.ph == "X"]
        self.counters: list[Any] = []
        self.meta: list[Any] = []
        self.flows: list[Any] = []
        self.skipped: dict[str, int] = {}
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
            if e.ph == ph:
                seen += 1
                if seen == k:
                    return i
        return -1


def build_source(doc: Document | KinetoDocument, fmt: str, strings: StringTable, path: str,
                 raw_events: Callable[[], list[Event]] | None = None) -> SourceColumns:
    """Columns of one decoded file (see module docstring).

    ``raw_events``: decodes the file again with raw args; called only when a KinetoDocument
    (whose inline-typed args do not keep counter series) has counter events.
    """
    evs = _Events(doc.trace_events)
    if evs.counters and raw_events is not None and isinstance(doc, KinetoDocument):
        evs.counters = [e for e in raw_events() if e.ph == "C"]
    xs = evs.xs
    cols = _basic_columns(xs, fmt, strings)
    _check_times(cols["ts"], cols["dur"], evs, path)
    if fmt == "kineto":
        args, given, paths = _kineto_args(xs, cols), np.zeros(len(xs), bool), None
    else:
        args, given, paths = _our_args(xs, cols, evs, path, strings)
        tree_notes = _region_tree.fill_paths(cols, paths, evs.meta, strings)   # schema 2: paths from ids
    _flow_correlations(cols, evs)
    src = SourceColumns(cols=cols, args=args, region_path=paths, region_given=given,
                        counters=_counters(evs, strings, path))
    _names(evs, src, strings)
    if fmt != "kineto":
        src.notes.extend(tree_notes)
    if evs.skipped:
        src.notes.append("ignored events of phase " + ", ".join(
            f"{ph or '(none)'!r} x{n}" for ph, n in sorted(evs.skipped.items())))
    return src


def _basic_columns(xs: list[Event], fmt: str, strings: StringTable) -> dict[str, np.ndarray]:
    n = len(xs)
    kinds_of = _KINETO_KIND if fmt == "kineto" else _OURS_KIND
    other = int(Kind.OTHER)
    cats = [e.cat for e in xs]
    cat_kind = {c: kinds_of.get(c, other) for c in dict.fromkeys(cats)}
    cols = {
        "kind": np.array(list(map(cat_kind.__getitem__, cats)), dtype=np.uint8),
        "name": np.array(_interned([e.name for e in xs], strings), dtype=np.int32),
        "ts": np.array([e.ts for e in xs], dtype=np.float64),
        "dur": np.array([e.dur for e in xs], dtype=np.float64),
        "pid": _ids([e.pid for e in xs], strings),
        "tid": _ids([e.tid for e in xs], strings),
    }
    for col in ("region", "region_id", "parent_id", "correlation", "external_id"):
        cols[col] = np.full(n, -1, dtype=np.int32 if col == "region" else np.int64)
    cols["flops"] = np.full(n, np.nan)
    cols["bytes"] = np.full(n, np.nan)
    return cols


def _interned(values: list[str], strings: StringTable) -> list[int]:
    table = {s: strings.intern(s) for s in dict.fromkeys(values)}
    return list(map(table.__getitem__, values))


def _ids(values: list[Any], strings: StringTable) -> np.ndarray:
    """pid/tid column: ints as they are, strings as -2 - interned index (numeric strings as ints)."""
    if not values:
        return np.zeros(0, dtype=np.int64)
    if set(map(type, values)) == {int}:
        return np.array(values, dtype=np.int64)
    table: dict[Any, int] = {}
    for v in dict.fromkeys(values):
        if type(v) is int:
            table[v] = v
        else:
            table[v] = int(v) if v.isascii() and v.isdigit() and len(v) < 19 else -2 - strings.intern(v)
    return np.array([table[v] for v in values], dtype=np.int64)


def _check_times(ts: np.ndarray, dur: np.ndarray, evs: _Events, path: str) -> None:
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


def _decode_batch(decoder: msgspec.json.Decoder, xs: list[Event], rows: list[int], evs: _Events,
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


def _kineto_args(xs: list[KinetoEvent], cols: dict[str, np.ndarray]) -> dict[int, Any]:
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
    args: dict[int, Any] = {}
    for kind in (Kind.KERNEL, Kind.RUNTIME, Kind.MEMCPY, Kind.MEMSET):
        rows = np.nonzero(kinds == kind)[0].tolist()
        args.update((r, xs[r].args) for r in rows)
    ops = np.nonzero(kinds == Kind.CPU_OP)[0].tolist()
    op_args = [xs[r].args for r in ops]
    args.update(compress(zip(ops, op_args, strict=True), map(_SHAPES, op_args)))   # record_shapes rows
    others = np.nonzero(kinds == Kind.OTHER)[0].tolist()
    if others:
        by_cat: dict[str, A.CatArgs] = {}
        for r in others:
            cat = xs[r].cat
            args[r] = by_cat.get(cat) or by_cat.setdefault(cat, A.CatArgs(cat))
    return args


def _our_args(xs: list[Event], cols: dict[str, np.ndarray], evs: _Events, path: str,
              strings: StringTable) -> tuple[dict[int, Any], np.ndarray, list[str | None]]:
    """Our files: column keys in one typed pass (see ``_ours``), the rest raw until read."""
    rows = list(range(len(xs)))
    parsed = _decode_batch(_ours.DECODER, xs, rows, evs, path)

    def fail(r: int, problem: str) -> TraceError:
        return TraceError(f"event #{evs.file_index(r)} ({xs[r].cat} {xs[r].name!r}): {problem}", path=path,
                          fix="the file does not follow the cuvil-pgc trace schema (DESIGN.md)")

    return _ours.fill_columns(parsed, [e.args for e in xs], cols, strings, [e.cat for e in xs], fail)


def _flow_correlations(cols: dict[str, np.ndarray], evs: _Events) -> None:
    """Fill missing correlation ids of launches and GPU work from ``ac2g`` flow events."""
    if not evs.flows:
        return
    need = np.nonzero((cols["correlation"] < 0) & np.isin(cols["kind"], _FLOW_KINDS))[0]
    if not len(need):
        return
    ends: dict[tuple[Any, Any, float], int] = {}
    for f in evs.flows:
        if f.cat == "ac2g" and type(f.id) is int:
            ends[(f.pid, f.tid, f.ts)] = f.id
    for r in need.tolist():
        ev = evs.xs[r]
        flow = ends.get((ev.pid, ev.tid, ev.ts))
        if flow is not None:
            cols["correlation"][r] = flow


_FLOW_KINDS = np.array([Kind.RUNTIME, Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], dtype=np.uint8)


def _counters(evs: _Events, strings: StringTable, path: str) -> dict[str, np.ndarray]:
    names: list[int] = []
    ts: list[float] = []
    values: list[float] = []
    pids: list[Any] = []
    try:
        dicts = _DICTS.decode(b"[" + b",".join(e.args or _EMPTY for e in evs.counters) + b"]")
    except msgspec.ValidationError as exc:
        raise TraceError(f"a counter event's args are not an object ({exc})", path=path,
                         fix='counter events carry {"series": number, ...} in args') from None
    for k, (e, d) in enumerate(zip(evs.counters, dicts, strict=True)):
        if not 0 <= e.ts <= MAX_TIME_US:
            raise TraceError(f"counter event #{evs.file_index(k, 'C')} ({e.name!r}) has timestamp {e.ts!r}; "
                             f"it must be a number of microseconds in [0, {MAX_TIME_US:.0e}]", path=path)
        for key, value in d.items():
            if type(value) not in (int, float) or not math.isfinite(value):
                continue
            label = e.name if key in ("value", e.name) else f"{e.name}.{key}"
            names.append(strings.intern(label))
            ts.append(e.ts)
            values.append(float(value))
            pids.append(e.pid)
    return {"name": np.array(names, dtype=np.int32), "ts": np.array(ts, dtype=np.float64),
            "value": np.array(values, dtype=np.float64), "pid": _ids(pids, strings)}


def _names(evs: _Events, src: SourceColumns, strings: StringTable) -> None:
    for e in evs.meta:
        if e.name not in ("thread_name", "process_name"):
            continue
        if isinstance(e.args, A.KinetoArgs):
            label = e.args.name
        else:
            try:
                value = msgspec.json.decode(e.args) if e.args else None
            except msgspec.DecodeError:
                continue
            label = value.get("name") if isinstance(value, dict) else None
        if not isinstance(label, str):
            continue
        pid = int(_ids([e.pid], strings)[0])
        if e.name == "thread_name":
            src.thread_names.append([pid, int(_ids([e.tid], strings)[0]), label])
        else:
            src.process_names.append([pid, label])
