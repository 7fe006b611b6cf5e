"""What the compile sampler costs torch.compile: compile time and steady-state calls, on vs off.

Each measurement is a fresh process (torch keeps compiled code per process) that compiles a small
MLP with Inductor on CPU inside a session with ``compile=True`` or ``compile=False`` and reports:
the first call (the compile), the median of later calls, and the sampler's status (torch's own
measure of the structured-logging time the hook caused). The Inductor cache is warmed first, so
the compile is Dynamo + AOTAutograd + cache loads, where hook overhead weighs most; a cold
compile (C++ kernel builds) dilutes it further. Runs alternate on/off to spread machine noise.

    python benchmarks/compile_telemetry_overhead.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, statistics, sys, time
from cuvil_pgc import profile

on = sys.argv[1] == "on"
with profile(sys.argv[2], ops=False, gpu="off", sample_hz=0, compile=on):
    import torch
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 64),
                                torch.nn.LayerNorm(64), torch.nn.Linear(64, 10)).eval()
    x = torch.randn(32, 64)
    compiled = torch.compile(model)
    with torch.no_grad():
        t = time.perf_counter()
        compiled(x)
        first = time.perf_counter() - t
        calls = []
        for _ in range(300):
            t = time.perf_counter()
            compiled(x)
            calls.append(time.perf_counter() - t)
status = json.load(open(sys.argv[2]))["cuvil"]["samplers"].get("compile", {})
print(json.dumps({"first_s": first, "call_us": statistics.median(calls) * 1e6,
                  "logging_ms": status.get("torch_logging_overhead_ms"), "events": status.get("events")}))
"""


def _run(mode: str, workdir: str, env: dict[str, str]) -> dict:
    out = os.path.join(workdir, f"{mode}.trace.json")
    if os.path.exists(out):
        os.remove(out)
    done = subprocess.run([sys.executable, "-c", _CHILD, mode, out], env=env, check=True,
                          capture_output=True, text=True, timeout=600)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(workdir, "inductor")}
        _run("off", workdir, env)                      # fills the Inductor caches
        runs: dict[str, list[dict]] = {"off": [], "on": []}
        for _ in range(args.repeats):
            for mode in ("off", "on"):
                runs[mode].append(_run(mode, workdir, env))
    med = {mode: {k: statistics.median(r[k] for r in rs) for k in ("first_s", "call_us")}
           for mode, rs in runs.items()}
    print(f"compile (first call, warm Inductor cache), median of {args.repeats}: "
          f"off {med['off']['first_s'] * 1000:.0f} ms, on {med['on']['first_s'] * 1000:.0f} ms, "
          f"ratio {med['on']['first_s'] / med['off']['first_s']:.2f}")
    print(f"steady-state call, median: off {med['off']['call_us']:.1f} us, on {med['on']['call_us']:.1f} us, "
          f"ratio {med['on']['call_us'] / med['off']['call_us']:.2f}")
    logging_ms = [r["logging_ms"] for r in runs["on"]]
    print(f"torch's structured-logging time caused by the hook (its own measure): {logging_ms} ms; "
          f"compile events per run: {[r['events'] for r in runs['on']]}")


if __name__ == "__main__":
    main()
