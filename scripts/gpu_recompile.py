#!/usr/bin/env python
"""GPU recompile check: record, recompile and race a small model on a CUDA machine (issue 26).

Each step runs in a process of its own, as a user runs it, and prints what it found:

1. ``cuvil-pgc doctor``: which runtime backends run here and, for each that does not (Torch-TensorRT
   not installed, an ONNX Runtime without the CUDA provider), why and what to install;
2. ``cuvil-pgc profile --model THIS_FILE:small_model``: the model's steps, with CUPTI kernels and NVML
   counters where they run (``--gpu auto``);
3. ``cuvil-pgc analyze`` of that trace;
4. ``cuvil-pgc keygen`` and ``cuvil-pgc recompile --device cuda`` over eager, torch.compile,
   AOTInductor, CUDA graphs, ONNX Runtime's CUDA and TensorRT providers and Torch-TensorRT, signed;
   then the plan: what each region runs, every measured candidate with its status and reason, and
   the candidates of each backend the space held; and the calibration probe's records, with the
   fixed cost per call the cost models fit from them;
5. the race (``THIS_FILE race``, a fresh process; again without the build where that one fails):
   ``load_build`` with the signature required, then
   eager, torch.compile, torch.compile with CUDA graphs (mode reduce-overhead) and the build in
   interleaved rounds (CUDA-synchronized medians), and the build's outputs against eager's.

Exit status: 0 every step ran, 1 a step failed (its output is printed), 2 no CUDA device with
``--device cuda``. ``--device cpu`` runs the same flow without the GPU backends (to try it here).

Usage: python scripts/gpu_recompile.py --out DIR [--device cuda] [--budget 6] [--rounds 30]

On the lent H200 (the device tool; its image has torch, onnx, onnxruntime and nvidia-ml-py), run
from the repository root with ``PYTHONPATH=$PWD`` and these wheels for Python 3.12 installed
with ``pip install --no-deps --target``: msgspec, orjson, opentelemetry-api, opentelemetry-sdk,
opentelemetry-semantic-conventions, cryptography, cffi, pycparser, cupti-python 13.0.* and
pyelftools (12 MB in all). With ``--budget 4`` it took about 4.5 minutes there (2026-12-04).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
BACKENDS = "eager,compile,aoti,cudagraphs,ort,tensorrt"


def small_model():
    """A conv stem and a stack of small GEMMs at batch 8: launch-bound on a GPU, where CUDA graphs,
    fusion and the runtimes differ most (the device is the GPU where there is one)."""
    import torch
    from torch import nn

    class SmallNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
                                      nn.Conv2d(32, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(4),
                                      nn.Flatten())
            self.head = nn.Sequential(*[m for _ in range(6) for m in (nn.Linear(512, 512), nn.GELU())],
                                      nn.Linear(512, 10))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.stem(x)).softmax(-1)

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() and os.environ.get("GPU_RECOMPILE_DEVICE", "cuda") == "cuda" else "cpu"
    return SmallNet().to(device).eval(), (torch.rand(8, 3, 32, 32, device=device),)


# ----------------------------------------------------------------------------- the steps
class Steps:
    def __init__(self, device: str) -> None:
        self.failed: list[str] = []
        # a crash in native code (a loaded package, a runtime) prints the Python stack
        self.env = {**os.environ, "GPU_RECOMPILE_DEVICE": device, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1"}

    def cli(self, name: str, args: list[str], timeout: float, stdout: Path | None = None) -> str | None:
        return self.run(name, [sys.executable, "-m", "cuvil_pgc", *args], timeout, stdout)

    def run(self, name: str, cmd: list[str], timeout: float, stdout: Path | None = None) -> str | None:
        print(f"\n=== {name}: {' '.join(Path(c).name if c == sys.executable else c for c in cmd)}", flush=True)
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env)
        except subprocess.TimeoutExpired as exc:
            print(_text(exc.stdout) + _text(exc.stderr))
            return self._fail(name, f"timed out after {timeout:.0f} s")
        took = time.perf_counter() - t0
        if stdout is not None:
            stdout.write_text(proc.stdout)
        shown = proc.stderr if stdout is not None else proc.stdout + proc.stderr
        print(_tail(shown, 60))
        print(f"--- {name}: exit {proc.returncode} in {took:.1f} s", flush=True)
        if proc.returncode != 0:
            return self._fail(name, f"exit {proc.returncode}")
        return proc.stdout

    def _fail(self, name: str, why: str) -> None:
        print(f"--- {name}: FAILED ({why})", flush=True)
        self.failed.append(f"{name}: {why}")
        return None


def _text(value: str | bytes | None) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


def _tail(text: str, lines: int) -> str:
    kept = text.rstrip().splitlines()
    return "\n".join(([f"[{len(kept) - lines} lines above]"] if len(kept) > lines else []) + kept[-lines:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="Folder for the trace, the build, the plan and logs.")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--budget", type=int, default=6, help="Candidates the search measures.")
    parser.add_argument("--rounds", type=int, default=30, help="Interleaved rounds of the race.")
    parser.add_argument("--recompile-timeout", type=float, default=420.0, help="Seconds before the recompile step is stopped.")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"gpu_recompile: no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none",
              file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"torch {torch.__version__} (CUDA {torch.version.cuda}); "
          f"{torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU'}; python {sys.version.split()[0]}")
    steps = Steps(args.device)
    spec = f"{HERE}:small_model"
    trace, build, key = out / "small.trace.json", out / "small.cuvilpkg", out / "signing.key"
    steps.cli("doctor", ["doctor"], 120)
    if steps.cli("profile", ["profile", "--model", spec, "--iters", "40", "-o", str(trace)], 240) is None:
        return _finish(steps)
    steps.cli("analyze", ["analyze", str(trace)], 180)
    steps.cli("keygen", ["keygen", "-o", str(key)], 60)
    backends = BACKENDS if args.device == "cuda" else "eager,compile,aoti,ort,openvino"
    plan_json = steps.cli("recompile", ["recompile", str(trace), "--model", spec, "--device", args.device,
                                        "--backends", backends, "--budget", str(args.budget), "--sign", str(key),
                                        "-o", str(build), "--json", "-q"],
                          args.recompile_timeout, stdout=out / "recompile.json")
    if plan_json is None:
        return _finish(steps)
    print_plan(json.loads(plan_json))
    print_probes()
    race_args = [str(key) + ".pub", args.device, str(args.rounds)]
    if steps.run("race", [sys.executable, str(HERE), "race", str(build), *race_args], 200) is None:
        steps.run("race without the build", [sys.executable, str(HERE), "race", "-", *race_args], 200)
    return _finish(steps)


def _finish(steps: Steps) -> int:
    if steps.failed:
        print(f"\ngpu_recompile: {len(steps.failed)} step(s) failed: " + "; ".join(steps.failed), file=sys.stderr)
        return 1
    print("\ngpu_recompile: every step ran")
    return 0


def print_plan(doc: dict) -> None:
    """The plan: each region's choice, every candidate that was measured or turned down for a
    reason other than the budget, how many candidates of each backend the space held, and the final
    race's medians (a region's ``measured_ms`` comes from there, its alternatives' from the search)."""
    plan = doc.get("plan", doc)
    print(f"\nplan: {plan.get('measured_candidates')} of {plan.get('space_size')} candidates measured; "
          f"eager {plan.get('baseline_ms')} ms, plan {plan.get('plan_ms')} ms, "
          f"speedup vs eager {plan.get('speedup_vs_eager')}")
    backends: Counter[str] = Counter()
    for region in plan.get("regions", []):
        print(f"  {region.get('path')}: {region.get('chosen')} (bottleneck {region.get('bottleneck')}; "
              f"measured {region.get('measured_ms')} ms, eager {region.get('baseline_ms')} ms)")
        for alt in region.get("alternatives", []):
            backends[alt.get("config", "").split("+")[0]] += 1
            budget = alt.get("status") == "not_measured" and "budget" in (alt.get("reason") or "")
            if alt.get("measured_ms") is not None or (alt.get("reason") and not budget):
                reason = f" — {alt['reason']}" if alt.get("reason") else ""
                print(f"      {alt.get('scope') or '<model>'}::{alt.get('config')}: {alt.get('status')}, "
                      f"predicted {alt.get('predicted_ms')} ms, measured {alt.get('measured_ms')} ms{reason}")
    print(f"  candidates by backend, all scopes: {dict(backends)}")
    for default in plan.get("runtime_defaults", []):
        print(f"  runtime default {default.get('config')}: {default.get('status')}, {default.get('measured_ms')} ms"
              f"{' — ' + default['reason'] if default.get('reason') else ''}")
    if plan.get("final_medians_ms"):
        print(f"  final race in the searching process (ms): {plan['final_medians_ms']}")
    if plan.get("deployed_medians_ms"):
        print(f"  deployed race: {plan['deployed_medians_ms']}")
    for name, why in (plan.get("unloadable") or {}).items():
        print(f"  not shipped: {name}: {why}")


