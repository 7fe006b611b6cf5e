"""The reader and analyzer on small real Kineto traces recorded elsewhere (tests/data/kineto_real,
see its README for where each comes from and what it holds).

Each test checks one figure against what the file plainly says, read here straight from its JSON.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
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


def _as_torch_2_1(path: Path, out: Path) -> None:
    """The file as torch 2.1-2.3's Kineto wrote it: no baseTimeNanoseconds, ``ts`` in Unix µs with the
    ns as three decimals (19 significant digits), the same instants to the nanosecond."""
    text = path.read_text()
    base = json.loads(text)["baseTimeNanoseconds"]

    def absolute(m: re.Match) -> str:
        whole, frac = m.group(2).split(".")
        ns = base + int(whole) * 1000 + int(frac)
        return f'{m.group(1)}{ns // 1000}.{ns % 1000:03d}'

    text = re.sub(r'("ts": )(\d+\.\d{3})', absolute, text)
    out.write_text(re.sub(r'\s*"baseTimeNanoseconds": \d+,', "", text))


def test_unix_microseconds_with_ns_decimals_are_read_exactly(tmp_path):
    """torch 2.1-2.3 wrote ``ts`` as Unix µs with ns decimals (1775166987691101.749), which a float64
    holds only to a quarter of a microsecond: the 10 ns launch delay read 0 or 0.25 µs. The reader
    takes such times from their text, so the file gives the same figures as its rebased form."""
    old = tmp_path / "h100_torch21.json"
    _as_torch_2_1(H100, old)
    raw = old.read_text()
    assert "baseTimeNanoseconds" not in raw and '"ts": 1775166987691101.749' in raw
    new_trace, old_trace = load_trace(H100), load_trace(old)
    np.testing.assert_array_equal(np.round(old_trace.events["ts"] * 1000), np.round(new_trace.events["ts"] * 1000))
    assert old_trace.sources[0].metadata["start_unix_ns"] == new_trace.sources[0].metadata["start_unix_ns"]
    assert any("read exactly" in n for n in old_trace.sources[0].notes)
    gpu = analyze(str(old)).trace["gpu"]["cuda:0"]
    assert gpu["launch_delay_us"]["count"] == 1 and abs(gpu["launch_delay_us"]["p50"] - 0.010) < 1e-12
    assert abs(gpu["busy_us"] - 0.020) < 1e-12


def test_streamed_unix_microseconds_fall_back_to_the_exact_whole_read(tmp_path, monkeypatch):
    """The chunked reader keeps no text of the times: on such a file it hands over to the whole read."""
    from cuvil_pgc.trace import _stream

    old = tmp_path / "h100_torch21.json"
    _as_torch_2_1(H100, old)
    whole = load_trace(old)
    monkeypatch.setenv("CUVIL_READ_WORKERS", "0")
    monkeypatch.setattr(_stream, "STREAM_MIN_BYTES", 0)
    monkeypatch.setattr(_stream, "CHUNK_BYTES", 700)
    streamed = load_trace(old)
    np.testing.assert_array_equal(streamed.events["ts"], whole.events["ts"])
    assert streamed.sources[0].notes == whole.sources[0].notes
