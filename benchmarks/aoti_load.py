"""How long a fresh process takes to load an AOTInductor package: torch's public call against
cuvil-pgc's loader (``cuvil_pgc.recompile.aoti_loader``, which skips torch's CPU ISA probe).

    python benchmarks/aoti_load.py [--package PATH.pt2] [--runs 3]

Without ``--package`` it builds (once, under /tmp/cuvil_bench) the package of a small MLP on the
CPU. Each run starts one fresh process per loader, alternating which goes first, twice: with an
empty Inductor cache of its own (a new container or machine: torch's probe compiles its test
libraries) and with a shared cache that an earlier process filled. A process times only the load
(``import torch``, and the libstdc++ promotion of ``cuvil_pgc.recompile.cxx_runtime`` that CUDA
packages need, come first) and asks the loaded package for its call spec. Prints the median load
time per loader and cache state, and the ratio. Figures depend on the machine, its compiler and
its load: compare ratios from one run.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from cuvil_pgc.recompile.process_race import exit_reason

LOADERS = ("aoti_load_package", "cuvil-pgc")

_CHILD = r"""
import sys, time
import torch, torch._inductor
loader, path = sys.argv[1], sys.argv[2]
from cuvil_pgc.recompile.aoti_loader import load_aoti_package
from cuvil_pgc.recompile.cxx_runtime import share_cxx_runtime
share_cxx_runtime()    # both: without it CUDA packages crash fresh processes (see cxx_runtime)
t0 = time.perf_counter()
model = torch._inductor.aoti_load_package(path) if loader == "aoti_load_package" else load_aoti_package(path)
took = time.perf_counter() - t0
assert model.loader.get_call_spec()
print(took)
"""

_BUILD = r"""
import sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 8)).eval()
exported = torch.export.export(model, (torch.randn(4, 64),))
torch._inductor.aoti_compile_and_package(exported, package_path=sys.argv[1])
"""


def build_package(out: Path) -> Path:
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"building {out} (an AOTInductor compile, about a minute) ...", flush=True)
        subprocess.run([sys.executable, "-c", _BUILD, str(out)], check=True, capture_output=True)
    return out


def load_once(loader: str, package: Path, cache: str) -> float:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
    proc = subprocess.run([sys.executable, "-c", _CHILD, loader, str(package)], capture_output=True, text=True,
                          env=env, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"{loader} failed to load {package} ({exit_reason(proc.returncode)}):\n{proc.stderr[-2000:]}")
    return float(proc.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--package", type=Path, help="An AOTInductor .pt2 (default: a small MLP's, built once).")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    package = args.package or build_package(Path(tempfile.gettempdir()) / "cuvil_bench" / "aoti_load_mlp.pt2")
    times: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        warm = os.path.join(tmp, "warm")
        print(f"filling a shared Inductor cache: {load_once(LOADERS[0], package, warm):.3f} s", flush=True)
        for run in range(args.runs):
            order = LOADERS if run % 2 == 0 else LOADERS[::-1]
            for state in ("empty cache", "warm cache"):
                for loader in order:
                    cache = os.path.join(tmp, f"empty-{run}-{loader}") if state == "empty cache" else warm
                    times.setdefault((state, loader), []).append(load_once(loader, package, cache))
                    print(f"  run {run + 1}, {state}, {loader}: {times[(state, loader)][-1]:.3f} s", flush=True)
    print(f"\nfresh-process load of {package} ({args.runs} runs, python {sys.version.split()[0]}):")
    for state in ("empty cache", "warm cache"):
        medians = {loader: statistics.median(times[(state, loader)]) for loader in LOADERS}
        for loader in LOADERS:
            runs = ", ".join(f"{t:.3f}" for t in times[(state, loader)])
            print(f"  {state:12s} {loader:18s} median {medians[loader]:8.3f} s  (runs: {runs})")
        print(f"  {state:12s} cuvil-pgc is {medians[LOADERS[0]] / medians[LOADERS[1]]:.0f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
