#!/usr/bin/env python
"""GPU smoke test: a small conv + MLP model under full profiling on a CUDA machine.

Runs ``cuvil_pgc.profile(..., gpu="on", ops=True)`` around a loop of steps, each with a
``preprocess`` region, the model instrumented with ``instrument_module`` (regions ``model``,
``model.features``, ``model.head``) and a ``postprocess`` region, then one ``worker`` region on a
second thread. It then checks the trace:

- the CUPTI sampler ran, captured kernels, and attributed them to the regions that launched them
  (every leaf region got at least one kernel per call; nearly all kernels have a region; kernels
  start after their launch on the trace clock);
- NVML wrote ``sm_util`` counters for the GPU;
- dropped CUPTI records are reported (``samplers.cupti.dropped_records``, equal to
  ``dropped["cupti"]`` or 0);
- the op sampler captured aten operators, and ``cuvil_pgc.load_trace`` reads the file back,

and prints a summary. Exit status: 0 all checks passed, 1 a check failed (each failure is printed),
2 no CUDA device. Runs in well under two minutes on one H200 (most of it imports and CUDA start).

Usage: python scripts/gpu_smoke.py [-o gpu_smoke.trace.json] [--seconds 1.5]
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections import Counter, defaultdict

MIN_STEPS, MAX_STEPS = 10, 600      # bounds the trace: ~40 events per step with ops and kernels
MIN_SESSION_S = 0.5                 # NVML at 50 Hz: about 25 samples
LEAF_REGIONS = ("step/preprocess", "step/model/model.features", "step/model/model.head", "step/postprocess")


def build_model(torch):
    nn = torch.nn

    class SmokeNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
                nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
            self.head = nn.Sequential(nn.Linear(64, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                                      nn.Linear(1024, 10))

        def forward(self, x):
            return self.head(self.features(x))

    torch.manual_seed(0)
    return SmokeNet().cuda().eval()


def run(path: str, seconds: float) -> dict:
    import torch

    import cuvil_pgc
    from cuvil_pgc import ProfileRegion, instrument_module

    model = build_model(torch)
    raw = torch.rand(128, 3, 96, 96, device="cuda")
    with torch.inference_mode():
        for _ in range(3):                        # cuDNN algorithm choice and lazy init, unrecorded
            model((raw - 0.5) * 2.0)
    torch.cuda.synchronize()
    handle = instrument_module(model, depth=1)
    steps = 0
    t0 = time.perf_counter()
    with cuvil_pgc.profile(path, gpu="on", ops=True, sample_hz=50), torch.inference_mode():
        while steps < MIN_STEPS or (steps < MAX_STEPS and time.perf_counter() - t0 < seconds):
            with ProfileRegion("step"):
                with ProfileRegion("preprocess"):
                    batch = (raw - 0.5) * 2.0
                logits = model(batch)
                with ProfileRegion("postprocess"):
                    logits.softmax(-1).argmax(-1).cpu()     # the result leaves the GPU: one sync per step
            steps += 1
        time.sleep(max(0.0, MIN_SESSION_S - (time.perf_counter() - t0)))   # enough NVML ticks
        worker = threading.Thread(target=_worker, args=(torch, ProfileRegion), name="smoke-worker")
        worker.start()
        worker.join()
        torch.cuda.synchronize()
    handle.remove()
    with open(path) as fh:
        trace = json.load(fh)
    trace["_smoke"] = {"steps": steps, "wall_s": time.perf_counter() - t0}
    return trace


def _worker(torch, ProfileRegion) -> None:  # noqa: N803 - the class, passed in
    a = torch.randn(256, 256, device="cuda")
    with torch.inference_mode(), ProfileRegion("worker"):
        for _ in range(5):
            a = a @ a
            a = a / a.norm()


class Checks:
    def __init__(self) -> None:
        self.failures: list[str] = []

    def expect(self, ok: bool, message: str) -> bool:
        print(("  ok    " if ok else "  FAIL  ") + message)
        if not ok:
            self.failures.append(message)
        return ok


def name_regions(events: list) -> None:
    """``args.region``: the path of each event's ``args.region_id`` (our files name regions by id)."""
    from cuvil_pgc.trace._region_tree import paths_of_events

    paths = paths_of_events(events)
    for e in events:
        args = e.get("args")
        if isinstance(args, dict) and "region_id" in args:
            args.setdefault("region", paths.get(args["region_id"]))


def check_kernels(trace: dict, checks: Checks) -> None:
    meta, events = trace["cuvil"], trace["traceEvents"]
    name_regions(events)
    steps = trace["_smoke"]["steps"]
    status = meta["samplers"].get("cupti", {})
    if not checks.expect(status.get("status") == "ok", f"cupti sampler ran (status: {status})"):
        return
    kernels = [e for e in events if e.get("cat") == "kernel"]
    checks.expect(len(kernels) >= steps * len(LEAF_REGIONS), f"{len(kernels)} kernels captured over {steps} steps")
    per_region = Counter(k["args"].get("region") for k in kernels)
    for leaf in LEAF_REGIONS:
        checks.expect(per_region[leaf] >= steps, f"{per_region[leaf]} kernels attributed to {leaf}")
    checks.expect(per_region["worker"] >= 5, f"{per_region['worker']} kernels attributed to the worker thread")
    unattributed = per_region[None]
    checks.expect(unattributed <= 0.02 * len(kernels), f"{unattributed} of {len(kernels)} kernels unattributed")
    allowed = set(LEAF_REGIONS) | {"step", "step/model", "worker", None}
    stray = {r: n for r, n in per_region.items() if r not in allowed}
    checks.expect(not stray, f"no kernel attributed to an unexpected region {stray or ''}")
    fields = ("correlation", "grid", "block", "registers", "shared_memory", "device", "stream")
    checks.expect(all(all(f in k["args"] for f in fields) and k["dur"] >= 0 for k in kernels),
                  "every kernel carries correlation, grid, block, registers, shared_memory, device, stream")
    check_alignment(events, kernels, checks)


