"""Cost of one region enter/exit pair, side by side in one process and one run.

Cases: an empty loop, two perf_counter_ns() calls, contextlib.nullcontext(), ProfileRegion with no
session, ProfileRegion recording (the writer thread draining and serialising as in production),
ProfileRegion in always-on aggregate mode, torch.profiler.record_function (no profiler running),
nvtx.annotate (if installed) and an OpenTelemetry SDK span. Prints ns per pair (median of
repeats) and net of the empty loop, then the ratios the issues set goals for:
  no session <= 1.5x nullcontext; recording <= 1/8 of record_function and <= 1.5x nvtx.annotate;
  aggregate mode <= recording.

Wall-clock figures on a shared machine swing with its load. ``--instructions`` also counts CPU
instructions per pair with valgrind's callgrind (each case run at two loop lengths, the difference
divided by the extra iterations), which is repeatable whatever else the machine is doing.

Usage: python benchmarks/region_overhead.py [--iters N] [--repeats R] [--instructions]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from cuvil_pgc import ProfileRegion, profile  # noqa: E402

EMPTY, NULL, NO_SESSION = "empty loop", "nullcontext", "ProfileRegion, no session"
RECORDING, AGGREGATE = "ProfileRegion, recording", "ProfileRegion, aggregate mode"
RECORD_FUNCTION, NVTX, OTEL = "record_function (no profiler)", "nvtx.annotate", "OpenTelemetry SDK span"


def _region_loop(n: int) -> None:
    for _ in range(n):
        with ProfileRegion("step"):
            pass


@contextlib.contextmanager
def _recording() -> Iterator[None]:
    with tempfile.TemporaryDirectory() as tmp:
        with profile(os.path.join(tmp, "bench.trace.json"), ops=False, compile=False, sample_hz=0,
                     gpu="off", buffer_events=1 << 22):
            yield


@contextlib.contextmanager
def _aggregating() -> Iterator[None]:
    with tempfile.TemporaryDirectory() as tmp:
        with profile(os.path.join(tmp, "bench.summary.json"), mode="aggregate"):   # production's flush_s
            yield


def _cases(only: str | None = None) -> dict[str, tuple[Callable[[int], None], Callable[[], Any]]]:
    """name -> (loop, context the loop runs in); cases whose package is missing are left out.
    With ``only``, just that case is built (callgrind runs must not import torch needlessly)."""
    none = contextlib.nullcontext

    def empty(n: int) -> None:
        for _ in range(n):
            pass

    def clock(n: int) -> None:
        now = time.perf_counter_ns
        for _ in range(n):
            now()
            now()

    def null(n: int) -> None:
        ctx = contextlib.nullcontext
        for _ in range(n):
            with ctx():
                pass

    cases = {EMPTY: (empty, none), "2x perf_counter_ns": (clock, none), NULL: (null, none),
             NO_SESSION: (_region_loop, none), RECORDING: (_region_loop, _recording),
             AGGREGATE: (_region_loop, _aggregating)}
    if only is not None and only in cases:
        return {only: cases[only]}
    with contextlib.suppress(ImportError):
        if only not in (None, RECORD_FUNCTION):
            raise ImportError
        from torch.profiler import record_function

        def rf(n: int) -> None:
            for _ in range(n):
                with record_function("step"):
                    pass
        cases[RECORD_FUNCTION] = (rf, none)
    with contextlib.suppress(ImportError):
        if only not in (None, NVTX):
            raise ImportError
        import nvtx

        def annotate(n: int) -> None:
            for _ in range(n):
                with nvtx.annotate("step"):
                    pass
        cases[NVTX] = (annotate, none)
    with contextlib.suppress(ImportError):
        if only not in (None, OTEL):
            raise ImportError
        from opentelemetry.sdk.trace import TracerProvider

        tracer = TracerProvider().get_tracer("cuvil-pgc-bench")

        def span(n: int) -> None:
            for _ in range(n):
                with tracer.start_as_current_span("step"):
                    pass
        cases[OTEL] = (span, none)
    return cases


def measure(loop: Callable[[int], None], iters: int, repeats: int) -> float:
    """Median ns per iteration over ``repeats`` runs of ``iters`` iterations."""
    loop(min(iters, 2000))  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        loop(iters)
        samples.append((time.perf_counter_ns() - t0) / iters)
    return statistics.median(samples)


def instructions(case: str, short: int = 2000, long: int = 22000) -> float | None:
    """Instructions per pair under callgrind (None without valgrind)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return None
    counts = []
    for n in (short, long):
        out = subprocess.run([valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                              __file__, "--run-case", case, "--iters", str(n)],
                             capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        line = next((ln for ln in out.stderr.splitlines() if "Collected" in ln), None)
        if line is None:
            return None
        counts.append(int(line.split()[-1]))
    return (counts[1] - counts[0]) / (long - short)


def _report(title: str, raw: dict[str, float], unit: str) -> None:
    base = raw[EMPTY]
    net = {name: max(v - base, 0.1) for name, v in raw.items()}
    print(f"\n{title}\n{'case':34s} {unit + '/pair':>12s} {'net':>12s}")
    for name, v in raw.items():
        print(f"{name:34s} {v:12.1f} {net[name]:12.1f}")
    print("ratios (net of the empty loop):")
    for a, b, goal in ((NO_SESSION, NULL, 1.5), (RECORDING, RECORD_FUNCTION, 1 / 8), (RECORDING, NVTX, 1.5),
                       (RECORDING, OTEL, None), (AGGREGATE, RECORDING, 1.0)):
        if a in net and b in net:
            r = net[a] / net[b]
            verdict = "" if goal is None else f"  goal <= {goal:.3g}: " + ("met" if r <= goal else "NOT met")
            print(f"  {a} / {b} = {r:.3f}{verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--instructions", action="store_true", help="also count instructions (callgrind)")
    parser.add_argument("--run-case", help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.run_case:                      # one case, once: what callgrind counts
        loop, context = _cases(opts.run_case)[opts.run_case]
        with context():
            # Start-up garbage (imports, the session's own start) is collected first: else a full
            # collection due any moment lands in the long run of one case and not another's,
            # adding hundreds of instructions per pair at random.
            gc.collect()
            loop(opts.iters)
        return
    cases = _cases()
    wall = {}
    for name, (loop, context) in cases.items():
        with context():
            wall[name] = measure(loop, opts.iters, opts.repeats)
    _report("wall clock", wall, "ns")
    if opts.instructions:
        counted = {name: instructions(name) for name in cases}
        if None in counted.values():
            print("\n(valgrind not available: no instruction counts)")
        else:
            _report("CPU instructions (callgrind)", counted, "instr")


if __name__ == "__main__":
    main()
