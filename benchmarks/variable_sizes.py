"""A service called at several input sizes: the build against each runtime deployed for free sizes.

A service whose requests vary in batch size or sequence length deploys a runtime with its sizes
left free (``dynamic_axes``; OpenVINO's dynamic shapes), or torch.compile, which compiles for free
sizes once a second size comes. This races, per model, interleaved in one process at the
deployment's thread count, at the captured size and three others (each called often, as a service
calls its common sizes):

- ``eager``: the model itself;
- ``compile``: ``torch.compile(model)`` at its defaults, warmed at each size first;
- ``ort`` and ``openvino``: the model's free-size ONNX export (the one ``recompile --dynamic`` makes
  and checks) on ONNX Runtime and OpenVINO, at their default settings, called plainly;
- ``build``: ``recompile(..., dynamic=True)`` with the plan pinned to ``--backend`` (what the search
  chose at the captured size for these models), loaded as a service loads it, after each size was
  called often enough to get a program of its own (:mod:`cuvil_pgc.recompile.size_programs`).

It prints each size's medians, the build over the fastest other contender, and per model and over
all the geometric mean of that ratio over the sizes.

    python benchmarks/variable_sizes.py --models tiny_bert,MODULE:FACTORY --backend openvino
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RIVALS = ("eager", "compile", "ort", "openvino")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", default="transformer,tiny_bert", help="comma-separated zoo names or MODULE_OR_FILE:FACTORY")
    p.add_argument("--backend", default="openvino", choices=("ort", "openvino"))
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch

    sys.path.insert(0, HERE)
    from other_shapes import _plain_call, _race, _resized, _unpacked
    from recompile_speedup import load

    from cuvil_pgc.recompile import load_build, recompile
    from cuvil_pgc.recompile.candidates import Candidate

    torch.set_num_threads(args.threads)
    print(f"{'model':<18} {'sizes':<22} " + " ".join(f"{c:>10}" for c in (*RIVALS, "build")) + f" {'build/best':>11}")
    ratios: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="cuvil-sizes-") as tmp:
        for name in args.models.split(","):
            model, inputs = load(name)
            programs, build = {}, None
            for backend in ("ort", "openvino"):
                made = recompile(model, inputs, plan={"": Candidate("", backend)}, records=False, deployed_race=False,
                                 rounds=3, dynamic=True)
                record = made.plan.choices[0].other_shapes
                if record is None:
                    break
                path = made.save(os.path.join(tmp, f"{name.replace('/', '_').replace(':', '_')}-{backend}.cuvilpkg"))
                programs[backend] = _unpacked(path, record["artifact"], backend, tmp)
                if backend == args.backend:
                    build, build_path = load_build(path, model, allow_unsigned=True), path
            if build is None or len(programs) < 2:
                print(f"{name}: no program for other sizes (see the warning above)")
                continue
            other = build.other_shapes
            compiled = torch.compile(model)
            contenders = {"eager": model, "compile": compiled, "build": build,
                          **{b: _plain_call(b, programs[b], args.threads) for b in ("ort", "openvino")}}
            first, raced, examples = inputs[0], set(), []
            for batch, grow in ((first.shape[0], 0), (first.shape[0] + 1, 0), (first.shape[0], -max(1, first.shape[1] // 2)),
                                (2 * first.shape[0] + 2, -max(1, first.shape[1] // 4))):
                x = tuple(_resized(t, batch, t.shape[1] + grow) if isinstance(sizes[1], str) else _resized(t, batch, t.shape[1])
                          for t, (_, sizes) in zip(inputs, other.inputs, strict=True))
                shapes = tuple(tuple(t.shape) for t in x)
                if shapes in raced or (batch, grow) != (first.shape[0], 0) and not other.fits(x):
                    continue                          # (a size the program does not take, or raced already)
                raced.add(shapes)
                examples.append(x)
                with torch.no_grad():                  # a common size: compiled, and its own program made
                    for _ in range(max(3, other.size_programs.after if other.size_programs is not None else 0)):
                        compiled(*x)
                        build(*x)
                if other.size_programs is not None:
                    other.size_programs.wait(600)
                ms = _race(contenders, x, args.rounds)
                best = min(ms[c] for c in RIVALS)
                ratios.setdefault(name, []).append(best / ms["build"])
                print(f"{name:<18} {', '.join(str(tuple(t.shape)) for t in x):<22} "
                      + " ".join(f"{ms[c]:>8.3f}ms" for c in (*RIVALS, "build")) + f" {best / ms['build']:>10.3f}x", flush=True)
            print(f"{name}: build over the fastest other contender, geometric mean over its sizes "
                  f"{_geomean(ratios[name]):.3f}x; {build.fallback_calls} calls ran the original module")
            print(f"{name}: loading the build {_load_s(build_path, model):.2f} s; with its {len(examples) - 1} other "
                  f"sizes compiled at load (size_examples) {_load_s(build_path, model, examples):.2f} s")
    every = [r for rs in ratios.values() for r in rs]
    if every:
        print(f"over every model and size: geometric mean {_geomean(every):.3f}x, worst {min(every):.3f}x; "
              f"per model {_geomean([_geomean(rs) for rs in ratios.values()]):.3f}x")
    return 0


def _load_s(path: str, model: Any, examples: list[tuple[Any, ...]] | None = None) -> float:
    """Seconds ``load_build`` takes (with ``size_examples``: each of their sizes compiled and checked)."""
    from cuvil_pgc.recompile import load_build

    start = time.perf_counter()
    load_build(path, model, allow_unsigned=True, size_examples=examples)
    return time.perf_counter() - start


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


if __name__ == "__main__":
    sys.exit(main())
