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

from cuvil_pgc.analyze.passes import requires
from cuvil_pgc.errors import ConfigError
from cuvil_pgc.trace.attribution import RegionIndex
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
    """Operators of ``trace`` grouped and sorted (descending by ``sort``, one of SORT_KEYS)."""
    if sort not in SORT_KEYS:
        raise ConfigError(f"--sort {sort!r} is not one of {', '.join(SORT_KEYS)}")
    ev = trace.events
    ops = np.nonzero(ev["kind"] == Kind.CPU_OP)[0]
    if not len(ops):
        return []
    self_cpu, parent = _self_times(ev["tid"][ops], ev["ts"][ops], ev["dur"][ops])
    self_dev = _device_self(trace, ops)
    total_dev = _propagate(self_dev, parent)
    keep = _in_region(trace, ops, region) if region else np.ones(len(ops), dtype=bool)
    groups: dict[tuple[str, str | None], list[float]] = {}
    names = ev["name"][ops]
    for i in np.nonzero(keep)[0].tolist():
        row = int(ops[i])
        key = (trace.strings[int(names[i])], _shapes(trace, row) if group_by_shape else None)
        acc = groups.setdefault(key, [0, 0.0, 0.0, 0.0, 0.0, math.nan, math.nan])
        acc[0] += 1
        acc[1] += float(self_cpu[i])
        acc[2] += float(ev["dur"][row])
        acc[3] += float(self_dev[i])
        acc[4] += float(total_dev[i])
        acc[5] = _nan_add(acc[5], float(ev["flops"][row]))
        acc[6] = _nan_add(acc[6], float(ev["bytes"][row]))
    rows = [OperatorStats(name, shapes, int(a[0]), a[1], a[2], a[3], a[4], _known(a[5]), _known(a[6]))
            for (name, shapes), a in groups.items()]
    attr = SORT_KEYS[sort]
    rows.sort(key=lambda r: (-getattr(r, attr), r.name))
    return rows


@requires()
def operator_table(prep: Any, analysis: Any) -> None:
    """Analyzer pass: the top operators by self CPU time into ``analysis.operators``."""
    analysis.operators = [r.to_json() for r in operator_stats(prep.trace)[:ANALYSIS_ROWS]]


def has_device_time(rows: list[OperatorStats]) -> bool:
    return any(r.device_us > 0 for r in rows)


def _self_times(tids: np.ndarray, ts: np.ndarray, dur: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Self time of each op (its duration minus its direct children's) and its parent (-1: none)."""
    n = len(ts)
    order = np.lexsort((-dur, ts, tids))
    self_t = dur.astype(np.float64).copy()
    parent = np.full(n, -1, dtype=np.int64)
    stack: list[int] = []
    prev = None
    t_l, s_l, e_l = tids[order].tolist(), ts[order].tolist(), (ts + dur)[order].tolist()
    end_of = {}
    for j, i in enumerate(order.tolist()):
        if t_l[j] != prev:
            stack.clear()
            prev = t_l[j]
        while stack and end_of[stack[-1]] <= s_l[j]:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
            self_t[stack[-1]] -= dur[i]
        end_of[i] = e_l[j]
        stack.append(i)
    return np.maximum(self_t, 0.0), parent


def _device_self(trace: Trace, ops: np.ndarray) -> np.ndarray:
    """Device time of the kernels each op launched itself (through its runtime call's correlation)."""
    ev = trace.events
    out = np.zeros(len(ops), dtype=np.float64)
    dev = np.nonzero(np.isin(ev["kind"], DEVICE_KINDS) & (ev["correlation"] >= 0))[0]
    runtime = np.nonzero((ev["kind"] == Kind.RUNTIME) & (ev["correlation"] >= 0))[0]
    if not len(dev) or not len(runtime):
        return out
    launch = dict(zip(ev["correlation"][runtime].tolist(), runtime.tolist(), strict=True))
    pairs = [(k, launch[c]) for k, c in zip(dev.tolist(), ev["correlation"][dev].tolist(), strict=True)
             if c in launch]
    if not pairs:
        return out
    kernels, launches = (np.asarray(x, dtype=np.int64) for x in zip(*pairs, strict=True))
    index = RegionIndex(ev["tid"][ops], ev["ts"][ops], ev["ts"][ops] + ev["dur"][ops])
    owner = index.innermost(ev["tid"][launches], ev["ts"][launches])
    found = owner >= 0
    np.add.at(out, owner[found], ev["dur"][kernels][found])
    return out


def _propagate(self_dev: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each op's device time plus that of every op nested in it."""
    total = self_dev.copy()
    for i in np.nonzero(self_dev > 0)[0].tolist():
        p = parent[i]
        while p >= 0:
            total[p] += self_dev[i]
            p = parent[p]
    return total


def _in_region(trace: Trace, ops: np.ndarray, region: str) -> np.ndarray:
    regions = trace.events["region"][ops]
    wanted = {}
    for code in np.unique(regions).tolist():
        path = trace.string(int(code))
        if path is None:
            continue
        for form in (path, display_path(path)):
            if form == region or form.startswith(region + "/") or re.fullmatch(re.escape(region) + r"[/.].*", form):
                wanted[code] = True
    if not wanted:
        raise ConfigError(f"no operators inside region {region!r}",
                          fix="give a path as `cuvil-pgc summary` prints it, e.g. model.layer1")
    return np.isin(regions, list(wanted))


def _shapes(trace: Trace, row: int) -> str | None:
    args = trace.args.get(row) if trace.args is not None else None
    shapes = args.get("shapes") if args else None
    if not shapes:
        return None
    return ", ".join("[" + ", ".join(str(d) for d in s) + "]" if isinstance(s, list) else str(s) for s in shapes)


def _nan_add(acc: float, x: float) -> float:
    if math.isnan(x):
        return acc
    return x if math.isnan(acc) else acc + x


def _known(x: float) -> float | None:
    return None if math.isnan(x) else x
