"""The events of a trace file that are not rows: flow links, counter series, thread and process
names; and the pid/tid columns (string ids included), which rows and these share.

- :func:`link_flows`: ``ac2g`` (and torch 1.8-1.10's ``async``/``launch``) flows give correlation
  ids where an event's args lack one; ``fwdbwd`` flows give the ``fwdbwd`` column (see ``_build``).
- :func:`counter_columns`: one counter row per numeric value of a ``ph: "C"`` event.
- :func:`add_names`: ``thread_name`` / ``process_name`` metadata events.
- :func:`id_column`: ints as they are; strings as ``-2 - strings.intern(s)`` (numeric strings as ints).
"""

from __future__ import annotations

import math
from typing import Any

import msgspec
import numpy as np

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import _args as A
from cuvil_pgc.trace._clock import FileClock
from cuvil_pgc.trace.columns import StringTable
from cuvil_pgc.trace.schema import MAX_TIME_US, Kind

_EMPTY = msgspec.Raw(b"{}")
_DICTS = msgspec.json.Decoder(list[dict[str, Any]])
#: the kinds Kineto links to their launch by a correlation id
FLOW_KINDS = np.array([Kind.RUNTIME, Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], dtype=np.uint8)


def id_column(values: list[Any], strings: StringTable) -> np.ndarray:
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


def link_flows(cols: dict[str, np.ndarray], evs: Any, strings: StringTable, clock: FileClock) -> None:
    """Links from flow events, matched to X rows on (pid, tid, ts) (see module docstring); ``clock``
    converts the flow points as it converted the rows."""
    if not evs.flows:
        return
    launch = [f for f in evs.flows if type(f.id) is int and (f.cat == "ac2g" or (
        f.cat.lower() == "async" and f.name == "launch"))]
    need = np.nonzero((cols["correlation"] < 0) & np.isin(cols["kind"], FLOW_KINDS))[0]
    if launch and len(need):
        _link(cols, need, launch, "correlation", strings, clock)
    fwdbwd = [f for f in evs.flows if f.cat == "fwdbwd" and type(f.id) is int]
    ops = np.nonzero(cols["kind"] == Kind.CPU_OP)[0]
    if fwdbwd and len(ops):
        _link(cols, ops, fwdbwd, "fwdbwd", strings, clock)


def _link(cols: dict[str, np.ndarray], rows: np.ndarray, flows: list[Any], col: str, strings: StringTable,
          clock: FileClock) -> None:
    """Set ``cols[col][r]`` to the id of the flow event at row r's (pid, tid, ts); where several rows
    start at one flow point (nested ops), the longest (outermost) gets it."""
    key = np.dtype([("pid", np.int64), ("tid", np.int64), ("ts", np.float64)])
    flow_keys = np.empty(len(flows), dtype=key)
    flow_keys["pid"] = id_column([f.pid for f in flows], strings)
    flow_keys["tid"] = id_column([f.tid for f in flows], strings)
    flow_keys["ts"] = clock.us([f.ts for f in flows])      # the same conversion as the rows'
    ids = np.array([f.id for f in flows], dtype=np.int64)
    order = np.argsort(flow_keys, kind="stable")
    flow_keys, ids = flow_keys[order], ids[order]
    row_keys = np.empty(len(rows), dtype=key)
    row_keys["pid"], row_keys["tid"], row_keys["ts"] = cols["pid"][rows], cols["tid"][rows], cols["ts"][rows]
    pos = np.minimum(np.searchsorted(flow_keys, row_keys), len(flow_keys) - 1)
    hit = np.nonzero(flow_keys[pos] == row_keys)[0]
    if not len(hit):
        return
    by_point = hit[np.lexsort((-cols["dur"][rows[hit]], pos[hit]))]
    first = np.ones(len(by_point), dtype=bool)
    first[1:] = pos[by_point[1:]] != pos[by_point[:-1]]
    chosen = by_point[first]
    cols[col][rows[chosen]] = ids[pos[chosen]]


def counter_columns(evs: Any, strings: StringTable, path: str, clock: FileClock | None = None) -> dict[str, np.ndarray]:
    """Counter rows of ``evs.counters`` (see ``_build``'s docstring: one per numeric value), as columns."""
    names: list[int] = []
    clock = clock or FileClock()
    ts: list[int | float] = []
    values: list[float] = []
    pids: list[Any] = []
    try:
        dicts = _DICTS.decode(b"[" + b",".join(e.args or _EMPTY for e in evs.counters) + b"]")
    except msgspec.ValidationError as exc:
        raise TraceError(f"a counter event's args are not an object ({exc})", path=path,
                         fix='counter events carry {"series": number, ...} in args') from None
    for k, (e, d) in enumerate(zip(evs.counters, dicts, strict=True)):
        if not 0 <= e.ts <= (MAX_TIME_US if clock.origin_ns is None else 2**63 - 1):
            raise TraceError(f"counter event #{evs.file_index(k, 'C')} ({e.name!r}) has timestamp {e.ts!r}; "
                             f"it must be a number of microseconds in [0, {MAX_TIME_US:.0e}]", path=path)
        t = e.ts
        for key, value in d.items():
            if type(value) not in (int, float) or not math.isfinite(value):
                continue
            label = e.name if key in ("value", e.name) else f"{e.name}.{key}"
            names.append(strings.intern(label))
            ts.append(t)
            values.append(float(value))
            pids.append(e.pid)
    return {"name": np.array(names, dtype=np.int32), "ts": clock.us(ts) if ts else np.zeros(0),
            "value": np.array(values, dtype=np.float64), "pid": id_column(pids, strings)}


def add_names(meta: list[Any], strings: StringTable) -> tuple[list[list[Any]], list[list[Any]]]:
    """``(thread_names, process_names)`` from ``M`` events: ``[pid, tid, name]`` and ``[pid, name]``."""
    threads: list[list[Any]] = []
    processes: list[list[Any]] = []
    for e in meta:
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
        pid = int(id_column([e.pid], strings)[0])
        if e.name == "thread_name":
            threads.append([pid, int(id_column([e.tid], strings)[0]), label])
        else:
            processes.append([pid, label])
    return threads, processes
