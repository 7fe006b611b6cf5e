"""Region rows and attribution of every other row to a region, within one source.

Contract (``resolve_regions(src, strings)``):
- Region rows get ``region`` = their path, ``region_id`` and ``parent_id``. Our files give them in
  args (``path``, ``id``, ``parent``) and those are kept; where a file gives none (Kineto
  ``user_annotation`` ranges), the path is the nesting of regions on the same (pid, tid) joined
  by ``/``, and ids are synthesised (the smallest positive ids the file does not use), with
  ``parent_id`` the enclosing region's id.
- Kineto's ``ProfilerStep#N`` ranges (``cpu_op`` / ``Operator`` in older files, ``user_annotation``
  in newer ones) are regions, all with the path ``ProfilerStep``: one region with a call per step.
- Host rows (ops, runtime/driver calls, compile phases, other host events) without a region
  named by the file get the innermost region enclosing their start on their (pid, tid).
  Rows still outside every region of their thread (the autograd engine's threads, which run a
  ``## backward ##`` region's ops while the main thread waits, whether or not they have regions of
  their own) get a region of another thread of the same pid: work done on its behalf, in its
  window. The thread is the forward op's where a ``fwdbwd`` flow links the row's enclosing op to
  one (autograd), else any (the innermost region enclosing the row's start).
- GPU rows (kernels, memcpy, memset) without a named region get the region of the runtime call
  with the same correlation id (from args or the ``ac2g`` flow), else of the host event with
  the same External id; otherwise none (-1).
"""

from __future__ import annotations

import re

import numpy as np

from cuvil_pgc.trace._build import SourceColumns
from cuvil_pgc.trace.attribution import RegionIndex
from cuvil_pgc.trace.columns import StringTable
from cuvil_pgc.trace.schema import MODULE_CALL_PREFIX, Kind

_HOST = np.array([Kind.CPU_OP, Kind.RUNTIME, Kind.COMPILE, Kind.OTHER], dtype=np.uint8)
_GPU = np.array([Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], dtype=np.uint8)
_STEP = re.compile(r"^ProfilerStep#\d+$")
STEP_PATH = "ProfilerStep"


def resolve_regions(src: SourceColumns, strings: StringTable) -> None:
    """Fill region / region_id / parent_id of one source's rows (see module docstring)."""
    cols = src.cols
    lane = lanes(cols["pid"], cols["tid"])
    cols["lane"] = lane
    if src.region_path is None:
        _steps_are_regions(cols, strings)
    reg = np.nonzero(cols["kind"] == Kind.REGION)[0]
    ts, end = cols["ts"], cols["ts"] + cols["dur"]
    index = RegionIndex(lane[reg], ts[reg], end[reg])
    if len(reg):
        _warn_overlaps(src, reg, index, strings)
        _region_rows(src, reg, index, strings)
        _attribute_host(cols, lane, reg, index, src.region_given)
        _attribute_other_threads(cols, lane, reg, src.region_given)
    _attribute_gpu(cols, src.region_given)


def _warn_overlaps(src: SourceColumns, reg: np.ndarray, index: RegionIndex, strings: StringTable) -> None:
    """Ranges on one thread that overlap without nesting (``A`` starts, ``B`` starts, ``A`` ends,
    ``B`` ends: record_function ranges entered and exited out of order) are read as nested, ``B``
    inside ``A``, and its time counted in ``A`` only up to ``A``'s end; say so, with the first."""
    has = index.parent >= 0
    inner = np.nonzero(has)[0]
    outer = index.parent[inner]
    past = inner[index.ends[inner] > index.ends[outer] + 1e-6]
    if not len(past):
        return
    first = int(past[np.argmin(index.starts[past])])
    name = strings[int(src.cols["name"][reg[index.order[first]]])]
    around = strings[int(src.cols["name"][reg[index.order[index.parent[first]]]])]
    note = (f"{len(past):,} region range(s) end after the range they start in, on one thread (first: {name!r} "
            f"in {around!r}): read as nested, each counted in the outer range up to its end")
    src.warnings.append(note)
    src.notes.append(note)


def _steps_are_regions(cols, strings: StringTable) -> None:
    """``ProfilerStep#N`` rows become region rows (see module docstring)."""
    kind = cols["kind"]
    cand = np.nonzero(np.isin(kind, (Kind.CPU_OP, Kind.REGION)))[0]
    if not len(cand):
        return
    uniq, inv = np.unique(cols["name"][cand], return_inverse=True)
    hit = np.array([_STEP.match(strings[int(u)]) is not None for u in uniq], dtype=bool)[inv]
    kind[cand[hit]] = Kind.REGION


def region_name(name: str) -> str:
    """The path component of a region row named ``name`` (``ProfilerStep#7`` → ``ProfilerStep``,
    ``nn.Module: Linear_1`` → ``Linear_1``)."""
    return STEP_PATH if _STEP.match(name) else name.removeprefix(MODULE_CALL_PREFIX)


