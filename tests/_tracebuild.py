"""Build columnar Traces from small lists of event dicts, for analyzer tests.

``build_trace(events)`` takes dicts with ``kind`` ("region", "op", "kernel", "runtime", "memcpy",
"compile" or a Kind), ``name``, ``ts``, ``dur`` and optionally ``tid``, ``pid``, ``path`` (regions),
``region`` (ops/kernels; derived from enclosing regions on the same thread when absent),
``flops``, ``bytes``, ``correlation``, ``source``, ``args``. Rows come out sorted by ``ts`` as the
reader produces them. ``sources`` gives the Source list (rank, weight, metadata); ``counters``
takes dicts with ``name``, ``ts``, ``value`` (and ``pid``, ``source``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil_pgc.trace.attribution import RegionIndex
from cuvil_pgc.trace.columns import COUNTER_COLUMNS, EVENT_COLUMNS, Source, StringTable, Trace
from cuvil_pgc.trace.schema import Kind

_KINDS = {"region": Kind.REGION, "op": Kind.CPU_OP, "kernel": Kind.KERNEL, "runtime": Kind.RUNTIME,
          "memcpy": Kind.MEMCPY, "memset": Kind.MEMSET, "compile": Kind.COMPILE, "other": Kind.OTHER}


def build_trace(events: list[dict[str, Any]], *, sources: list[Source] | None = None,
                counters: list[dict[str, Any]] | None = None, metadata: dict[str, Any] | None = None) -> Trace:
    events = sorted(events, key=lambda e: e["ts"])
    strings = StringTable()
    n = len(events)
    cols = {c: np.zeros(n, dtype=d) for c, d in EVENT_COLUMNS.items()}
    for c in ("region", "region_id", "parent_id", "correlation"):
        cols[c][:] = -1
    cols["flops"][:] = np.nan
    cols["bytes"][:] = np.nan
    args: dict[int, dict[str, Any]] = {}
    for i, e in enumerate(events):
        kind = e["kind"]
        kind = _KINDS[kind] if isinstance(kind, str) else Kind(kind)
        cols["kind"][i] = kind
        cols["name"][i] = strings.intern(e["name"])
        cols["ts"][i] = e["ts"]
        cols["dur"][i] = e.get("dur", 0.0)
        cols["pid"][i] = e.get("pid", 1)
        cols["tid"][i] = e.get("tid", 1)
        cols["source"][i] = e.get("source", 0)
        cols["correlation"][i] = e.get("correlation", -1)
        for c in ("flops", "bytes"):
            if e.get(c) is not None:
                cols[c][i] = e[c]
        if kind == Kind.REGION:
            path = e.get("path", e["name"])
            cols["region"][i] = strings.intern(path)
            cols["region_id"][i] = i + 1
        elif e.get("region") is not None:
            cols["region"][i] = strings.intern(e["region"])
        if e.get("args"):
            args[i] = dict(e["args"])
    _attribute_missing(events, cols)
    _link_parents(cols)
    return Trace(strings=strings, events=cols, counters=_counters(counters or [], strings), args=args,
                 sources=sources or [Source(path="<built>", format="cuvil", metadata=metadata or {})])


def _attribute_missing(events: list[dict[str, Any]], cols: dict[str, np.ndarray]) -> None:
    """Ops/kernels without an explicit region get the innermost enclosing region on their thread."""
    is_region = cols["kind"] == Kind.REGION
    need = np.array([("region" not in e) and not is_region[i] for i, e in enumerate(events)], dtype=bool)
    rows = np.nonzero(is_region)[0]
    if not need.any() or not len(rows):
        return
    idx = RegionIndex(cols["tid"][rows], cols["ts"][rows], cols["ts"][rows] + cols["dur"][rows])
    q = np.nonzero(need)[0]
    found = idx.innermost(cols["tid"][q], cols["ts"][q])
    ok = found >= 0
    cols["region"][q[ok]] = cols["region"][rows[found[ok]]]


def _link_parents(cols: dict[str, np.ndarray]) -> None:
    rows = np.nonzero(cols["kind"] == Kind.REGION)[0]
    if not len(rows):
        return
    idx = RegionIndex(cols["tid"][rows], cols["ts"][rows], cols["ts"][rows] + cols["dur"][rows])
    parent_sorted = idx.parent
    for k, p in enumerate(parent_sorted):
        if p >= 0:
            cols["parent_id"][rows[idx.order[k]]] = cols["region_id"][rows[idx.order[p]]]


def _counters(counters: list[dict[str, Any]], strings: StringTable) -> dict[str, np.ndarray]:
    n = len(counters)
    cols = {c: np.zeros(n, dtype=d) for c, d in COUNTER_COLUMNS.items()}
    for i, c in enumerate(sorted(counters, key=lambda c: c["ts"])):
        cols["name"][i] = strings.intern(c["name"])
        cols["ts"][i] = c["ts"]
        cols["value"][i] = c["value"]
        cols["pid"][i] = c.get("pid", 1)
        cols["source"][i] = c.get("source", 0)
    return cols


def region(path: str, ts: float, dur: float, **kw: Any) -> dict[str, Any]:
    return {"kind": "region", "name": path.rsplit("/", 1)[-1], "path": path, "ts": ts, "dur": dur, **kw}


def op(name: str, ts: float, dur: float, **kw: Any) -> dict[str, Any]:
    return {"kind": "op", "name": name, "ts": ts, "dur": dur, **kw}


def kernel(name: str, ts: float, dur: float, **kw: Any) -> dict[str, Any]:
    kw.setdefault("pid", 0)
    kw.setdefault("tid", 7)
    return {"kind": "kernel", "name": name, "ts": ts, "dur": dur, **kw}


def op_chain(names: list[str], start: float, dur: float, gap: float, **kw: Any) -> list[dict[str, Any]]:
    """Consecutive top-level ops, each ``dur`` long, ``gap`` apart."""
    return [op(n, start + i * (dur + gap), dur, **kw) for i, n in enumerate(names)]
