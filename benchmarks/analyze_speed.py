"""Speed and memory of ``load_trace`` + ``analyze`` on large Kineto traces (issues 5 and 25).

Goals: load + analyze <= 1/10 of HolisticTraceAnalysis' parse time of the same 300k-event file,
<= 1.5 GB peak RSS at 3M events, linear scaling from 300k to 3M events.

- The 300k-event trace is a real torch.profiler export (``_kineto_gen.kineto_trace``: a small MLP,
  ``record_shapes=True``, ``record_function`` regions); the 3M one repeats its events with shifted
  timestamps (``_kineto_gen.replicated_trace``).
- Every measurement runs in a fresh Python process (``--child``), which reports its own times and
  peak RSS (``VmHWM`` of /proc/self/status: unlike ``ru_maxrss``, it is not inherited from the
  parent's size at fork, so one measurement's memory never inflates another's).
- Large plain files are read by forked worker processes side by side (``trace/_parallel.py``; one
  per core, at most 8): the default. ``--one-process`` rows read the same file with
  ``CUVIL_READ_WORKERS=0``. Peak RSS is the reading process's; the workers' largest peak
  (``RUSAGE_CHILDREN``, which counts the pages a fork shares with its parent) is reported beside it.
- HolisticTraceAnalysis (``pip install HolisticTraceAnalysis``) parses the same file side by side
  when it is installed (``TraceAnalysis(trace_dir=...)``, its parse only); otherwise that row says so.

Usage: ``python benchmarks/analyze_speed.py [--events 300000] [--scale 10] [--repeat 1] [--no-hta]``.
Figures depend on the machine and its load; run it on a quiet machine for numbers to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def peak_rss_mb() -> float:
    """High-water RSS of this process (VmHWM; ru_maxrss where there is no /proc)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child_load_analyze(path: str) -> dict:
    t0 = time.perf_counter()
    from cuvil_pgc.analyze.analyzer import analyze
    from cuvil_pgc.analyze.machine import MachineModel
    from cuvil_pgc.trace.reader import load_trace

    t_import = time.perf_counter() - t0
    machine = MachineModel(device="cpu", name="bench", fingerprint="bench", peak_flops={"fp32": 100e9},
                           mem_bw=10e9, dispatch_overhead_s=3e-6)
    t1 = time.perf_counter()
    trace = load_trace(path)
    t2 = time.perf_counter()
    rss_load_mb = peak_rss_mb()
    result = analyze(trace, machine=machine)
    t3 = time.perf_counter()
    rss_mb = peak_rss_mb()
    import resource

    workers_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    return {"workers_rss_mb": workers_mb, "events": len(trace), "regions": len(result.regions), "fusion": len(result.fusion_candidates),
            "import_s": t_import, "load_s": t2 - t1, "analyze_s": t3 - t2, "total_s": t3 - t1,
            "rss_load_mb": rss_load_mb, "rss_mb": rss_mb}


def child_hta(path: str) -> dict:
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as d:
        os.symlink(os.path.abspath(path), os.path.join(d, "rank0.json"))
        t0 = time.perf_counter()
        TraceAnalysis(trace_dir=d)
        t1 = time.perf_counter()
    return {"parse_s": t1 - t0, "rss_mb": peak_rss_mb()}


def run_child(mode: str, path: Path, timeout: float = 1800) -> dict:
    env = dict(os.environ)
    if mode == "analyze-one":
        mode, env["CUVIL_READ_WORKERS"] = "analyze", "0"
    cmd = [sys.executable, __file__, "--child", mode, str(path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def hta_available() -> str | None:
    proc = subprocess.run([sys.executable, "-c", "import hta.trace_analysis"], capture_output=True, text=True)
    if proc.returncode == 0:
        return None
    return (proc.stderr.strip().splitlines() or ["not importable"])[-1]


def best_of(mode: str, path: Path, repeat: int) -> dict:
    runs = [run_child(mode, path) for _ in range(repeat)]
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    key = "parse_s" if mode == "hta" else "total_s"
    return min(ok, key=lambda r: r[key])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=300_000)
    ap.add_argument("--scale", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-hta", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("MODE", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        mode, path = args.child
        print(json.dumps(child_load_analyze(path) if mode == "analyze" else child_hta(path)))
        return
    from _kineto_gen import kineto_trace, replicated_trace

    small = kineto_trace(args.events)
    large = replicated_trace(small, args.scale)
    print(f"traces: {small} ({small.stat().st_size / 1e6:.0f} MB), {large} ({large.stat().st_size / 1e6:.0f} MB)")
    a = best_of("analyze", small, args.repeat)
    b = best_of("analyze", large, args.repeat)
    one = best_of("analyze-one", small, args.repeat)
    for label, r in (("small", a), ("large", b), ("small, one process", one)):
        if "error" in r:
            sys.exit(f"load+analyze failed on the {label} trace: {r['error']}")
        print(f"{label}: {r['events']:>9,} events  load {r['load_s']:6.2f} s  analyze {r['analyze_s']:6.2f} s  "
              f"total {r['total_s']:6.2f} s  peak RSS {r['rss_mb']:7.0f} MB (after load {r['rss_load_mb']:.0f}; "
              f"reading workers' largest {r['workers_rss_mb']:.0f})  "
              f"({r['regions']} regions, {r['fusion']} fusion candidates)")
    per_a, per_b = a["total_s"] / a["events"], b["total_s"] / b["events"]
    print(f"scaling: {b['events'] / a['events']:.1f}x events -> {b['total_s'] / a['total_s']:.2f}x time "
          f"(time per event ratio {per_b / per_a:.2f}; 1.00 = linear); "
          f"RSS {b['rss_mb'] / a['rss_mb']:.2f}x")
    print(f"goal <= 1.5 GB peak RSS at {b['events']:,} events: {'met' if b['rss_mb'] <= 1536 else 'MISSED'} "
          f"({b['rss_mb']:.0f} MB; {b['rss_mb'] * 2**20 / b['events']:.0f} bytes per event; each reading worker "
          f"{b['workers_rss_mb']:.0f} MB at most, pages shared with the parent counted in both)")
    if args.no_hta:
        return
    why = hta_available()
    if why:
        print(f"HolisticTraceAnalysis: not measured ({why}); `pip install HolisticTraceAnalysis` to compare")
        return
    h = best_of("hta", small, args.repeat)
    if "error" in h:
        print(f"HolisticTraceAnalysis parse failed: {h['error']}")
        return
    ratio = a["total_s"] / h["parse_s"]
    print(f"HTA parse of the small trace: {h['parse_s']:.2f} s, peak RSS {h['rss_mb']:.0f} MB; "
          f"cuvil load+analyze / HTA parse = {ratio:.3f} (goal <= 0.1: {'met' if ratio <= 0.1 else 'MISSED'}); "
          f"load alone {a['load_s'] / h['parse_s']:.3f}, analyze alone {a['analyze_s'] / h['parse_s']:.3f}; "
          f"in one process {one['total_s'] / h['parse_s']:.3f}")


if __name__ == "__main__":
    main()
