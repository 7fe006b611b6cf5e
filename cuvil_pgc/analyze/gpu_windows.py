"""What the host and the GPU did during each region's own time, on traces with GPU work.

For every region path the pass splits the region's *self windows* (each call's interval minus the
calls of regions nested directly in it) by two questions at every instant:

- Was the GPU busy? Busy is the union of all kernel, memcpy and memset intervals of the trace
  source (every device and stream of that process: two kernels at once are busy once). Busy time
  is further split into the region's *own* GPU work (rows attributed to the path) and other work
  (queued earlier, or by other regions), and *exposed communication*: time only collective
  (NCCL) kernels run, not hidden behind other kernels.
- What was the host doing for the region? The rows attributed to the path (on any thread: work
  that other threads do on the region's behalf is attributed to it by the reader) give, in this
  priority: a blocking ``sync`` call, an ``alloc`` call, a ``setup`` call, a collective (``comm``)
  op or call, a ``launch`` call (extended to its kernel's start when the GPU sat idle, up to
  LAUNCH_WAIT_US: the launch latency it causes), a CPU op that launches GPU work
  (``op_launch``: kept apart as evidence; the analyzer counts it as host work, not launch
  overhead), another op or runtime call (``op``), or
  nothing recorded (``none``: Python, or waiting).

Outputs (per path, weighted by source weight, µs) in ``prep.extras["gpu_windows"]``:
``window`` (self-window length), ``busy``, ``own_busy``, ``comm_exposed``, ``idle_<label>`` (GPU idle
while the host was in that state), ``sync_foreign`` (GPU busy with work that is not the region's
while the host blocked in a sync call), and ``own_union`` (union of the region's own GPU
intervals wherever they ran). ``(outside regions)`` gets as windows the source's span minus every
region call.
"""

from __future__ import annotations

import numpy as np

from cuvil_pgc.analyze import intervals as iv
from cuvil_pgc.analyze._prepare import OUTSIDE, Prepared
from cuvil_pgc.analyze.runtime_api import CATEGORIES, categorise, is_comm
from cuvil_pgc.trace.schema import Kind

LABELS = ("sync", "alloc", "setup", "comm", "launch", "op_launch", "op", "none")
LAUNCH_WAIT_US = 50.0        # a launch call is blamed for GPU idle time up to this long after it
_GPU = (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)
_CAT = {c: i for i, c in enumerate(CATEGORIES)}


def has_gpu(prep: Prepared) -> bool:
    return bool(np.isin(prep.trace.events["kind"], _GPU).any())


