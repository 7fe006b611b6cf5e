"""Analysing a GPU trace never imports torch (issue 25, item 10): load + analyze in a fresh process,
on a machine without a GPU and on one with a (faked) visible GPU whose calibration is cached."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from cuvil_pgc.analyze import machine as mm
from tests.test_reader_invariants import DATA

SCRIPT = """
import json, sys
from cuvil_pgc.analyze import machine
if len(sys.argv) > 2:
    machine.NVIDIA_PROC_GPUS = sys.argv[2]       # the driver's GPU folder, faked
from cuvil_pgc.analyze.analyzer import analyze
from cuvil_pgc.trace.reader import load_trace
result = analyze(load_trace(sys.argv[1]))
assert result.trace["counts"]["kernel"] > 0
cuda = result.machine["cuda"]
print(json.dumps({"torch": "torch" in sys.modules, "source": cuda["source"], "name": cuda["name"]}))
"""
TRACES = (DATA / "kineto_gpu" / "gpu_two_regions.json",      # deviceProperties: NVIDIA H100 80GB HBM3, 132 SMs
          DATA / "kineto_generations" / "ns_flows.json")       # no deviceProperties, no host_name


def _recorded_here(tmp_path: Path) -> Path:
    """ns_flows.json as torch.profiler writes it today, naming the host that recorded it: this one."""
    doc = json.loads(TRACES[1].read_text())
    path = tmp_path / "here.json"
    path.write_text(json.dumps({**doc, "host_name": socket.gethostname()}))
    return path


def _analyze(trace: Path, cache: Path, *extra: str) -> dict:
    env = {"CUVIL_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(p for p in sys.path if p)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(trace), *extra], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_load_and_analyze_of_a_gpu_trace_does_not_import_torch(tmp_path) -> None:
    for trace in TRACES:
        assert _analyze(trace, tmp_path)["torch"] is False, f"{trace.name} imported torch"


def _cache_calibration(gpu: str, sms: int, cache: Path) -> None:
    """A cuda calibration cached the way `cuvil-pgc calibrate --device cuda` caches one, with the
    identity torch would report for that GPU and made-up figures."""
    identity = {**mm.machine_identity("cpu"), "device": "cuda:0", "gpu": gpu, "capability": "9.0", "sms": sms,
                "cuda": "12.8"}
    figures = {"peak_flops": {"fp32": 50e12, "bf16": 700e12}, "mem_bw": 3e12, "dispatch_overhead_s": 3e-6,
               "launch_latency_s": 4e-6, "notes": {}, "details": {"quick": True}}
    model = mm.measured_model(identity, figures)
    model.save(cache / f"machine-{model.fingerprint}.json")


def _fake_driver(tmp_path: Path, *models: str) -> Path:
    """/proc/driver/nvidia/gpus as the NVIDIA driver lays it out: one folder per PCI address."""
    root = tmp_path / "gpus"
    for i, model in enumerate(models):
        folder = root / f"0000:{i + 1:02x}:00.0"
        folder.mkdir(parents=True)
        (folder / "information").write_text(f"Model: \t\t {model}\nIRQ:   \t\t 42\nGPU UUID: \t GPU-{i}\n"
                                            "Bus Type: \t PCIe\nDevice Minor: \t 0\n", encoding="utf-8")
    return root


def test_with_a_visible_gpu_analysis_uses_its_cached_calibration_without_torch(tmp_path) -> None:
    cache = tmp_path / "cache"
    _cache_calibration("NVIDIA H200", 132, cache)               # this machine's GPU
    _cache_calibration("NVIDIA H100 80GB HBM3", 132, cache)     # the GPU gpu_two_regions was recorded on
    driver = _fake_driver(tmp_path, "NVIDIA H200")
    recorded_elsewhere, unnamed, here = (_analyze(trace, cache, str(driver))
                                         for trace in (*TRACES, _recorded_here(tmp_path)))
    assert recorded_elsewhere == {"torch": False, "source": "measured", "name": "NVIDIA H100 80GB HBM3 (sm_90, CUDA 12.8)"}
    assert here == {"torch": False, "source": "measured", "name": "NVIDIA H200 (sm_90, CUDA 12.8)"}
    # a trace that names neither its host nor its GPU may come from anywhere: never this GPU's figures
    assert unnamed == {"torch": False, "source": "fallback",
                       "name": "the GPU of an unnamed machine (no host name in the trace)"}


def test_with_a_visible_but_uncalibrated_gpu_analysis_falls_back_without_torch(tmp_path) -> None:
    cache = tmp_path / "cache"
    _cache_calibration("NVIDIA H100 80GB HBM3", 114, cache)     # another variant (H100 PCIe has 114 SMs)
    driver = _fake_driver(tmp_path, "NVIDIA H200")
    recorded_elsewhere, this_gpu = (_analyze(trace, cache, str(driver)) for trace in (TRACES[0], _recorded_here(tmp_path)))
    assert recorded_elsewhere["source"] == "datasheet" and recorded_elsewhere["torch"] is False
    assert this_gpu == {"torch": False, "source": "fallback", "name": "NVIDIA H200 (sm_?, CUDA ?)"}
