"""How fast load_trace parses a large torch.profiler trace, next to plain JSON parsers.

    python benchmarks/load_speed.py [--events 300000] [--repeat 3] [--scale 10]

Generates (once, cached under /tmp/cuvil_bench) a real torch.profiler Chrome trace of a small
model with ``record_shapes=True`` holding at least ``--events`` events (~125 MB at 300k), then,
in one run, times in fresh subprocesses (one per method, so peak RSS is its own):

- ``load_trace``: file → columnar Trace (decode, columns, region paths, attribution, sort);
- ``msgspec typed``: only the typed decode load_trace starts with (its parse floor);
- ``orjson.loads`` and ``json.loads``: the same file into Python dicts (what dict-based readers
  such as HolisticTraceAnalysis start from, before any DataFrame work).

Prints best and median wall time and best CPU time (less distorted by other load on a shared
machine) of ``--repeat`` runs, peak RSS and RSS growth per method, and the ratios. ``--scale N`` also loads a trace of N copies of the events (shifted in time) to show
how load_trace scales. Figures depend on the machine and its load: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _kineto_gen import count_events, kineto_trace, replicated_trace  # noqa: E402

_CHILD = r"""
import gc, json, sys, time
method, path, repeat = sys.argv[1], sys.argv[2], int(sys.argv[3])
import orjson, msgspec
from cuvil_pgc.trace import load_trace
from cuvil_pgc.trace._decode import KinetoDocument

def run():
    if method == "load_trace":
        return load_trace(path)
    with open(path, "rb") as f:
        data = f.read()
    if method == "msgspec typed":
        return msgspec.json.decode(data, type=KinetoDocument)
    if method == "orjson.loads":
        return orjson.loads(data)
    return json.loads(data)

def hwm_kb():    # VmHWM: peak RSS of this process image (ru_maxrss would include the parent's before exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))

base = hwm_kb()
times, cpu = [], []
for _ in range(repeat):
    t0, c0 = time.perf_counter(), time.process_time()
    result = run()
    times.append(time.perf_counter() - t0)
    cpu.append(time.process_time() - c0)
    del result
    gc.collect()
peak = hwm_kb()
print(json.dumps({"times": times, "cpu": cpu, "base_kb": base, "peak_kb": peak}))
"""
METHODS = ("load_trace", "msgspec typed", "orjson.loads", "json.loads")


def measure(method: str, path: Path, repeat: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, method, str(path), str(repeat)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def report(path: Path, repeat: int, methods: tuple[str, ...] = METHODS) -> dict[str, dict]:
    n = count_events(path)
    size = path.stat().st_size
    print(f"\n{path.name}: {n:,} events, {size / 1e6:.1f} MB, best/median of {repeat}")
    print(f"{'method':<16}{'best s':>9}{'median s':>10}{'best CPU s':>12}{'peak RSS MB':>13}"
          f"{'RSS growth MB':>15}{'µs/event':>10}")
    results = {}
    for method in methods:
        r = measure(method, path, repeat)
        best, median = min(r["times"]), statistics.median(r["times"])
        growth = (r["peak_kb"] - r["base_kb"]) / 1024
        results[method] = {"best": best, "median": median, "cpu": min(r["cpu"]), "peak_mb": r["peak_kb"] / 1024,
                           "growth_mb": growth}
        print(f"{method:<16}{best:>9.3f}{median:>10.3f}{min(r['cpu']):>12.3f}{r['peak_kb'] / 1024:>13.0f}"
              f"{growth:>15.0f}{best / n * 1e6:>10.2f}")
    lt, lt_cpu = results["load_trace"]["best"], results["load_trace"]["cpu"]
    for other in methods[1:]:
        print(f"{other} / load_trace: {results[other]['best'] / lt:.2f}x wall time, "
              f"{results[other]['cpu'] / lt_cpu:.2f}x CPU time")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scale", type=int, default=0, help="also load N replicated copies (load_trace only)")
    ns = parser.parse_args()
    path = kineto_trace(ns.events)
    base = report(path, ns.repeat)
    if ns.scale > 1:
        big = replicated_trace(path, ns.scale)
        scaled = report(big, 1, ("load_trace",))["load_trace"]
        ratio = scaled["best"] / base["load_trace"]["best"]
        print(f"x{ns.scale} events: load_trace took {ratio:.1f}x as long "
              f"({ratio / ns.scale:.2f} of linear), peak RSS {scaled['peak_mb']:.0f} MB")


if __name__ == "__main__":
    main()
