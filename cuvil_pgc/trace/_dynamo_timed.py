"""torch.compile's own events in a torch.profiler trace, read as compile rows.

A model compiled inside a ``torch.profiler`` window leaves the compiler's work in the trace as
``cpu_op`` ranges: each block ``dynamo_timed`` times as ``"<key> (dynamo_timed)"`` (the frame's
``_compile.compile_inner``, ``bytecode_tracing``, ``GraphLowering.run`` ...), a range named after
the phase around it (``dynamo``, ``entire_frame_compile``, ``backend_compile``) that carries a
``user_annotation`` ``"<phase>_data: ..., compile_id=0/0"``, and the ATen ops the compiler runs on
fake tensors. Read as they are, these were the trace's hottest "operators" and dozens of tiny
"regions", and the compile summary said no compile was recorded.

:func:`compile_rows` turns the timed blocks into compile rows (``Kind.COMPILE`` with args
``{"compile_id", "phase"}``, the phases of :mod:`~cuvil_pgc.trace.compile_phases`),
which the compile summary reads like the compile sampler's, and everything else inside the
compiler's ranges (the phase ranges, their ``_data`` annotations, the fake-tensor ops) into other
rows, which no region or operator table counts.
"""

from __future__ import annotations

import re

import numpy as np

from cuvil_pgc.trace._regions import lanes
from cuvil_pgc.trace.attribution import RegionIndex
from cuvil_pgc.trace.columns import StringTable
from cuvil_pgc.trace.compile_phases import phase_of
from cuvil_pgc.trace.schema import Kind

TIMED_SUFFIX = " (dynamo_timed)"
_DATA = re.compile(r"^(\S+)_data: ")
_COMPILE_ID = re.compile(r"\bcompile_id=([^,\s]+)")


def compile_rows(src: object, strings: StringTable) -> None:
    """Rewrite one Kineto source's compiler rows in place (see the module docstring)."""
    cols = src.cols
    kind, name = cols["kind"], cols["name"]
    host = np.nonzero(np.isin(kind, (Kind.CPU_OP, Kind.REGION)))[0]
    if not len(host):
        return
    texts = {int(u): strings[int(u)] for u in np.unique(name[host])}
    timed_ids = [u for u, t in texts.items() if t.endswith(TIMED_SUFFIX)]
    data_ids = {u: m.group(1) for u, t in texts.items() if (m := _DATA.match(t)) is not None}
    if not timed_ids and not data_ids:
        return
    ts, end = cols["ts"], cols["ts"] + cols["dur"]
    lane = lanes(cols["pid"], cols["tid"])
    timed = host[np.isin(name[host], timed_ids)]
    data = host[np.isin(name[host], list(data_ids))]
    # the phase ranges: an op with a "<its name>_data" annotation starting inside it
    marker_ids = [u for u, t in texts.items() if t in set(data_ids.values())]
    candidates = host[np.isin(name[host], marker_ids)]
    markers = candidates[_holds_its_data(candidates, data, name, data_ids, texts, lane, ts, end)]
    windows = np.union1d(markers, timed[[phase_of(texts[int(name[r])][:-len(TIMED_SUFFIX)]) == "frame"
                                         for r in timed.tolist()]]) if len(timed) else markers
    cids = _window_ids(windows, data, strings, name, lane, ts, end)
    inside = np.zeros(len(kind), dtype=bool)
    owner = np.full(len(kind), -1, dtype=np.int64)
    if len(windows):
        index = RegionIndex(lane[windows], ts[windows], end[windows])
        found = index.innermost(lane[host], ts[host])
        inside[host[found >= 0]] = True
        owner[host] = found
    kind[host[inside[host]]] = Kind.OTHER
    kind[data] = Kind.OTHER
    for r in timed.tolist():
        key = texts[int(name[r])][:-len(TIMED_SUFFIX)]
        kind[r] = Kind.COMPILE
        name[r] = strings.intern(key)
        cid = cids[owner[r]] if owner[r] >= 0 else None
        src.args[r] = {"compile_id": cid, "phase": phase_of(key) or "other", "cache": None, "reason": None}


def _holds_its_data(candidates: np.ndarray, data: np.ndarray, name: np.ndarray, data_ids: dict[int, str],
                    texts: dict[int, str], lane: np.ndarray, ts: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per candidate op: whether an annotation ``"<its name>_data: ..."`` starts inside it."""
    out = np.zeros(len(candidates), dtype=bool)
    if not len(candidates) or not len(data):
        return out
    for j, r in enumerate(candidates.tolist()):
        own = texts[int(name[r])]
        near = data[(lane[data] == lane[r]) & (ts[data] >= ts[r]) & (ts[data] < end[r])]
        out[j] = any(data_ids[int(name[d])] == own for d in near.tolist())
    return out


def _window_ids(windows: np.ndarray, data: np.ndarray, strings: StringTable, name: np.ndarray,
                lane: np.ndarray, ts: np.ndarray, end: np.ndarray) -> list[str | None]:
    """Per window: the compile id of the first ``_data`` annotation directly in it, else of the
    window around it."""
    cids: list[str | None] = [None] * len(windows)
    if not len(windows):
        return cids
    index = RegionIndex(lane[windows], ts[windows], end[windows])
    if len(data):
        holder = index.innermost(lane[data], ts[data])
        for d, w in zip(data.tolist(), holder.tolist(), strict=True):
            m = _COMPILE_ID.search(strings[int(name[d])])
            if w >= 0 and cids[w] is None and m is not None:
                cids[w] = m.group(1)
    for j in range(len(index.order)):         # outer windows first: inner ones without an id inherit
        p = index.parent[j]
        w = int(index.order[j])
        if cids[w] is None and p >= 0:
            cids[w] = cids[int(index.order[p])]
    return cids
