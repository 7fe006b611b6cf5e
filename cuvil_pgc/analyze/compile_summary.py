"""The compile summary: what torch.compile did and cost, from a trace's ``cat: "compile"`` events.

``summarize_compile(trace)`` reads the columnar Trace; ``summarize_compile_events(events)`` reads
raw Chrome-trace event dicts (the same events, e.g. a file's ``traceEvents``). Both return the
same JSON-able dict (the ``compile`` key of ``analyze --json``)::

    {"graphs": [{"compile_id", "frame", "file", "line", "caller", "process", "start_ms", "total_ms",
                 "phases": {phase: ms}, "cache": {"fx": state, "aot": state},
                 "cache_lookups": {"fx": {state: n}, "aot": {state: n}},
                 "cache_misses": [reason, ...], "recompiles": [reason, ...],
                 "graph_breaks": [{"reason", "location"}], "graph_ops", "fail_reason",
                 "worker_ms", "run_ms", "run_calls"}, ...],        # one per frame compile, by start time
     "totals": {"compile_ms", "run_ms", "compiles", "graphs", "recompiles", "graph_breaks",
                "cache_hit_rate", "aot_cache_hit_rate", "fx_cache": {state: lookups}, "aot_cache": {...},
                "unattributed_ms"},
     "phases": {phase: ms}}                            # over all graphs

``phases`` are exclusive (self) times: each instant of a compile counts for the innermost timed
block running then on the compiling thread, so a graph's phases add up to its ``total_ms``;
``worker_ms`` is the time of its blocks on other threads (Inductor's parallel kernel compiles),
which overlaps the compiling thread's waits. ``run_ms`` excludes compiles nested in a run range
(the first call of a frame compiles the graphs after its graph break inside its own range). ``cache`` states are
``hit``/``miss``/``bypass`` or None when no lookup was recorded. ``run_ms`` (time spent running
compiled code) is known only when the trace has torch.profiler's ``Torch-Compiled Region: <id>``
ranges (sessions with ``ops=True``); it is None otherwise. Compile rows are the ones the
compile sampler writes (see ``cuvil_pgc.instrument.samplers._compile_records``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cuvil_pgc.trace.schema import CAT_COMPILE, Kind

RUN_REGION_PREFIX = "Torch-Compiled Region: "
_ZERO_LENGTH = ("graph_break", "recompile", "fx_graph_cache", "aot_autograd_cache", "dynamic_shapes")
_CACHE_KINDS = {"fx_graph_cache": "fx", "aot_autograd_cache": "aot"}


@dataclass
class _Row:
    name: str
    ts: float
    dur: float
    tid: int
    args: dict[str, Any]


@dataclass
class _Graph:
    process: int
    compile_id: str | None
    rows: list[_Row] = field(default_factory=list)
    run: list[tuple[float, float]] = field(default_factory=list)


def summarize_compile_events(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The compile summary of raw Chrome-trace events (``X`` events; others are ignored)."""
    graphs: dict[tuple[int, str | None], _Graph] = {}
    run: list[tuple[int, str, float, float, int]] = []
    processes: dict[int, int] = {}      # pid -> index in order of appearance, like Trace sources
    for ev in events:
        if ev.get("ph", "X") != "X":
            continue
        name = str(ev.get("name", ""))
        process = processes.setdefault(_int(ev.get("pid")), len(processes))
        if ev.get("cat") == CAT_COMPILE:
            args = ev.get("args") or {}
            row = _Row(name, float(ev.get("ts", 0.0)), float(ev.get("dur", 0.0)), _int(ev.get("tid")), args)
            _graph(graphs, process, args.get("compile_id")).rows.append(row)
        elif name.startswith(RUN_REGION_PREFIX):
            run.append((process, name[len(RUN_REGION_PREFIX):], float(ev.get("ts", 0.0)),
                        float(ev.get("dur", 0.0)), _int(ev.get("tid"))))
    return _summarize(graphs, run)


