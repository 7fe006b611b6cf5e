"""The per-operator table (torch.profiler's ``key_averages().table()``), for any loaded Trace.

:func:`operator_stats` groups the trace's operators by name (and, with ``group_by_shape``, by
input shapes) and returns, per group: calls, self and total CPU time, device time (kernels,
memcpys and memsets launched from inside the operator, found through the launch's correlation
id: self for the innermost operator, total for it and every operator enclosing it), and FLOPs and
bytes where the trace knows them. ``region`` keeps only operators inside that region (its path,
or the path as tables print it, and everything under it). Pure data: renderers live in
``viewer``.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from cuvil_pgc.analyze._prepare import lane_keys, lane_time_order
from cuvil_pgc.analyze.passes import requires
from cuvil_pgc.errors import ConfigError
from cuvil_pgc.trace.attribution import RegionIndex, enclosing_parents
from cuvil_pgc.trace.columns import Trace
from cuvil_pgc.trace.schema import Kind, display_path

SORT_KEYS = {"self_cpu": "self_cpu_us", "total_cpu": "total_cpu_us", "self_device": "self_device_us",
             "device": "device_us", "calls": "calls"}
DEVICE_KINDS = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
ANALYSIS_ROWS = 50        # operators kept in the Analysis (the report's table)


@dataclass
class OperatorStats:
    """One row of the operator table (times in µs; flops / bytes None when unknown)."""

    name: str
    shapes: str | None
    calls: int
    self_cpu_us: float
    total_cpu_us: float
    self_device_us: float
    device_us: float
    flops: float | None
    bytes: float | None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def operator_stats(trace: Trace, *, sort: str = "self_cpu", group_by_shape: bool = False,
                   region: str | None = None) -> list[OperatorStats]:
    """Operators of ``trace`` grouped and sorted (descending by ``sort``, one of SORT_KEYS).

    Nesting is per thread of one file (source, pid, tid), and a kernel belongs to the launch with
    its correlation id in its own file: ranks and processes never mix.
    """
    if sort not in SORT_KEYS:
        raise ConfigError(f"--sort {sort!r} is not one of {', '.join(SORT_KEYS)}")
    ev = trace.events
    ops = np.nonzero(ev["kind"] == Kind.CPU_OP)[0]
    if not len(ops):
        return []
    lane = lane_keys(trace)
    parent = _parents(lane[ops], ev["ts"][ops], ev["dur"][ops])
    alive, parent, into = _merge_same_name(ev["name"][ops], parent)
    self_cpu = _self_cpu(ev["dur"][ops], parent, alive)
    self_dev = np.bincount(into, weights=_device_self(trace, ops, lane), minlength=len(ops))
    total_dev = _propagate(self_dev, parent)
    keep = np.nonzero(alive & _in_region(trace, ops, region))[0] if region else np.nonzero(alive)[0]
    rows = ops[keep]
    key = ev["name"][rows].astype(np.int64)
    shape_text: list[str | None] = []
    if group_by_shape:
        shape_code, shape_text = _shape_codes(trace, rows)
        key = key * (len(shape_text) + 1) + shape_code
    uniq, first, inv = np.unique(key, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    g = len(uniq)

    def per_group(values: np.ndarray) -> np.ndarray:
        return np.bincount(inv, weights=values, minlength=g)

    calls = np.bincount(inv, minlength=g)
    sums = [per_group(x) for x in (self_cpu[keep], ev["dur"][rows], self_dev[keep], total_dev[keep])]
    known = []
    for col in ("flops", "bytes"):
        v = ev[col][rows]
        ok = ~np.isnan(v)
        total = per_group(np.where(ok, v, 0.0))
        known.append(np.where(np.bincount(inv[ok], minlength=g) > 0, total, np.nan))
    names = trace.strings.strings
    out = []
    for j in np.argsort(first, kind="stable").tolist():     # groups in order of first appearance
        name_id = int(uniq[j]) // (len(shape_text) + 1) if group_by_shape else int(uniq[j])
        shapes = shape_text[int(uniq[j]) % (len(shape_text) + 1) - 1] if group_by_shape else None
        out.append(OperatorStats(names[name_id], shapes, int(calls[j]), *(float(x[j]) for x in sums),
                                 _known(float(known[0][j])), _known(float(known[1][j]))))
    attr = SORT_KEYS[sort]
    out.sort(key=lambda r: (-getattr(r, attr), r.name))
    return out


@requires()
def operator_table(prep: Any, analysis: Any) -> None:
    """Analyzer pass: the top operators by self CPU time into ``analysis.operators``."""
    analysis.operators = [r.to_json() for r in operator_stats(prep.trace)[:ANALYSIS_ROWS]]


def has_device_time(rows: list[OperatorStats]) -> bool:
    return any(r.device_us > 0 for r in rows)


def _parents(lanes: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Each op's enclosing op on its lane (-1: none)."""
    order = lane_time_order(lanes, ts, dur)
    p_sorted = enclosing_parents(lanes[order], ts[order], (ts + dur)[order])
    parent = np.full(len(ts), -1, dtype=np.int64)
    parent[order] = np.where(p_sorted >= 0, order[np.maximum(p_sorted, 0)], -1)
    return parent


