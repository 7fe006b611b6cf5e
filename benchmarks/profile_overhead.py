"""Profiling overhead on the bundled CNN: eager step time alone, with regions, with regions + ops.

One process, one run, modes interleaved round by round (rotating order, so drift and noisy
neighbours hit every mode alike). Each round runs each mode for ``--steps`` timed forward passes
after ``--warmup`` untimed ones:

  eager        the model as it is, no session, no hooks
  regions      a recording session (ops off, no utilization sampling) and instrument_module regions
               down to ``--depth`` (model, stem, residual stages, pool, head at depth 2)
  regions+ops  the same plus operator capture (torch_ops sampler: torch.profiler CPU ops with shapes)
  ops-noshape  (with --no-shapes-too) regions + ops with record_shapes=False

Prints the median step time of each mode over all timed steps, the overhead against eager, and
the goals of issue 3 (regions <= 2 %, regions + ops <= 25 %). Also prints what op capture costs
outside the steps: profiler start, stop (disable) and our post-processing, per session.

Usage: python benchmarks/profile_overhead.py [--rounds R] [--steps N] [--depth D] [--threads T]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch  # noqa: E402

from cuvil_pgc.instrument import Session, SessionConfig  # noqa: E402
from cuvil_pgc.instrument.module import instrument_module  # noqa: E402
from cuvil_pgc.instrument.samplers.torch_ops import TorchOpSampler  # noqa: E402
from cuvil_pgc.zoo import cnn  # noqa: E402

GOALS = {"regions": 2.0, "regions+ops": 25.0}


def _timed_steps(model: Any, inputs: tuple, steps: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        model(*inputs)
    times = []
    now = time.perf_counter_ns
    for _ in range(steps):
        t0 = now()
        model(*inputs)
        times.append((now() - t0) / 1e3)
    return times


def _session(path: str, ops: bool, record_shapes: bool) -> Session:
    config = SessionConfig(path=path, ops=ops, gpu="off", sample_hz=0, compile=False,
                           record_shapes=record_shapes)
    return Session(config, samplers=[TorchOpSampler()] if ops else [])


class Mode:
    """One way of running the model; ``run`` returns the step times (µs) of one round."""

    def __init__(self, name: str, ops: bool | None, record_shapes: bool = True) -> None:
        self.name, self.ops, self.record_shapes = name, ops, record_shapes
        self.steps_us: list[float] = []
        self.sessions: list[dict[str, Any]] = []

    def run(self, model: Any, inputs: tuple, depth: int, steps: int, warmup: int, tmp: str) -> None:
        if self.ops is None:
            self.steps_us += _timed_steps(model, inputs, steps, warmup)
            return
        path = os.path.join(tmp, f"{self.name}-{len(self.sessions)}.trace.json")
        handle = instrument_module(model, depth=depth)
        t0 = time.perf_counter()
        session = _session(path, self.ops, self.record_shapes).start()
        t1 = time.perf_counter()
        try:
            self.steps_us += _timed_steps(model, inputs, steps, warmup)
        finally:
            t2 = time.perf_counter()
            session.stop()
            t3 = time.perf_counter()
            handle.remove()
        self.sessions.append(_session_costs(path, t1 - t0, t3 - t2))
        os.remove(path)


def _session_costs(path: str, start_s: float, stop_s: float) -> dict[str, Any]:
    with open(path) as f:
        trace = json.load(f)
    status = trace["cuvil"]["samplers"].get("torch_ops", {})
    return {"start_ms": start_s * 1e3, "stop_ms": stop_s * 1e3, "ops": status.get("ops", 0),
            "disable_ms": status.get("disable_ms"), "process_ms": status.get("process_ms"),
            "bytes": os.path.getsize(path)}


def run(rounds: int, steps: int, warmup: int, depth: int, no_shapes_too: bool) -> list[Mode]:
    model, inputs = cnn()
    modes = [Mode("eager", None), Mode("regions", False), Mode("regions+ops", True)]
    if no_shapes_too:
        modes.append(Mode("ops-noshape", True, record_shapes=False))
    with torch.inference_mode(), tempfile.TemporaryDirectory() as tmp:
        _timed_steps(model, inputs, 20, 0)  # first-call costs (allocator, oneDNN primitives)
        for r in range(rounds):
            for i in range(len(modes)):
                modes[(r + i) % len(modes)].run(model, inputs, depth, steps, warmup, tmp)
    return modes


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def report(modes: list[Mode], rounds: int, steps: int, print_fn: Callable[[str], None] = print) -> None:
    base = _median(modes[0].steps_us)
    print_fn(f"CNN (cuvil_pgc.zoo.cnn), {rounds} rounds x {steps} steps per mode, torch {torch.__version__}, "
             f"{torch.get_num_threads()} intra-op threads")
    print_fn(f"{'mode':<13} {'median us':>10} {'p90 us':>9} {'overhead':>9}  goal")
    for mode in modes:
        med = _median(mode.steps_us)
        p90 = statistics.quantiles(mode.steps_us, n=10)[-1]
        over = (med / base - 1.0) * 100.0
        goal = GOALS.get(mode.name)
        verdict = "" if goal is None else f"<= {goal:g}%: {'met' if over <= goal else 'NOT met'}"
        print_fn(f"{mode.name:<13} {med:>10.1f} {p90:>9.1f} {over:>8.1f}%  {verdict}")
    for mode in modes:
        if not mode.sessions:
            continue
        s = mode.sessions
        print_fn(f"{mode.name}: per session (median of {len(s)}) start {_median([x['start_ms'] for x in s]):.1f} ms, "
                 f"stop {_median([x['stop_ms'] for x in s]):.1f} ms"
                 + (f" (profiler disable {_median([x['disable_ms'] for x in s]):.1f} ms, our post-processing "
                    f"{_median([x['process_ms'] for x in s]):.1f} ms for {int(_median([x['ops'] for x in s]))} ops)"
                    if mode.ops else "")
                 + f", trace {int(_median([x['bytes'] for x in s])) // 1024} KiB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--depth", type=int, default=2, help="instrument_module depth (2: top-level blocks)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--no-shapes-too", action="store_true", help="also time ops with record_shapes=False")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = run(args.rounds, args.steps, args.warmup, args.depth, args.no_shapes_too)
    report(modes, args.rounds, args.steps)


if __name__ == "__main__":
    main()
