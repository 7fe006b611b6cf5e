"""The CPU (and GPU) figures of an analysis are those of the machine that recorded the trace: this
machine's calibration only for a trace that names this host; a trace recorded elsewhere, or one that
names no host (torch.profiler wrote no ``host_name`` before torch 2), gets the documented fallback,
named as the recording machine's, with a warning saying how to measure that machine's."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cuvil_pgc.analyze import analyze
from cuvil_pgc.analyze import machine as mm
from cuvil_pgc.trace.reader import load_trace

DATA = Path(__file__).resolve().parent / "data"
OURS = DATA / "ours" / "regions.trace.json"                         # our trace; its cuvil.host is rewritten
REAL_H100 = DATA / "kineto_real" / "kineto_h100_cuda_sync.json"     # a real H100 trace: GPUs named, host not


@pytest.fixture
def calibrated(tmp_path, monkeypatch) -> mm.MachineModel:
    """This machine's CPU calibrated (made-up figures, cached as `cuvil-pgc calibrate` caches them)."""
    monkeypatch.setenv(mm.CACHE_DIR_ENV, str(tmp_path / "cache"))
    model = mm.measured_model(mm.machine_identity("cpu"), {"peak_flops": {"fp32": 123e9}, "mem_bw": 45e9,
                                                           "dispatch_overhead_s": 3e-6, "notes": {}, "details": {}})
    model.save(mm.cache_path(model.fingerprint))
    return model


def _ours_from(host: str, tmp_path: Path) -> str:
    doc = json.loads(OURS.read_text())
    doc["cuvil"]["host"] = host
    path = tmp_path / f"{host}.trace.json"
    path.write_text(json.dumps(doc))
    return str(path)


def test_a_trace_recorded_here_uses_this_machines_calibration(calibrated, tmp_path) -> None:
    a = analyze(load_trace(_ours_from(socket.gethostname(), tmp_path)))
    assert a.machine["cpu"]["source"] == "measured" and a.machine["cpu"]["name"] == calibrated.name
    assert a.machine["cpu"]["peak_flops"]["fp32"] == pytest.approx(123e9)
    assert not any("recorded on" in w for w in a.trace["warnings"])


def test_a_trace_from_another_host_never_gets_this_machines_figures(calibrated, tmp_path) -> None:
    a = analyze(load_trace(_ours_from("gpu-node-7", tmp_path)))
    cpu = a.machine["cpu"]
    assert cpu["source"] == "fallback" and cpu["name"] == "the CPU of host 'gpu-node-7'"
    assert cpu["peak_flops"]["fp32"] == pytest.approx(mm.FALLBACK_CPU["peak_flops"]["fp32"])
    warning = next(w for w in a.trace["warnings"] if "recorded on" in w)
    assert "'gpu-node-7'" in warning and "--machine" in warning and "calibrate -o" in warning
    assert not any("this machine's cpu is not calibrated" in w for w in a.trace["warnings"])


def test_a_real_gpu_trace_without_a_host_name_gets_its_own_gpu_and_no_local_cpu(calibrated) -> None:
    a = analyze(load_trace(str(REAL_H100)))
    assert a.machine["cuda"]["source"] == "datasheet" and "H100" in a.machine["cuda"]["name"]
    assert a.machine["cpu"]["source"] == "fallback" and "unnamed machine" in a.machine["cpu"]["name"]
    assert calibrated.name not in json.dumps(a.machine)


def test_a_given_machine_model_wins_for_a_trace_from_elsewhere(calibrated, tmp_path) -> None:
    a = analyze(load_trace(_ours_from("gpu-node-7", tmp_path)), machine=calibrated)
    assert a.machine["cpu"]["source"] == "measured" and a.machine["cpu"]["name"] == calibrated.name
    assert not any("recorded on" in w for w in a.trace["warnings"])


def test_traces_merged_from_here_and_elsewhere_name_the_other_host(calibrated, tmp_path) -> None:
    a = analyze([_ours_from(socket.gethostname(), tmp_path), _ours_from("gpu-node-7", tmp_path)])
    assert a.machine["cpu"]["name"] == "the CPU of host 'gpu-node-7'"


def test_cli_prints_the_recording_machine_not_this_one(calibrated, tmp_path) -> None:
    env = {**os.environ, mm.CACHE_DIR_ENV: os.environ[mm.CACHE_DIR_ENV], "COLUMNS": "200"}
    proc = subprocess.run([sys.executable, "-m", "cuvil_pgc", "analyze", str(REAL_H100)], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout + proc.stderr
    assert "machine (cpu): the CPU of an unnamed machine" in out
    assert calibrated.name not in out


def test_a_host_name_shared_with_another_machine_is_told_apart_by_its_cpu(calibrated, tmp_path) -> None:
    """Every VM here is called ``vm``: our traces record the CPU, and a different one is elsewhere."""
    doc = json.loads(OURS.read_text())
    doc["cuvil"].update(host=socket.gethostname(), cpu={"cpu": "AMD EPYC 9654", "isa": ["avx2"], "cores": 16,
                                                        "arch": "x86_64"})
    path = tmp_path / "twin.trace.json"
    path.write_text(json.dumps(doc))
    a = analyze(load_trace(str(path)))
    assert a.machine["cpu"]["source"] == "fallback"
    assert a.machine["cpu"]["name"] == f"the CPU of host {socket.gethostname()!r} (AMD EPYC 9654, 16 cores)"


def test_a_real_trace_from_a_gpu_machine_of_the_same_host_name_is_elsewhere(calibrated, monkeypatch) -> None:
    """The H200 machine's own trace (host 'vm', recorded before traces named their CPU): its GPU is
    not here, so neither is its CPU."""
    from cuvil_pgc.analyze import trace_machines

    monkeypatch.setattr(socket, "gethostname", lambda: "vm")
    monkeypatch.setattr(trace_machines, "_local_gpu_names", lambda: [])
    a = analyze(load_trace(str(DATA / "h200" / "small_model.trace.json.gz")))
    assert a.machine["cpu"]["name"] == "the CPU of host 'vm' (with NVIDIA H200)"
    assert a.machine["cuda"]["source"] == "datasheet" and "H200" in a.machine["cuda"]["name"]
    monkeypatch.setattr(trace_machines, "_local_gpu_names", lambda: ["NVIDIA H200"])    # on that machine
    assert analyze(load_trace(str(DATA / "h200" / "small_model.trace.json.gz"))).machine["cpu"]["source"] == "measured"


def test_our_new_traces_record_this_cpu(tmp_path) -> None:
    from cuvil_pgc import profile
    from cuvil_pgc._cpu_identity import cpu_identity

    path = tmp_path / "t.trace.json"
    with profile(path, ops=False, gpu="off", sample_hz=0, compile=False):
        pass
    meta = load_trace(str(path)).sources[0].metadata
    assert meta["cpu"] == cpu_identity() and meta["cpu"]["cores"] >= 1