def _merge_same_name(names: np.ndarray, parent: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """torch.profiler's merge of an op into its parent of the same name when it is the parent's
    only child (``aten::div_`` inside ``aten::div_``, as ``mean`` calls it): one call, not two, and
    its time not counted twice in the total (``EventList._remove_dup_nodes``, which
    ``key_averages`` tables). Returns (which ops remain, parents among them, and the op each one
    was merged into: itself where it remains)."""
    n = len(names)
    parent, alive, into = parent.copy(), np.ones(n, dtype=bool), np.arange(n)
    while True:
        has = (parent >= 0) & alive
        up = np.maximum(parent, 0)
        children = np.bincount(parent[has], minlength=n)
        dup = has & (names == names[up]) & (children[up] == 1)
        dup &= ~dup[up]                 # a chain merges one level per round, from the top
        if not dup.any():
            break
        moved = (parent >= 0) & dup[up]                 # the merged ops' children join their parent
        parent[moved] = parent[parent[moved]]
        into[dup] = parent[dup]
        alive[dup] = False
        parent[dup] = -1
    while not np.array_equal(into, into[into]):          # merged into a parent merged later
        into = into[into]
    return alive, parent, into


def _self_cpu(dur: np.ndarray, parent: np.ndarray, alive: np.ndarray) -> np.ndarray:
    """Self time of each op: its duration minus its (remaining) direct children's."""
    child = (parent >= 0) & alive
    self_t = dur.astype(np.float64) - np.bincount(parent[child], weights=dur[child], minlength=len(dur))
    return np.maximum(self_t, 0.0)


def _device_self(trace: Trace, ops: np.ndarray, lane: np.ndarray) -> np.ndarray:
    """Device time of the kernels each op launched itself: the kernel's runtime call has its
    correlation id in the same source, and the innermost op around that call on its lane owns it."""
    ev = trace.events
    out = np.zeros(len(ops), dtype=np.float64)
    dev = np.nonzero(np.isin(ev["kind"], DEVICE_KINDS) & (ev["correlation"] >= 0))[0]
    runtime = np.nonzero((ev["kind"] == Kind.RUNTIME) & (ev["correlation"] >= 0))[0]
    if not len(dev) or not len(runtime):
        return out
    key_rt = _source_key(ev, runtime)
    order = np.argsort(key_rt, kind="stable")
    sorted_keys = key_rt[order]
    want = _source_key(ev, dev)
    k = np.searchsorted(sorted_keys, want, side="right") - 1      # the last call with that id
    hit = k >= 0
    hit[hit] = sorted_keys[k[hit]] == want[hit]
    if not hit.any():
        return out
    kernels, launches = dev[hit], runtime[order[k[hit]]]
    index = RegionIndex(lane[ops], ev["ts"][ops], ev["ts"][ops] + ev["dur"][ops])
    owner = index.innermost(lane[launches], ev["ts"][launches])
    found = owner >= 0
    out += np.bincount(owner[found], weights=ev["dur"][kernels][found], minlength=len(ops))
    return out


def _source_key(ev: dict[str, np.ndarray], rows: np.ndarray) -> np.ndarray:
    """(source, correlation) as one int64 (correlation ids restart in every file)."""
    return ev["source"][rows].astype(np.int64) << 48 | (ev["correlation"][rows].astype(np.int64) & (2**48 - 1))


def _propagate(self_dev: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each op's device time plus that of every op nested in it (each level climbs at once)."""
    total = self_dev.copy()
    rows = np.nonzero(self_dev > 0)[0]
    value, up = self_dev[rows], parent[rows]
    while len(up):
        ok = up >= 0
        value, up = value[ok], up[ok]
        total += np.bincount(up, weights=value, minlength=len(total))
        up = parent[up]
    return total


def _in_region(trace: Trace, ops: np.ndarray, region: str) -> np.ndarray:
    regions = trace.events["region"][ops]
    wanted = {}
    for code in np.unique(regions).tolist():
        path = trace.string(int(code))
        if path is None:
            continue
        for form in (path, display_path(path)):
            # the path, a head of it, or components inside it (torch.profiler's BertLayer_0), or a dotted child
            if f"/{region}/" in f"/{form}/" or re.fullmatch(re.escape(region) + r"[/.].*", form):
                wanted[code] = True
    if not wanted:
        raise ConfigError(f"no operators inside region {region!r}",
                          fix="give a path as `cuvil-pgc summary` prints it, e.g. model.layer1, or one component of it")
    return np.isin(regions, list(wanted))


def _shape_codes(trace: Trace, rows: np.ndarray) -> tuple[np.ndarray, list[str | None]]:
    """Per row: 1 + index of its input shapes in the returned list (the shapes as tables print them)."""
    texts: dict[str | None, int] = {}
    codes = np.empty(len(rows), dtype=np.int64)
    for i, row in enumerate(rows.tolist()):
        codes[i] = texts.setdefault(_shapes(trace, row), len(texts)) + 1
    return codes, list(texts)


def _shapes(trace: Trace, row: int) -> str | None:
    args = trace.args.get(row) if trace.args is not None else None
    shapes = args.get("shapes") if args else None
    if not shapes:
        return None
    return ", ".join("[" + ", ".join(str(d) for d in s) + "]" if isinstance(s, list) else str(s) for s in shapes)


def _known(x: float) -> float | None:
    return None if math.isnan(x) else x