def _attribute_other_threads(cols, lane: np.ndarray, reg: np.ndarray, given: np.ndarray) -> None:
    """Host rows still outside every region (on any thread, with regions of its own or not): work
    done on behalf of a region of another thread of the process, in that region's window.

    The thread it is done for comes from ``fwdbwd`` flows where present: a backward op on another
    thread than its forward op (the autograd engine's) works for the forward op's thread, and so
    does everything nested in it. Then the row takes the innermost region of that thread enclosing
    its start. Rows without a flow take the innermost region enclosing their start on another
    thread of the same process (the window rule).
    """
    rows = np.nonzero(np.isin(cols["kind"], _HOST) & ~given & (cols["region"] < 0))[0]
    if not len(rows):
        return
    ts, end = cols["ts"], cols["ts"] + cols["dur"]
    owner = _flow_owner_lanes(cols, lane, rows)
    by_flow = owner >= 0
    if by_flow.any():
        own_index = RegionIndex(lane[reg], ts[reg], end[reg])
        inner = own_index.innermost(owner[by_flow], ts[rows[by_flow]])
        hit = inner >= 0
        cols["region"][rows[by_flow][hit]] = cols["region"][reg[inner[hit]]]
    rows = rows[~by_flow]
    if not len(rows):
        return
    pid = cols["pid"]
    by_pid = RegionIndex(pid[reg], ts[reg], end[reg])
    inner = by_pid.innermost(pid[rows], ts[rows])
    hit = inner >= 0
    cols["region"][rows[hit]] = cols["region"][reg[inner[hit]]]


def _flow_owner_lanes(cols, lane: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """Per row: the lane its work is done for, from ``fwdbwd`` flows (-1: no flow says)."""
    out = np.full(len(rows), -1, dtype=np.int64)
    fwdbwd = cols.get("fwdbwd")
    if fwdbwd is None:
        return out
    linked = np.nonzero((fwdbwd >= 0) & (cols["kind"] == Kind.CPU_OP))[0]
    if len(linked) < 2:
        return out
    ts = cols["ts"]
    order = linked[np.lexsort((ts[linked], fwdbwd[linked]))]     # per flow id: forward op first
    first = np.ones(len(order), dtype=bool)
    first[1:] = fwdbwd[order[1:]] != fwdbwd[order[:-1]]
    fwd_of = order[np.maximum.accumulate(np.where(first, np.arange(len(order)), 0))]
    back = ~first & (lane[order] != lane[fwd_of])
    bwd, fwd = order[back], fwd_of[back]
    if not len(bwd):
        return out
    index = RegionIndex(lane[bwd], ts[bwd], ts[bwd] + cols["dur"][bwd])
    inside = index.innermost(lane[rows], ts[rows])
    hit = inside >= 0
    out[hit] = lane[fwd[inside[hit]]]
    return out


def lanes(pid: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """A dense id per distinct (pid, tid) pair."""
    if not len(pid):
        return np.zeros(0, dtype=np.int64)
    if (pid == pid[0]).all():
        return tid.astype(np.int64, copy=True)
    pids, pid_code = np.unique(pid, return_inverse=True)
    tids, tid_code = np.unique(tid, return_inverse=True)
    key = pid_code.reshape(-1).astype(np.int64) * len(tids) + tid_code.reshape(-1)
    return np.unique(key, return_inverse=True)[1].reshape(-1).astype(np.int64)


def _region_rows(src: SourceColumns, reg: np.ndarray, index: RegionIndex, strings: StringTable) -> None:
    cols = src.cols
    given_ids = cols["region_id"][reg]
    final_ids = given_ids.copy()
    missing = np.nonzero(given_ids < 0)[0]
    if len(missing):    # the smallest positive ids the file does not use
        free = np.setdiff1d(np.arange(1, len(reg) + len(missing) + 2, dtype=np.int64), given_ids)
        final_ids[missing] = free[: len(missing)]
    given_paths = src.region_path
    names = cols["name"][reg].tolist()
    reg_list = reg.tolist()
    order, parent = index.order.tolist(), index.parent.tolist()
    paths_sorted: list[str] = [""] * len(order)
    region_col = cols["region"]
    parent_ids = cols["parent_id"]
    for j, i in enumerate(order):
        p = parent[j]
        row = reg_list[i]
        path = given_paths[row] if given_paths is not None else None
        if path is None:
            name = region_name(strings[names[i]])
            path = name if p < 0 else f"{paths_sorted[p]}/{name}"
            if given_ids[i] < 0:
                parent_ids[row] = -1 if p < 0 else final_ids[order[p]]
        paths_sorted[j] = path
        region_col[row] = strings.intern(path)
    cols["region_id"][reg] = final_ids


def _attribute_host(cols, lane: np.ndarray, reg: np.ndarray, index: RegionIndex, given: np.ndarray) -> None:
    rows = np.nonzero(np.isin(cols["kind"], _HOST) & ~given)[0]
    if not len(rows):
        return
    inner = index.innermost(lane[rows], cols["ts"][rows])
    hit = inner >= 0
    cols["region"][rows[hit]] = cols["region"][reg[inner[hit]]]


def _attribute_gpu(cols, given: np.ndarray) -> None:
    kind = cols["kind"]
    gpu = np.nonzero(np.isin(kind, _GPU) & ~given)[0]
    if not len(gpu):
        return
    rt = np.nonzero((kind == Kind.RUNTIME) & (cols["correlation"] >= 0))[0]
    left = _copy_region_by_key(cols, gpu, rt, "correlation")
    if len(left):
        host = np.nonzero(np.isin(kind, _HOST) & (cols["external_id"] >= 0))[0]
        _copy_region_by_key(cols, left, host, "external_id")


def _copy_region_by_key(cols, targets: np.ndarray, sources: np.ndarray, key: str) -> np.ndarray:
    """Give each target row the region of the source row with the same ``key``; return the misses."""
    if not len(sources):
        return targets
    keys = cols[key][sources]
    order = np.argsort(keys, kind="stable")
    sorted_keys = keys[order]
    want = cols[key][targets]
    pos = np.minimum(np.searchsorted(sorted_keys, want), len(sorted_keys) - 1)
    hit = (sorted_keys[pos] == want) & (want >= 0)
    cols["region"][targets[hit]] = cols["region"][sources[order[pos[hit]]]]
    return targets[~hit]