def check_alignment(events: list, kernels: list, checks: Checks) -> None:
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    paired = [(k, launches[k["args"]["correlation"]]) for k in kernels if k["args"]["correlation"] in launches]
    checks.expect(len(paired) >= 0.98 * len(kernels), f"{len(paired)} of {len(kernels)} kernels matched to a launch")
    # A kernel cannot start before the CPU called launch; allow 20 us for the clock pairing.
    early = [k["name"] for k, launch in paired if k["ts"] < launch["ts"] - 20.0]
    checks.expect(len(early) <= 0.01 * max(len(paired), 1),
                  f"{len(early)} kernels start before their launch on the trace clock {early[:3]}")
    same = sum(k["args"]["region"] == launch["args"]["region"] for k, launch in paired)
    checks.expect(same == len(paired), f"{same} of {len(paired)} kernels share their launch's region")


def check_counters(trace: dict, checks: Checks) -> None:
    meta, events = trace["cuvil"], trace["traceEvents"]
    status = meta["samplers"].get("nvml", {})
    if not checks.expect(status.get("status") == "ok", f"nvml sampler ran (status: {status.get('status')}, "
                                                       f"{status.get('reason', '')})"):
        return
    source = status["metrics"]["gpu0"].get("sm_util", {})
    print(f"        sm_util source: {source}; sm_occupancy: {status['metrics']['gpu0'].get('sm_occupancy')}")
    sm = [e["args"]["gpu0"] for e in events if e.get("ph") == "C" and e["name"] == "sm_util" and "gpu0" in e["args"]]
    checks.expect(len(sm) >= 3, f"{len(sm)} sm_util samples for gpu0 (max {max(sm, default=None)})")
    checks.expect(bool(meta["devices"]) and bool(meta["devices"][0].get("uuid")), f"devices: {meta['devices']}")


def check_dropped_and_ops(trace: dict, path: str, checks: Checks) -> None:
    meta = trace["cuvil"]
    cupti = meta["samplers"].get("cupti", {})
    reported = cupti.get("dropped_records")
    checks.expect(reported is not None and reported == meta["dropped"].get("cupti", 0),
                  f"dropped CUPTI records reported: {reported} (dropped: {meta['dropped']})")
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op"]
    ops_status = meta["samplers"].get("torch_ops", {})
    checks.expect(bool(ops), f"{len(ops)} aten ops captured (torch_ops: {ops_status})")
    try:
        import cuvil_pgc

        loaded = cuvil_pgc.load_trace(path)
        checks.expect(True, f"load_trace read it back ({len(loaded)} events)")
    except Exception as exc:    # the reader is part of what this smoke test covers
        checks.expect(False, f"load_trace failed: {type(exc).__name__}: {exc}")


def print_summary(trace: dict) -> None:
    meta, events = trace["cuvil"], trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    by_name: dict[str, list[float]] = defaultdict(list)
    by_region: dict[str, float] = defaultdict(float)
    for k in kernels:
        by_name[k["name"]].append(k["dur"])
        by_region[str(k["args"].get("region"))] += k["dur"]
    smoke = trace["_smoke"]
    print(f"\nsummary: {smoke['steps']} steps in {smoke['wall_s']:.2f} s, {len(kernels)} kernels, "
          f"device {meta['devices'][0].get('name') if meta['devices'] else '?'}")
    print("  GPU time by region (ms):")
    for region, us in sorted(by_region.items(), key=lambda kv: -kv[1]):
        print(f"    {us / 1000:10.3f}  {region}")
    print("  top kernels (total ms, calls, name):")
    for name, durs in sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:8]:
        print(f"    {sum(durs) / 1000:10.3f}  {len(durs):6d}  {name[:100]}")
    for name in ("cupti", "nvml", "torch_ops", "cpu"):
        status = {k: v for k, v in meta["samplers"].get(name, {}).items() if k != "metrics"}
        print(f"  {name}: {status}")
    print(f"  dropped: {meta['dropped']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="gpu_smoke.trace.json")
    parser.add_argument("--seconds", type=float, default=1.5, help=f"run steps this long (at most {MAX_STEPS})")
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print(f"gpu_smoke: no CUDA device: torch {torch.__version__} (CUDA {torch.version.cuda}) sees none; "
              "run this on a machine with an NVIDIA GPU (see `cuvil-pgc doctor`)", file=sys.stderr)
        return 2
    trace = run(args.output, args.seconds)
    checks = Checks()
    print("checks:")
    check_kernels(trace, checks)
    check_counters(trace, checks)
    check_dropped_and_ops(trace, args.output, checks)
    print_summary(trace)
    if checks.failures:
        print(f"\ngpu_smoke: {len(checks.failures)} check(s) failed", file=sys.stderr)
        return 1
    print("\ngpu_smoke: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
