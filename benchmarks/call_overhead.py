"""What the build's own call costs over the runtime called plainly (issue 26).

Recompiles the model with its plan pinned to the whole model on one runtime at its defaults, saves
the signed build, then races, each in worker processes of its own (``_deployed_race.py``), the
build through ``load_build`` against the same exported file called the way a user calls that
runtime. Both run the same session or compiled model, so the ratio is the build's call path alone
(the lean call, the hook check, output rebuilding): where a build's plan is a runtime at its
defaults, this is what it loses to that runtime. The effects are 1-2%, the size of the noise
between runs, so it repeats the race (--runs) and prints each run's ratio and their median.
Where the C lean call of a build is built (``_leancall.c``), a third contender is the same
build with its lean call in Python (``CUVIL_PGC_PURE_PYTHON``), what a machine without a
C compiler runs.

    python benchmarks/call_overhead.py --model transformer --backend openvino --runs 5

``--backend compile`` races a build of the whole model as a torch.compile program against
``torch.compile(model)``: both compile the same program in their own process, so the ratio is the
build's per-call checks (its captured inputs, autograd, hooks) over Dynamo's own. ``--backend aoti``
races a build of the whole model as an AOTInductor package against the same package's runner
called on the flat input list (``loader.boxed_run``, the fastest call it has).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="transformer", help="a zoo name or MODULE_OR_FILE:FACTORY")
    p.add_argument("--backend", default="openvino", choices=("ort", "openvino", "compile", "aoti"))
    p.add_argument("--precision", default="fp32", choices=("fp32", "bf16"),
                   help="OpenVINO's inference precision (bf16: its own default on CPUs with AMX)")
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--rounds", type=int, default=48)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()

    import torch

    sys.path.insert(0, HERE)
    from _deployed_race import race_in_processes
    from recompile_speedup import load

    from cuvil_pgc.recompile import lean_call, recompile
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.signing import generate_keypair

    torch.set_num_threads(args.threads)
    model, inputs = load(args.model)
    if args.precision != "fp32" and args.backend != "openvino":
        p.error("--precision bf16 is OpenVINO's")
    cand = Candidate("", args.backend, precision=args.precision)
    # the guard wide open: both contenders run the same artifact, and this measures only the call
    build = recompile(model, inputs, records=False, deployed_race=False, plan={"": cand}, rtol=1.0, atol=1.0)
    artifact = build.result.realized[""].artifact      # None for compile: the plain contender compiles
    with tempfile.TemporaryDirectory(prefix="cuvil-overhead-") as tmp:
        key, pub = generate_keypair(os.path.join(tmp, "k.key"))
        path = build.save(os.path.join(tmp, "b.cuvilpkg"), signing_key=str(key))
        base = {"model": args.model, "threads": args.threads}
        plain = "openvino-native" if args.precision == "bf16" else args.backend     # the worker's bf16 OpenVINO
        specs = {"plain": {**base, "kind": plain, "path": artifact},
                 "build": {**base, "kind": "build", "path": path, "pubkey": str(pub)}}
        if lean_call.ACCELERATED:
            specs["build-python"] = {**specs["build"], "pure_python": True}
        ratios, python_ratios = [], []
        for run in range(args.runs):
            medians, failed = race_in_processes(specs, args.rounds)
            if failed:
                print(f"a worker failed: {failed}", file=sys.stderr)
                return 1
            ratios.append(medians["build"] / medians["plain"])
            python = ""
            if "build-python" in medians:
                python_ratios.append(medians["build-python"] / medians["plain"])
                python = f", checked in Python {medians['build-python'] * 1e3:.4f} ms ({python_ratios[-1]:.3f}x)"
            print(f"run {run + 1}: plain {medians['plain'] * 1e3:.4f} ms, build {medians['build'] * 1e3:.4f} ms, "
                  f"build / plain {ratios[-1]:.3f}x{python}", flush=True)
    print(f"{args.model} on {cand.config}: build / plain, median of {args.runs} runs: "
          f"{statistics.median(ratios):.3f}x (runs {min(ratios):.3f}-{max(ratios):.3f}x)"
          + (f"; checked in Python: {statistics.median(python_ratios):.3f}x" if python_ratios else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