def print_probes(db: Any = None) -> None:
    """The calibration probe's records (``cuvil_pgc.recompile.calibrate``, in the record database
    ``db``, default the user's) per machine key: each backend variant's time on the three-op probe
    against eager's, and the fixed cost per call the cost models fit from them. On the H200 the
    models predicted CUDA graphs slower than eager for a model they ran 1.9x faster."""
    from cuvil_pgc.recompile.cost_models import MachineFigures, PlanCostModel, backend_variant
    from cuvil_pgc.recompile.records import RecordDB
    from cuvil_pgc.recompile.search_records import refit_sample

    by_machine: dict[str, list[Any]] = {}
    for record in db if db is not None else RecordDB():
        sample = refit_sample(record) if record.features.get("probe") else None
        if sample is not None:
            by_machine.setdefault(record.machine, []).append((record, sample))
    for machine, pairs in by_machine.items():
        model = PlanCostModel(MachineFigures.from_analysis_machine({}))
        model.refit([sample for _, sample in pairs])
        print(f"\ncalibration probe on {machine}:")
        for record, (cand, _feats, _us) in sorted(pairs, key=lambda p: p[0].median_us):
            fixed = model.overhead.fixed_us.get(backend_variant(cand))
            print(f"  {cand.config:<24} {record.median_us:9.1f} us (eager {record.eager_us:.1f} us)"
                  + ("" if fixed is None else f"; fitted fixed cost {fixed:.1f} us per call"))
    if not by_machine:
        print("\ncalibration probe: no records")


