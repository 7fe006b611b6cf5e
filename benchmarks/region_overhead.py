"""Cost of one region enter/exit pair, side by side in one process and one run.

Prints ns per pair (median of repeats, the empty loop subtracted) for: an empty loop, two
perf_counter_ns() calls, contextlib.nullcontext(), ProfileRegion with no session, ProfileRegion
recording, torch.profiler.record_function (no profiler running), nvtx.annotate (if installed), an
OpenTelemetry SDK span, ProfileRegion in always-on aggregate mode; then the ratios the foundation issue sets goals for:
  recording <= 1/8 of record_function, <= 1.5x nvtx.annotate; no session <= 1.5x nullcontext;
  aggregate mode <= recording.

Usage: python benchmarks/region_overhead.py [--iters N] [--repeats R]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from cuvil_pgc import ProfileRegion, profile  # noqa: E402


def _loop_empty(n: int) -> None:
    for _ in range(n):
        pass


def _loop_clock(n: int) -> None:
    now = time.perf_counter_ns
    for _ in range(n):
        now()
        now()


def _loop_nullcontext(n: int) -> None:
    null = contextlib.nullcontext
    for _ in range(n):
        with null():
            pass


def _loop_region(n: int) -> None:
    for _ in range(n):
        with ProfileRegion("step"):
            pass


def _loop_record_function(n: int) -> None:
    from torch.profiler import record_function

    for _ in range(n):
        with record_function("step"):
            pass


def _loop_nvtx(n: int) -> None:
    import nvtx

    for _ in range(n):
        with nvtx.annotate("step"):
            pass


def _otel_loop() -> Callable[[int], None]:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("cuvil-pgc-bench")

    def loop(n: int) -> None:
        for _ in range(n):
            with tracer.start_as_current_span("step"):
                pass
    return loop


def measure(loop: Callable[[int], None], iters: int, repeats: int) -> float:
    """Median ns per iteration over ``repeats`` runs of ``iters`` iterations."""
    loop(min(iters, 2000))  # warm-up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        loop(iters)
        samples.append((time.perf_counter_ns() - t0) / iters)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=50_000)
    parser.add_argument("--repeats", type=int, default=9)
    opts = parser.parse_args()
    it, rep = opts.iters, opts.repeats

    cases: list[tuple[str, Callable[[int], None]]] = [
        ("empty loop", _loop_empty),
        ("2x perf_counter_ns", _loop_clock),
        ("nullcontext", _loop_nullcontext),
        ("ProfileRegion, no session", _loop_region),
    ]
    try:
        import torch  # noqa: F401

        cases.append(("record_function (no profiler)", _loop_record_function))
    except ImportError:
        pass
    try:
        import nvtx  # noqa: F401

        cases.append(("nvtx.annotate", _loop_nvtx))
    except ImportError:
        pass
    cases.append(("OpenTelemetry SDK span", _otel_loop()))

    raw = {name: measure(loop, it, rep) for name, loop in cases}
    with tempfile.TemporaryDirectory() as tmp:
        # Recording: buffers are drained by the writer thread while the loop runs, as in production.
        with profile(os.path.join(tmp, "bench.trace.json"), ops=False, compile=False, sample_hz=0,
                     gpu="off", buffer_events=1 << 22) as session:
            raw["ProfileRegion, recording"] = measure(_loop_region, it, rep)
        dropped = session.dropped.get("regions", 0)
        with profile(os.path.join(tmp, "bench.summary.json"), mode="aggregate", flush_s=1.0):
            raw["ProfileRegion, aggregate mode"] = measure(_loop_region, it, rep)

    base = raw["empty loop"]
    net = {name: max(v - base, 0.1) for name, v in raw.items()}
    print(f"{'case':34s} {'ns/pair':>9s} {'net ns':>9s}")
    for name, v in raw.items():
        print(f"{name:34s} {v:9.1f} {net[name]:9.1f}")
    print(f"(regions dropped while recording: {dropped})")
    print("\nratios (net of the empty loop):")
    _ratio(net, "ProfileRegion, no session", "nullcontext", 1.5)
    if "record_function (no profiler)" in net:
        _ratio(net, "ProfileRegion, recording", "record_function (no profiler)", 1 / 8)
    if "nvtx.annotate" in net:
        _ratio(net, "ProfileRegion, recording", "nvtx.annotate", 1.5)
    _ratio(net, "ProfileRegion, recording", "OpenTelemetry SDK span", None)
    _ratio(net, "ProfileRegion, aggregate mode", "ProfileRegion, recording", 1.0)


def _ratio(net: dict[str, float], a: str, b: str, goal: float | None) -> None:
    r = net[a] / net[b]
    verdict = "" if goal is None else (f"  goal <= {goal:.3g}: " + ("met" if r <= goal else "NOT met"))
    print(f"  {a} / {b} = {r:.3f}{verdict}")


if __name__ == "__main__":
    main()
