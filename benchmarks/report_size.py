"""Size and time of the HTML report on a 1,000,000-event trace (issue 6, item 3).

Goal: a 1M-event trace gives a report <= 10 MB besides plotly.js, generated in <= 10 s.

The trace is synthesized in our format (``cuvil`` header, so the real reader reads it): a serving
loop of ``steps`` requests, each a ``request`` region holding ``layers`` module regions (3 levels
deep) on two threads, every module region running a chain of CPU ops with FLOPs and bytes, and a
CUDA kernel per op (``--gpu``, the default) with ``sm_util`` counters at 1 kHz, else ``cpu_util``
only; plus one torch.compile with its phases, a cache miss, a graph break and a recompile. The
event count is what the file holds (regions + ops + kernels + compile events; counters and
metadata not counted).

Stages are timed in one process: load (``load_trace``), analyze, render (``render_html``: figures
and page) and write; the report size is printed with and without the inlined plotly.js.

Usage: ``python benchmarks/report_size.py [--events 1000000] [--cpu] [--keep DIR]``.
Figures depend on the machine and its load; run it on a quiet machine for numbers to quote.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import orjson

OPS = [("aten::linear", 4.0e6, 6.0e5), ("aten::gelu", 4.0e4, 3.2e5), ("aten::add", 1.6e4, 1.9e5),
       ("aten::layer_norm", 8.0e4, 2.5e5)]


def _header(gpu: bool) -> dict:
    samplers = {"torch_ops": {"status": "ok"}, "cpu_util": {"status": "ok", "hz": 100},
                "nvml": {"status": "ok", "hz": 1000} if gpu else {"status": "disabled", "reason": "gpu=off"},
                "compile": {"status": "ok"}}
    return {"schema_version": 1, "host": "bench", "pid": 1, "rank": 0, "world_size": 1, "python": "3.11",
            "torch": "2.13.0", "platform": "Linux", "start_unix_ns": 1_796_000_000_000_000_000,
            "start_monotonic_ns": 1, "devices": [{"id": 0, "name": "synthetic GPU"}] if gpu else [],
            "command": ["bench"], "dropped": {}, "samplers": samplers}


def _module_call(events: list, t: float, tid: int, path: str, rid: int, parent: int, gpu: bool) -> float:
    start = t
    for name, flops, nbytes in OPS:
        dur = 6.0 + (rid % 7)
        events.append({"ph": "X", "cat": "cpu_op", "pid": 1, "tid": tid, "name": name, "ts": t, "dur": dur,
                       "args": {"region": path, "flops": flops, "bytes": nbytes}})
        if gpu:
            events.append({"ph": "X", "cat": "kernel", "pid": 0, "tid": 7, "name": f"k_{name[6:]}", "ts": t + 3,
                           "dur": dur * 0.8, "args": {"region": path, "correlation": rid * 8 + len(events) % 8}})
        t += dur + 2.0
    events.append({"ph": "X", "cat": "region", "pid": 1, "tid": tid, "name": path.rsplit("/", 1)[-1],
                   "ts": start - 0.5, "dur": t - start + 1.0, "args": {"path": path, "id": rid, "parent": parent}})
    return t + 1.5


def synthesize(path: Path, events_wanted: int, gpu: bool) -> int:
    per_op = 2 if gpu else 1
    layers, sub = 12, ("attn", "mlp")
    per_request = 1 + layers * (1 + len(sub)) + layers * len(sub) * len(OPS) * per_op
    steps = max(1, events_wanted // per_request)
    events: list[dict] = [{"ph": "M", "name": "cuvil_session", "pid": 1, "tid": 0, "args": _header(gpu)}]
    t, rid = 1000.0, 0
    for step in range(steps):
        tid = 1 + step % 2
        rid += 1
        req, start = rid, t
        for layer in range(layers):
            rid += 1
            lid, lstart = rid, t
            for s in sub:
                rid += 1
                t = _module_call(events, t, tid, f"request/layers.{layer}/{s}", rid, lid, gpu)
            events.append({"ph": "X", "cat": "region", "pid": 1, "tid": tid, "name": f"layers.{layer}",
                           "ts": lstart - 0.2, "dur": t - lstart + 0.4,
                           "args": {"path": f"request/layers.{layer}", "id": lid, "parent": req}})
        events.append({"ph": "X", "cat": "region", "pid": 1, "tid": tid, "name": "request", "ts": start - 1,
                       "dur": t - start + 2, "args": {"path": "request", "id": req, "parent": None}})
        t += 30.0
    n = len(events) - 1 + _add_compile(events)
    _add_counters(events, t, gpu)
    path.write_bytes(orjson.dumps({"traceEvents": events, "cuvil": _header(gpu)}))
    return n


def _add_compile(events: list) -> int:
    rows = [("frame", 0, 5e5, {}), ("dynamo", 1e3, 1e5, {}), ("inductor", 1.2e5, 3e5, {}),
            ("fx_graph_cache", 1.3e5, 0, {"cache": "miss", "reason": "no entry for this key"}),
            ("graph_break", 5e4, 0, {"reason": "data-dependent branch", "location": "model.py:40"}),
            ("recompile", 4.9e5, 0, {"reason": "guard failed: x.size()[0] == 8"})]
    for phase, ts, dur, extra in rows:
        events.append({"ph": "X", "cat": "compile", "pid": 1, "tid": 1, "name": phase, "ts": ts, "dur": dur,
                       "args": {"compile_id": "0/0", "phase": phase, **extra}})
    return len(rows)


def _add_counters(events: list, end: float, gpu: bool) -> None:
    step = 1000.0 if gpu else 10_000.0
    k = 0
    while k * step < end:
        ts = k * step
        events.append({"ph": "C", "name": "cpu_util", "pid": 1, "tid": 0, "ts": ts,
                       "args": {"total": 60 + k % 30, "process": 45 + k % 40}})
        if gpu:
            events.append({"ph": "C", "name": "sm_util", "pid": 1, "tid": 0, "ts": ts, "args": {"gpu0": 30 + k % 60}})
        k += 1


def run(path: Path, out: Path) -> dict:
    from plotly.offline import get_plotlyjs

    from cuvil_pgc.analyze.analyzer import analyze
    from cuvil_pgc.analyze.machine import MachineModel
    from cuvil_pgc.trace.reader import load_trace
    from cuvil_pgc.viewer.html import render_html

    machine = MachineModel(device="cpu", name="bench", fingerprint="bench", peak_flops={"fp32": 100e9},
                           mem_bw=10e9, dispatch_overhead_s=3e-6)
    get_plotlyjs()                     # read once outside the timed stages (a file read)
    t0 = time.perf_counter()
    trace = load_trace(str(path))
    t1 = time.perf_counter()
    analysis = analyze(trace, machine=machine)
    t2 = time.perf_counter()
    document = render_html(analysis)
    t3 = time.perf_counter()
    out.write_text(document, encoding="utf-8")
    t4 = time.perf_counter()
    total = len(document.encode("utf-8"))
    plotly = len(get_plotlyjs().encode("utf-8"))
    return {"events": len(trace), "regions": len(analysis.regions),
            "spans_drawn": len(analysis.timeline.spans.get("ts_us", [])),
            "load_s": t1 - t0, "analyze_s": t2 - t1, "render_s": t3 - t2, "write_s": t4 - t3, "total_s": t4 - t0,
            "total_mb": total / 1e6, "without_plotly_mb": (total - plotly) / 1e6, "plotly_mb": plotly / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--cpu", action="store_true", help="CPU-only run (no kernels, cpu_util counters).")
    ap.add_argument("--keep", type=Path, help="Keep the trace and report in this folder.")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="cuvil_report_bench_"))
    folder.mkdir(parents=True, exist_ok=True)
    trace = folder / "big.trace.json"
    t = time.perf_counter()
    n = synthesize(trace, args.events, gpu=not args.cpu)
    print(f"synthesized {n:,} events ({trace.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s")
    r = run(trace, folder / "report.html")
    print(f"read {r['events']:,} events, {r['regions']} regions, {r['spans_drawn']:,} region calls drawn")
    print(f"load    {r['load_s']:6.2f} s\nanalyze {r['analyze_s']:6.2f} s\nrender  {r['render_s']:6.2f} s\n"
          f"write   {r['write_s']:6.2f} s\ntotal   {r['total_s']:6.2f} s   (goal <= 10 s)")
    print(f"report  {r['total_mb']:.2f} MB total, {r['without_plotly_mb']:.2f} MB without plotly.js "
          f"({r['plotly_mb']:.2f} MB)   (goal <= 10 MB without plotly.js)")
    if not args.keep:
        for p in (trace, folder / "report.html"):
            p.unlink(missing_ok=True)
        os.rmdir(folder)


if __name__ == "__main__":
    main()
