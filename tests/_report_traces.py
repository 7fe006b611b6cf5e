"""Trace files and plans for the report tests, written in our trace format (read back by the real reader).

``write_trace`` writes a small run: ``step`` regions holding one region per name in ``names`` (the
hostile strings go there), CPU ops with FLOPs and bytes, optional GPU kernels and ``sm_util``
counters, ``cpu_util`` counters, torch.compile phases with a cache miss, a graph break and a
recompile whose reasons are hostile too, and a header whose sampler reasons, device names and
command are hostile. ``plan_doc`` is a plan.json in the recompiler's shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HOSTILE = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(2)>',
    "</script><script>window.__pwned=1</script>",
    "javascript:alert(3)",
    "rtl \u202egnp.exe",
    "%{x} ${window.__pwned=2} {{7*7}}",
    "sep\u2028line\u2029para &amp; <!-- <svg onload=alert(4)>",
]
NAMES = ["encoder", "decoder/attention", *HOSTILE]


def _header(rank: int, world: int, gpu: bool) -> dict[str, Any]:
    samplers = {"torch_ops": {"status": "ok", "ops": 10},
                "cpu_util": {"status": "ok", "hz": 1000},
                "nvml": ({"status": "ok"} if gpu else
                         {"status": "unavailable", "reason": "<script>alert(5)</script> no NVML here"}),
                "compile": {"status": "ok", "notes": ["</script><b>note</b>"]}}
    devices = [{"id": 0, "name": "<img src=x onerror=alert(6)> GPU", "totalGlobalMem": 80 * 2**30}] if gpu else []
    return {"schema_version": 1, "host": "<b>host</b>", "pid": 100 + rank, "rank": rank, "world_size": world,
            "python": "3.11.7", "torch": "2.13.0", "platform": "Linux", "devices": devices,
            "start_unix_ns": 1_796_000_000_000_000_000, "start_monotonic_ns": 1,
            "command": ["run.py", "--name", "</script><script>alert(7)</script>"],
            "dropped": {"cpu_op": 3}, "samplers": samplers}


def _step_events(step: int, t: float, names: list[str], pid: int, gpu: bool, slow: float) -> tuple[list, float]:
    events = []
    start = t
    for k, name in enumerate(names):
        dur = (40.0 + 13 * k + (step % 5) * 3) * slow
        path = f"step/{name}"
        events.append({"ph": "X", "cat": "region", "pid": pid, "tid": 1, "name": name, "ts": t, "dur": dur,
                       "args": {"path": path, "id": 1000 * step + k + 1, "parent": 1000 * step, "user": name}})
        ops = [("aten::mm", 2e6, 3e5), ("aten::add", 1e4, 1.2e5), (f"op {name}", 5e3, 4e4)]
        for j, (op, flops, nbytes) in enumerate(ops):
            events.append({"ph": "X", "cat": "cpu_op", "pid": pid, "tid": 1, "name": op, "ts": t + 2 + 10 * j,
                           "dur": 8.0, "args": {"region": path, "flops": flops, "bytes": nbytes}})
            if gpu:
                events.append({"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "name": f"kernel_{op}",
                               "ts": t + 5 + 10 * j, "dur": 6.0,
                               "args": {"region": path, "correlation": 10_000 * step + 10 * k + j}})
        t += dur + 5
    events.append({"ph": "X", "cat": "region", "pid": pid, "tid": 1, "name": "step", "ts": start - 1,
                   "dur": t - start + 2, "args": {"path": "step", "id": 1000 * step, "parent": None}})
    return events, t + 20


def _compile_events(pid: int, t0: float) -> list[dict[str, Any]]:
    def ev(name, ts, dur, **args):
        return {"ph": "X", "cat": "compile", "pid": pid, "tid": 1, "name": name, "ts": t0 + ts, "dur": dur,
                "args": {"compile_id": "0/0", **args}}

    return [ev("<frame>", 0, 900, phase="frame", frame="forward<script>", file="model.py", line=3),
            ev("dynamo", 10, 300, phase="dynamo"), ev("inductor", 320, 500, phase="inductor"),
            ev("fx_graph_cache", 330, 0, phase="fx_graph_cache", cache="miss",
               reason="</script><script>window.__pwned=3</script> no entry"),
            ev("graph_break", 200, 0, phase="graph_break", reason='"><img src=x onerror=alert(8)>',
               location="model.py:7"),
            ev("recompile", 880, 0, phase="recompile", reason="javascript:alert(9) guard failed")]


def write_trace(path: Path, *, names: list[str] = NAMES, rank: int = 0, world: int = 1, gpu: bool = False,
                steps: int = 12, slow: float = 1.0) -> Path:
    pid = 100 + rank
    header = _header(rank, world, gpu)
    events: list[dict[str, Any]] = [{"ph": "M", "name": "cuvil_session", "pid": pid, "tid": 0, "args": header}]
    t = 10.0
    for step in range(steps):
        evs, t = _step_events(step, t, names, pid, gpu, slow)
        events += evs
    events += _compile_events(pid, 5.0)
    for k in range(int(t // 50) + 1):
        events.append({"ph": "C", "name": "cpu_util", "pid": pid, "tid": 0, "ts": 50.0 * k,
                       "args": {"total": 40 + k % 30, "process": 30 + k % 20, "cpu0": 50.0}})
        if gpu:
            events.append({"ph": "C", "name": "sm_util", "pid": pid, "tid": 0, "ts": 50.0 * k,
                           "args": {"gpu0": 20 + (7 * k) % 60}})
    events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": 1, "args": {"name": "<i>main</i>"}})
    path.write_text(json.dumps({"traceEvents": events, "cuvil": header}), encoding="utf-8")
    return path


def plan_doc(paths: list[str]) -> dict[str, Any]:
    """A plan.json in the shape of ``cuvil_pgc.recompile.plan_doc`` with hostile fields."""
    regions = [{"path": "<model>", "scope": "<model>", "chosen": "eager", "bottleneck": "host_bound",
                "evidence": {}, "predicted_ms": None, "measured_ms": 2.0, "baseline_ms": 2.4, "alternatives": []}]
    for k, p in enumerate(paths):
        regions.append({
            "path": p, "scope": p, "chosen": f"compile(mode=max-autotune) {p}", "bottleneck": "launch_overhead",
            "evidence": {"ops_per_forward": 3}, "predicted_ms": 0.5 + 0.1 * k, "measured_ms": 0.6 + 0.1 * k,
            "baseline_ms": 1.0 + 0.2 * k,
            "alternatives": [{"config": "<script>alert(10)</script>", "scope": p, "predicted_ms": 0.9,
                              "measured_ms": None, "status": "compile_error",
                              "reason": "</script><script>window.__pwned=4</script>", "reused_record": False}]})
    return {"format": 1, "device": "cpu", "machine": {}, "model_hash": "ab" * 32,
            "tolerances": {"rtol": 1e-3, "atol": 1e-5}, "choices": [], "regions": regions,
            "stale": [{"path": "<img src=x onerror=alert(11)>", "reason": "module changed"}], "unmatched": [],
            "measured_candidates": 7, "reused_records": 0, "space_size": 24, "baseline_ms": 2.4, "plan_ms": 2.0,
            "speedup_vs_eager": 1.2, "final_medians_ms": {}}
