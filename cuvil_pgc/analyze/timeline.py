"""The compact timeline an Analysis carries for the viewer (region spans, counters, compile spans).

Spans: one row per region call, as columns ``path, lane, ts_us, dur_us, depth, bottleneck``; the
lane names the rank and thread (``r0 pid 12 tid 34``). Above ``MAX_SPANS`` calls the shortest ones
are dropped (the longest calls are what a timeline shows at report zoom), and the number dropped
is recorded in ``analysis.trace["timeline_spans_dropped"]``. Counters: per counter name (and rank when several), at most
``MAX_POINTS`` points, longer series averaged into equal time buckets. Compile spans: the COMPILE
rows with ``graph`` (compile id), ``phase``, ``cache`` and ``reason`` from their args, and the ``rank``
of the file they came from. The pass also
sets ``analysis.trace["runs"]``: per source, the header facts that place the timeline (host,
python and torch versions, platform, command, wall-clock start), see :func:`run_facts`.
"""

from __future__ import annotations

import numpy as np

from cuvil_pgc.analyze._prepare import Prepared
from cuvil_pgc.analyze.analysis import Analysis, Timeline
from cuvil_pgc.analyze.bottleneck import attribute_bottlenecks
from cuvil_pgc.analyze.passes import requires
from cuvil_pgc.trace.schema import Kind

MAX_SPANS = 50_000
MAX_POINTS = 2_000


@requires(attribute_bottlenecks)  # spans are coloured by their region's bottleneck
def build_timeline(prep: Prepared, analysis: Analysis) -> None:
    """Pass: fill ``analysis.timeline``."""
    analysis.timeline = Timeline(spans=_spans(prep, analysis), counters=_counters(prep),
                                 compile_spans=_compile_spans(prep))
    analysis.trace["runs"] = run_facts(prep)


RUN_KEYS = ("host", "pid", "rank", "world_size", "python", "torch", "platform", "start_unix_ns", "command")


def run_facts(prep: Prepared) -> list[dict]:
    """Per source: what ran where (host, versions, command, wall-clock start), from its header."""
    runs = []
    for s in prep.trace.sources:
        meta = s.metadata if isinstance(s.metadata, dict) else {}
        run = {"path": s.path, "format": s.format, "rank": s.rank}
        run.update({k: meta[k] for k in RUN_KEYS if k in meta and k != "rank"})
        runs.append(run)
    return runs


def _spans(prep: Prepared, analysis: Analysis) -> dict[str, list]:
    ev = prep.trace.events
    rr = prep.region_rows
    keep = np.arange(len(rr))
    dropped = 0
    if len(rr) > MAX_SPANS:
        keep = np.sort(np.argsort(-ev["dur"][rr], kind="stable")[:MAX_SPANS])
        dropped = len(rr) - MAX_SPANS
    analysis.trace["timeline_spans_dropped"] = dropped
    rows = rr[keep]
    lanes, lane_idx = np.unique(prep.lane[rows], return_inverse=True)
    names = [_lane_name(prep, int(k)) for k in lanes]
    verdict = {r.path: r.bottleneck for r in analysis.regions}
    pos = prep.path_pos[rows]
    return {"path": [prep.paths[i] for i in pos.tolist()],
            "lane": [names[i] for i in lane_idx.reshape(-1).tolist()],
            "ts_us": ev["ts"][rows].tolist(), "dur_us": ev["dur"][rows].tolist(),
            "depth": prep.region_depth[keep].tolist(),
            "bottleneck": [verdict.get(prep.paths[i], "") for i in pos.tolist()]}


def _lane_name(prep: Prepared, key: int) -> str:
    src, pid, tid = key >> 50, (key >> 24) & 0x3FFFFFF, key & 0xFFFFFF
    sources = prep.trace.sources
    rank = sources[src].rank if src < len(sources) else 0
    return f"r{rank} pid {pid} tid {tid}"


def _counters(prep: Prepared) -> dict[str, dict[str, list]]:
    c = prep.trace.counters
    if not len(c["ts"]):
        return {}
    ranks = np.array([s.rank for s in prep.trace.sources] or [0])
    rank = ranks[np.clip(c["source"].astype(np.int64), 0, len(ranks) - 1)]
    multi = len(np.unique(rank)) > 1
    out: dict[str, dict[str, list]] = {}
    for name_id in np.unique(c["name"]):
        for r in (np.unique(rank) if multi else [None]):
            sel = (c["name"] == name_id) & (True if r is None else rank == r)
            ts, val = _decimate(c["ts"][sel], c["value"][sel])
            label = prep.trace.strings[int(name_id)] + ("" if r is None else f" r{int(r)}")
            out[label] = {"ts_us": ts.tolist(), "value": val.tolist()}
    return out


def _decimate(ts: np.ndarray, val: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(ts) <= MAX_POINTS:
        return ts, val
    edges = np.linspace(ts[0], ts[-1], MAX_POINTS + 1)
    b = np.clip(np.searchsorted(edges, ts, side="right") - 1, 0, MAX_POINTS - 1)
    n = np.bincount(b, minlength=MAX_POINTS)
    has = n > 0
    mean = np.bincount(b, weights=val, minlength=MAX_POINTS)[has] / n[has]
    mid = ((edges[:-1] + edges[1:]) / 2)[has]
    return mid, mean


def _compile_spans(prep: Prepared) -> dict[str, list]:
    trace = prep.trace
    rows = trace.of_kind(Kind.COMPILE)
    cols: dict[str, list] = {k: [] for k in ("graph", "phase", "ts_us", "dur_us", "cache", "reason", "rank")}
    ranks = [s.rank for s in trace.sources] or [0]
    for row in rows.tolist():
        a = trace.args.get(row, {})
        cols["rank"].append(int(ranks[min(int(trace.events["source"][row]), len(ranks) - 1)]))
        cols["graph"].append(str(a.get("compile_id", "")))
        cols["phase"].append(str(a.get("phase") or trace.strings[int(trace.events["name"][row])]))
        cols["ts_us"].append(float(trace.events["ts"][row]))
        cols["dur_us"].append(float(trace.events["dur"][row]))
        cols["cache"].append(a.get("cache"))
        cols["reason"].append(a.get("reason"))
    return cols