def split_windows(prep: Prepared) -> dict[str, np.ndarray]:
    """The per-path split described in the module docstring (also left in ``prep.extras``)."""
    ev, n = prep.trace.events, prep.n_paths
    out = {k: np.zeros(n) for k in ("window", "busy", "own_busy", "comm_exposed", "sync_foreign", "own_union",
                                    *(f"idle_{lb}" for lb in LABELS))}
    out.update({f"runtime_{c}": np.zeros(n) for c in CATEGORIES})
    out.update({f"runtime_{c}_calls": np.zeros(n) for c in CATEGORIES})
    prep.extras["gpu_windows"] = out
    if not n or not has_gpu(prep):
        return out
    kind, src = ev["kind"], ev["source"].astype(np.int64)
    t0 = float(np.min(ev["ts"]))
    ts = ev["ts"] - t0                       # >= 0: group g lives on [g*span, (g+1)*span)
    end = ts + ev["dur"]
    names = prep.trace.strings.strings
    weights = np.array([s.weight for s in prep.trace.sources] or [1.0])
    span = float(np.max(end)) + 1.0
    gpu = np.isin(kind, _GPU)
    comm_gpu = gpu & _name_mask(ev["name"], names, is_comm)
    n_src = int(src.max()) + 1
    busy = {s: iv.union(ts[gpu & (src == s)], end[gpu & (src == s)]) for s in range(n_src)}
    comm_only = {s: iv.subtract(iv.union(ts[comm_gpu & (src == s)], end[comm_gpu & (src == s)]),
                                iv.union(ts[gpu & ~comm_gpu & (src == s)], end[gpu & ~comm_gpu & (src == s)]))
                 for s in range(n_src)}

    pos = prep.path_pos
    group = np.where(pos >= 0, src * n + pos, -1)              # one group per (source, path)
    n_groups = n_src * n
    w_group = np.repeat(weights[np.clip(np.arange(n_src), 0, len(weights) - 1)], n)

    # Own GPU work per group, on the shifted time axis (group g lives on [g*span, (g+1)*span)).
    own_rows = np.nonzero(gpu & (group >= 0))[0]
    shift_own = group[own_rows] * span
    own = iv.union(ts[own_rows] + shift_own, end[own_rows] + shift_own)
    own_len = np.zeros(n_groups)
    if len(own[0]):
        g_of = np.floor(own[0] / span).astype(np.int64)
        own_len = np.bincount(g_of, weights=own[1] - own[0], minlength=n_groups)[:n_groups]

    # Host intervals per group, labelled.
    starts, ends, labels, groups = [], [], [], []

    def add(rows: np.ndarray, label: int, stop: np.ndarray | None = None) -> None:
        if len(rows):
            starts.append(ts[rows])
            ends.append(end[rows] if stop is None else stop)
            labels.append(np.full(len(rows), label))
            groups.append(group[rows])

    rt = np.nonzero((kind == Kind.RUNTIME) & (group >= 0))[0]
    cat = categorise(names, ev["name"][rt], ev["dur"][rt])
    cat[_pageable_d2h(ev, rt, gpu, names)] = _CAT["sync"]     # always waits for the stream, however short
    for c, i in _CAT.items():
        sel = cat == i
        np.add.at(out[f"runtime_{c}"], pos[rt[sel]], weights[np.clip(src[rt[sel]], 0, len(weights) - 1)]
                  * ev["dur"][rt[sel]])
        np.add.at(out[f"runtime_{c}_calls"], pos[rt[sel]], weights[np.clip(src[rt[sel]], 0, len(weights) - 1)])
    launches = rt[cat == _CAT["launch"]]
    add(rt[cat == _CAT["sync"]], LABELS.index("sync"))
    add(rt[cat == _CAT["alloc"]], LABELS.index("alloc"))
    add(rt[cat == _CAT["setup"]], LABELS.index("setup"))
    add(launches, LABELS.index("launch"), _launch_ends(ev, launches, gpu) - t0)
    add(rt[cat == _CAT["other"]], LABELS.index("op"))
    ops = np.nonzero((kind == Kind.CPU_OP) & (group >= 0))[0]
    comm_ops = ops[_name_mask(ev["name"][ops], names, is_comm)]
    add(comm_ops, LABELS.index("comm"))
    top = prep.op_rows[group[prep.op_rows] >= 0]
    launching = _ops_containing(prep, top, launches)
    add(top[launching], LABELS.index("op_launch"))
    add(top[~launching], LABELS.index("op"))
    win_s, win_e, win_g = _self_windows(prep, ts, end, src, n, span)
    if not len(win_s):
        return out
    out["own_union"] = _per_path(own_len, w_group, n)
    seg = _label_segments(np.concatenate(starts) if starts else np.zeros(0),
                          np.concatenate(ends) if ends else np.zeros(0),
                          np.concatenate(labels) if labels else np.zeros(0, dtype=np.int64),
                          np.concatenate(groups) if groups else np.zeros(0, dtype=np.int64),
                          win_s, win_e, win_g, span)
    s_shift, e_shift, seg_label, seg_group = seg
    base = seg_group * span
    a, b = s_shift - base, e_shift - base
    seg_src = seg_group // n
    b_all = np.zeros(len(a))
    b_cx = np.zeros(len(a))
    for s in range(n_src):
        on = seg_src == s
        b_all[on] = iv.covered(busy[s], a[on], b[on])
        b_cx[on] = iv.covered(comm_only[s], a[on], b[on])
    b_own = np.minimum(iv.covered(own, s_shift, e_shift), b_all)
    length = b - a
    idle = np.maximum(length - b_all, 0.0)
    wts = w_group[seg_group]

    def per_path(values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        sel = slice(None) if mask is None else mask
        return _per_path(np.bincount(seg_group[sel], weights=(wts * values)[sel], minlength=n_groups), w_group, n,
                         weighted=True)

    out["window"] = per_path(length)
    out["busy"] = per_path(b_all)
    out["own_busy"] = per_path(b_own)
    out["comm_exposed"] = per_path(b_cx)
    is_sync = seg_label == LABELS.index("sync")
    out["sync_foreign"] = per_path(np.maximum(b_all - b_own - b_cx, 0.0), is_sync)
    for k, lb in enumerate(LABELS):
        out[f"idle_{lb}"] = per_path(idle, seg_label == k)
    return out


def _per_path(by_group: np.ndarray, w_group: np.ndarray, n: int, weighted: bool = False) -> np.ndarray:
    vals = by_group if weighted else by_group * w_group[: len(by_group)]
    return vals.reshape(-1, n).sum(axis=0) if n else np.zeros(0)


def _name_mask(name_ids: np.ndarray, names: list[str], test) -> np.ndarray:
    if not len(name_ids):
        return np.zeros(0, dtype=bool)
    uniq, inv = np.unique(name_ids, return_inverse=True)
    return np.array([test(names[int(u)]) for u in uniq], dtype=bool)[inv]


def _launch_ends(ev: dict[str, np.ndarray], launches: np.ndarray, gpu: np.ndarray) -> np.ndarray:
    """End of each launch call, extended to the start of the GPU work it launched (same source and
    correlation id) when that is later, by at most LAUNCH_WAIT_US."""
    end = ev["ts"][launches] + ev["dur"][launches]
    g = np.nonzero(gpu & (ev["correlation"] >= 0))[0]
    if not len(launches) or not len(g):
        return end
    key_g = ev["source"][g].astype(np.int64) << 48 | ev["correlation"][g]
    order = np.argsort(key_g, kind="stable")
    key_sorted, start_sorted = key_g[order], ev["ts"][g][order]
    want = ev["source"][launches].astype(np.int64) << 48 | ev["correlation"][launches]
    k = np.minimum(np.searchsorted(key_sorted, want), len(key_sorted) - 1)
    hit = (key_sorted[k] == want) & (ev["correlation"][launches] >= 0)
    first = np.where(hit, start_sorted[k], end)
    return np.maximum(end, np.minimum(first, end + LAUNCH_WAIT_US))


def _pageable_d2h(ev: dict[str, np.ndarray], rt: np.ndarray, gpu: np.ndarray, names: list[str]) -> np.ndarray:
    """Per runtime row: whether it launched a device-to-pageable-host copy (same source and
    correlation id; Kineto names it ``Memcpy DtoH (Device -> Pageable)``)."""
    out = np.zeros(len(rt), dtype=bool)
    g = np.nonzero(gpu & (ev["kind"] == Kind.MEMCPY) & (ev["correlation"] >= 0))[0]
    if not len(rt) or not len(g):
        return out
    d2h = _name_mask(ev["name"][g], names, lambda n: "DtoH" in n and "Pageable" in n)
    g = g[d2h]
    if not len(g):
        return out
    keys = np.sort(ev["source"][g].astype(np.int64) << 48 | ev["correlation"][g])
    want = ev["source"][rt].astype(np.int64) << 48 | ev["correlation"][rt]
    k = np.minimum(np.searchsorted(keys, want), len(keys) - 1)
    return (keys[k] == want) & (ev["correlation"][rt] >= 0)


def _ops_containing(prep: Prepared, ops: np.ndarray, launches: np.ndarray) -> np.ndarray:
    """Per top-level op: whether a launch call on its thread starts inside it."""
    out = np.zeros(len(ops), dtype=bool)
    if not len(ops) or not len(launches):
        return out
    ev = prep.trace.events
    lane = prep.lane
    order = np.lexsort((ev["ts"][ops], lane[ops]))
    o = ops[order]
    key_o = lane[o]
    for ln in np.unique(lane[launches]):
        on = key_o == ln
        if not on.any():
            continue
        oo = o[on]
        t = ev["ts"][launches[lane[launches] == ln]]
        k = np.searchsorted(ev["ts"][oo], t, side="right") - 1
        ok = k >= 0
        inside = ok.copy()
        inside[ok] = t[ok] < ev["ts"][oo][k[ok]] + ev["dur"][oo][k[ok]]
        idx = np.nonzero(on)[0][k[inside]]
        out[order[idx]] = True
    return out


def self_pieces(prep: Prepared, ts: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The self windows of every region call: (starts, ends, instance index into region_rows),
    each call's interval minus the calls nested directly in it (zero-length pieces included)."""
    return call_pieces(prep.region_rows, prep.region_parent, ts, end)


def call_pieces(rr: np.ndarray, par: np.ndarray, ts: np.ndarray, end: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`self_pieces` of the region calls ``rr`` whose enclosing calls are ``par``."""
    s, e = ts[rr], end[rr]
    inst = np.arange(len(rr))
    child = par >= 0
    # boundary events: (owner, time, kind) with kind 0 = a self piece opens, 1 = it closes
    owner = np.concatenate([inst, inst, par[child], par[child]])
    t = np.concatenate([s, e, s[child], e[child]])
    k = np.concatenate([np.zeros(len(rr)), np.ones(len(rr)), np.ones(child.sum()), np.zeros(child.sum())])
    order = np.lexsort((k, t, owner))
    owner, t = owner[order], t[order]
    opens, closes = t[0::2], t[1::2]
    own_of = owner[0::2]
    opens = np.clip(opens, s[own_of], e[own_of])            # improperly nested children stay inside
    closes = np.clip(closes, opens, e[own_of])
    return opens, closes, own_of


def _self_windows(prep: Prepared, ts: np.ndarray, end: np.ndarray, src: np.ndarray, n: int, span: float):
    """Self windows of every region call, shifted by group, plus the ``(outside regions)`` windows:
    each source's span minus every region call."""
    ev = prep.trace.events
    rr = prep.region_rows
    opens, closes, own_of = self_pieces(prep, ts, end)
    g = src[rr][own_of] * n + prep.path_pos[rr][own_of]
    starts, ends, groups = [opens], [closes], [g]
    if prep.paths and prep.paths[-1] == OUTSIDE:
        out_pos = len(prep.paths) - 1
        for sid in np.unique(src):
            on = src == sid
            lo, hi = float(ts[on].min()), float(end[on].max())
            regions = np.nonzero(on & (ev["kind"] == Kind.REGION))[0]
            rest = iv.subtract((np.array([lo]), np.array([hi])) if hi > lo else iv.EMPTY,
                               iv.union(ts[regions], end[regions]))
            starts.append(rest[0])
            ends.append(rest[1])
            groups.append(np.full(len(rest[0]), int(sid) * n + out_pos))
    ws, we, wg = np.concatenate(starts), np.concatenate(ends), np.concatenate(groups)
    keep = we > ws
    return ws[keep] + wg[keep] * span, we[keep] + wg[keep] * span, wg[keep]


def _label_segments(hs, he, hl, hg, ws, we, wg, span):
    """Cut the shifted window pieces into segments labelled by the highest-priority host state."""
    hs, he = hs + hg * span, he + hg * span
    n_lab = len(LABELS)                        # label n_lab - 1 ("none") is the window itself
    t = np.concatenate([hs, he, ws, we])
    lab = np.concatenate([hl, hl, np.full(len(ws), n_lab - 1), np.full(len(ws), n_lab - 1)]).astype(np.int64)
    step = np.concatenate([np.ones(len(hs)), -np.ones(len(hs)), np.ones(len(ws)), -np.ones(len(ws))])
    order = np.argsort(t, kind="stable")
    t, lab, step = t[order], lab[order], step[order].astype(np.int32)
    # the highest-priority label open after each point: one running count per label, lowest last
    first = np.full(len(t) - 1, n_lab - 1, dtype=np.int64)
    in_window = np.zeros(len(t) - 1, dtype=bool)
    for k in range(n_lab - 1, -1, -1):
        open_k = np.cumsum(np.where(lab == k, step, 0), dtype=np.int32)[:-1] > 0
        if k == n_lab - 1:
            in_window = open_k
        else:
            first[open_k] = k
    seg_s, seg_e = t[:-1], t[1:]
    keep = in_window & (seg_e > seg_s)
    seg_g = np.floor(seg_s / span).astype(np.int64)
    return seg_s[keep], seg_e[keep], first[keep], seg_g[keep]