def summarize_compile(trace: Any) -> dict[str, Any]:
    """The compile summary of a columnar :class:`~cuvil_pgc.trace.columns.Trace`."""
    ev = trace.events
    graphs: dict[tuple[int, str | None], _Graph] = {}
    for i in trace.of_kind(Kind.COMPILE):
        args = trace.args.get(int(i)) or {}
        row = _Row(trace.strings[int(ev["name"][i])], float(ev["ts"][i]), float(ev["dur"][i]),
                   int(ev["tid"][i]), args)
        _graph(graphs, int(ev["source"][i]), args.get("compile_id")).rows.append(row)
    run = []
    prefixed = {k: s[len(RUN_REGION_PREFIX):] for k, s in enumerate(trace.strings.strings)
                if s.startswith(RUN_REGION_PREFIX)}
    if prefixed:
        import numpy as np

        for i in np.nonzero(np.isin(ev["name"], list(prefixed)))[0]:
            run.append((int(ev["source"][i]), prefixed[int(ev["name"][i])], float(ev["ts"][i]),
                        float(ev["dur"][i]), int(ev["tid"][i])))
    return _summarize(graphs, run)


def _graph(graphs: dict, process: int, compile_id: Any) -> _Graph:
    key = (process, None if compile_id is None else str(compile_id))
    if key not in graphs:
        graphs[key] = _Graph(process, key[1])
    return graphs[key]


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


# -- summary ---------------------------------------------------------------------------------
def _summarize(graphs: dict[tuple[int, str | None], _Graph], run: list[tuple]) -> dict[str, Any]:
    for process, cid, ts, dur, _tid in run:
        if (process, cid) in graphs:
            graphs[(process, cid)].run.append((ts, dur))
    t0 = min((r.ts for g in graphs.values() for r in g.rows), default=0.0)
    compiling: dict[int, list[tuple[float, float]]] = defaultdict(list)   # process -> frame spans
    for g in graphs.values():
        compiling[g.process] += [(r.ts, r.dur) for r in g.rows if r.args.get("phase") == "frame"]
    per_graph = [_graph_summary(g, t0, compiling[g.process]) for key, g in graphs.items() if key[1] is not None]
    per_graph = [g for g in per_graph if g is not None]
    per_graph.sort(key=lambda g: (g["start_ms"], g["compile_id"]))
    unattributed_ms = sum(_self_times(g.rows)[1] for (_p, cid), g in graphs.items() if cid is None)
    return {"graphs": per_graph, "totals": _totals(per_graph, run, compiling, unattributed_ms),
            "phases": _sum_phases(g["phases"] for g in per_graph)}


def _graph_summary(g: _Graph, t0: float, compiling: list[tuple[float, float]]) -> dict[str, Any] | None:
    frame = next((r for r in g.rows if r.args.get("phase") == "frame"), None)
    spans = [r for r in g.rows if r.args.get("phase") not in _ZERO_LENGTH]
    if not spans:
        return None
    # Phases as the compiling thread lived them; worker threads (Inductor's parallel kernel
    # compiles) overlap its waits and are reported apart, so phases add up to the total.
    tid = frame.tid if frame else spans[0].tid
    phases, total_us = _self_times([r for r in spans if r.tid == tid])
    worker_us = _self_times([r for r in spans if r.tid != tid])[1]
    start = frame.ts if frame else min(r.ts for r in spans)
    args = frame.args if frame else {}
    lookups = [r for r in g.rows if r.args.get("phase") in _CACHE_KINDS]
    return {
        "compile_id": g.compile_id, "frame": args.get("frame") or (frame.name if frame else None),
        "file": args.get("file"), "line": args.get("line"), "caller": args.get("caller"), "process": g.process,
        "start_ms": _ms(start - t0), "total_ms": _ms(frame.dur if frame else total_us),
        "phases": {p: _ms(us) for p, us in sorted(phases.items(), key=lambda kv: -kv[1])},
        "cache": {short: _combined([r.args.get("cache") for r in lookups if r.args.get("phase") == kind])
                  for kind, short in _CACHE_KINDS.items()},
        "cache_lookups": {short: _count([r.args.get("cache") for r in lookups if r.args.get("phase") == kind])
                          for kind, short in _CACHE_KINDS.items()},
        "cache_misses": [r.args["reason"] for r in lookups if r.args.get("cache") != "hit" and r.args.get("reason")],
        "recompiles": [r.args.get("reason") or "recompile" for r in g.rows if r.args.get("phase") == "recompile"],
        "graph_breaks": [{"reason": r.args.get("reason"), "location": r.args.get("location")}
                         for r in g.rows if r.args.get("phase") == "graph_break"],
        "graph_ops": args.get("graph_ops"), "fail_reason": args.get("reason") if frame else None,
        "worker_ms": _ms(worker_us),
        "run_ms": _ms(_running(g.run, compiling)) if g.run else None, "run_calls": len(g.run),
    }