# ----------------------------------------------------------------------------- the race
def race(build: str, pubkey: str, device: str, rounds: int) -> int:
    import copy

    import torch

    from cuvil_pgc.recompile.load import load_build
    from cuvil_pgc.recompile.measure import time_interleaved

    model, inputs = small_model()
    runs = {"eager": model, "torch.compile": torch.compile(copy.deepcopy(model))}
    if build != "-":
        print(f"load_build({build}) ...", flush=True)
        t0 = time.perf_counter()
        runs["build"] = load_build(build, copy.deepcopy(model), pubkey=pubkey, require_signature=True,
                                   example_inputs=inputs)
        print(f"load_build: {time.perf_counter() - t0:.2f} s (signature verified); report: "
              f"{getattr(runs['build'], 'cuvil_load_report', None)}")
    if device == "cuda":
        runs["compile+cudagraphs"] = torch.compile(copy.deepcopy(model), mode="reduce-overhead")
    with torch.inference_mode():
        ref = model(*inputs)
        for name, fn in runs.items():      # compile each before the clock starts
            t0 = time.perf_counter()
            for _ in range(3):
                got = fn(*inputs)
            err = (got.float() - ref.float()).abs().max().item()
            print(f"  {name}: first calls {time.perf_counter() - t0:.2f} s, max |out - eager| {err:.2e}")
        samples = time_interleaved({k: (lambda f=f: f(*inputs)) for k, f in runs.items()}, rounds=rounds, warmup=5)
    base = samples["eager"].median_ms
    print(f"\nrace on {device} ({rounds} interleaved rounds, medians per call):")
    for name, s in sorted(samples.items(), key=lambda kv: kv[1].median_ms):
        print(f"  {name:20s} {s.median_ms * 1000:9.1f} us   {base / s.median_ms:5.2f}x eager")
    if "build" in samples:
        best_other = min(s.median_ms for k, s in samples.items() if k != "build")
        print(f"  build vs the fastest other contender: {best_other / samples['build'].median_ms:.3f}x")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "race":
        sys.exit(race(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
    sys.exit(main())
