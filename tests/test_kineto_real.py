"""The reader and analyzer on small real Kineto traces recorded elsewhere (tests/data/kineto_real,
see its README for where each comes from and what it holds).

Each test checks one figure against what the file plainly says, read here straight from its JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cuvil_pgc.analyze import analyze
from cuvil_pgc.errors import AnalysisError
from cuvil_pgc.trace.reader import load_trace

DATA = Path(__file__).resolve().parent / "data" / "kineto_real"     # see its README
V100 = DATA / "kineto_v100_compute_properties.json"
H100 = DATA / "kineto_h100_cuda_sync.json"
HTA_BACKWARD = DATA / "hta_backward_thread.json"


def test_torch18_compute_properties_name_the_gpu():
    """torch 1.8's Kineto wrote the GPUs under ``computeProperties`` (``major``, ``multiProcessorCount``):
    they are the trace's devices, so the V100 it ran on gives the machine model, not 'unknown GPU'."""
    doc = json.loads(V100.read_text())
    assert "deviceProperties" not in doc and len(doc["computeProperties"]) == 4
    trace = load_trace(V100)
    devices = trace.sources[0].metadata["devices"]
    assert [d["name"] for d in devices] == ["Tesla V100-DGXS-32GB"] * 4
    assert devices[0]["numSms"] == 80 and devices[0]["computeMajor"] == 7
    cuda = analyze(str(V100)).machine["cuda"]
    assert cuda["source"] == "datasheet" and cuda["details"]["table_entry"] == "V100-SXM2"
    assert cuda["mem_bw"] == 900e9


def test_fractional_microseconds_are_exact_to_the_nanosecond():
    """Kineto writes ts in µs with the ns as three decimals on a clock 24 h past baseTimeNanoseconds
    (88437691101.749): read as float64 those are off by ~1e-5 µs, and the launch of this trace's only
    kernel (runtime ends .739, kernel starts .749) came out 0.009989 µs. Rebased and rounded to the ns,
    every figure is the file's own, and the wall-clock anchor is unchanged."""
    doc = json.loads(H100.read_text())
    ts = {e["name"]: e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X"}
    assert ts["Kernel"] == 88437691101.749 and ts["cudaLaunchKernel"] == 88437691101.729
    trace = load_trace(H100)
    rows = trace.events
    names = [trace.strings[i] for i in rows["name"]]
    local = {n: t for n, t in zip(names, rows["ts"], strict=True)}
    assert round((local["Kernel"] - local["op1"]) * 1000, 9) == 20.0          # ns, exactly
    assert all(abs(t * 1000 - round(t * 1000)) < 1e-6 for t in rows["ts"])    # every row on the ns grid
    base = doc["baseTimeNanoseconds"]
    first = min(e["ts"] for e in doc["traceEvents"] if e.get("ph") == "X")
    assert trace.sources[0].metadata["start_unix_ns"] == base + round(first * 1000)
    gpu = analyze(str(H100)).trace["gpu"]["cuda:0"]
    assert gpu["launch_delay_us"]["count"] == 1                                 # the ac2g flow still links
    assert abs(gpu["launch_delay_us"]["p50"] - 0.010) < 1e-12


def test_report_does_not_call_a_trace_with_kernels_cpu_only():
    """HTA's excerpt has a kernel on GPU 0 but no ``deviceProperties``: the run summary said
    'none recorded (CPU-only run)'; it says the GPUs are not described and where the GPU work ran."""
    from cuvil_pgc.viewer._sections import summary_section

    html = summary_section(analyze(str(HTA_BACKWARD)), "test")
    assert "CPU-only" not in html
    assert "no deviceProperties" in html and "cuda:0 (1 kernels)" in html


def test_a_kineto_trace_without_work_says_what_it_holds(tmp_path):
    """A profiler window that caught no op or kernel (seen in the wild: an L20 trace holding one
    10-second ``cudaMemGetInfo``) was told to 'pass a torch.profiler trace', which it was. Cut from the
    real H100 file to its runtime call and instant events, it names what it holds and the profiler fix."""
    doc = json.loads(H100.read_text())
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") == "cuda_runtime" or e.get("ph") == "i"]
    cut = tmp_path / "runtime_only.json"
    cut.write_text(json.dumps(doc))
    with pytest.raises(AnalysisError) as err:
        analyze(str(cut))
    message = str(err.value)
    assert "pass a torch.profiler trace" not in message
    assert "1 runtime event" in message and "'i' x2" in message and "ProfilerActivity.CUDA" in message