def _self_times(rows: list[_Row]) -> tuple[dict[str, float], float]:
    """Exclusive µs per phase of nested spans (per thread), and the covered wall time."""
    phases: dict[str, float] = defaultdict(float)
    covered = 0.0
    by_tid: dict[int, list[_Row]] = defaultdict(list)
    for r in rows:
        by_tid[r.tid].append(r)
    for spans in by_tid.values():
        spans.sort(key=lambda r: (r.ts, -r.dur))
        stack: list[tuple[_Row, float]] = []          # (span, end)
        for r in spans:
            while stack and r.ts >= stack[-1][1]:
                stack.pop()
            end = r.ts + r.dur
            if stack:
                parent = stack[-1][0]
                overlap = min(end, stack[-1][1]) - r.ts
                phases[_phase(parent)] -= max(0.0, overlap)
            else:
                covered += r.dur
            phases[_phase(r)] += r.dur
            stack.append((r, end))
    return {p: max(0.0, us) for p, us in phases.items() if us > 0.5}, covered


def _phase(row: _Row) -> str:
    phase = row.args.get("phase") or "other"
    return "other" if phase == "frame" else phase


def _totals(graphs: list[dict[str, Any]], run: list[tuple], compiling: dict[int, list[tuple[float, float]]],
            unattributed_ms: float) -> dict[str, Any]:
    fx, aot = (_add(g["cache_lookups"][kind] for g in graphs) for kind in ("fx", "aot"))
    runs_by_thread: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for process, _cid, ts, dur, tid in run:
        runs_by_thread[(process, tid)].append((ts, dur))
    run_us = sum(_running(spans, compiling.get(process, [])) for (process, _t), spans in runs_by_thread.items())
    return {
        "compile_ms": round(sum(g["total_ms"] for g in graphs), 3),
        "run_ms": _ms(run_us) if run else None,
        "compiles": len(graphs),
        "graphs": sum(1 for g in graphs if g["graph_ops"] is None or g["graph_ops"] > 0),
        "recompiles": sum(len(g["recompiles"]) for g in graphs),
        "graph_breaks": sum(len(g["graph_breaks"]) for g in graphs),
        "cache_hit_rate": _rate(fx), "aot_cache_hit_rate": _rate(aot),
        "fx_cache": fx, "aot_cache": aot, "unattributed_ms": _ms(unattributed_ms),
    }


def _sum_phases(phase_maps: Iterable[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for phases in phase_maps:
        for p, ms in phases.items():
            total[p] += ms
    return {p: round(ms, 3) for p, ms in sorted(total.items(), key=lambda kv: -kv[1])}


def _merge(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """(ts, dur) spans as disjoint (start, end) intervals."""
    merged: list[list[float]] = []
    for ts, dur in sorted(spans):
        if merged and ts <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], ts + dur)
        else:
            merged.append([ts, ts + dur])
    return [(a, b) for a, b in merged]


def _running(runs: list[tuple[float, float]], compiling: list[tuple[float, float]]) -> float:
    """µs covered by compiled-region ranges, less the compiles nested in them (a compiled frame
    that calls a not-yet-compiled graph compiles it inside its own range on the first call)."""
    covered = _merge(runs)
    total = sum(b - a for a, b in covered)
    holes = _merge(compiling)
    i = 0
    for a, b in covered:
        while i < len(holes) and holes[i][1] <= a:
            i += 1
        j = i
        while j < len(holes) and holes[j][0] < b:
            total -= min(b, holes[j][1]) - max(a, holes[j][0])
            j += 1
    return max(0.0, total)


def _combined(states: list[Any]) -> str | None:
    states = [s for s in states if s]
    for state in ("miss", "bypass", "hit"):
        if state in states:
            return state
    return None


def _count(states: list[str | None]) -> dict[str, int]:
    return {s: states.count(s) for s in ("hit", "miss", "bypass") if states.count(s)}


def _add(counts: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = defaultdict(int)
    for c in counts:
        for state, n in c.items():
            total[state] += n
    return dict(total)


def _rate(counts: dict[str, int]) -> float | None:
    n = sum(counts.values())
    return round(counts.get("hit", 0) / n, 4) if n else None


def _ms(us: float) -> float:
    return round(us / 1000.0, 3)
