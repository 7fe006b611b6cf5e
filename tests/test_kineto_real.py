"""The reader and analyzer on small real Kineto traces recorded elsewhere (tests/data/kineto_real,
see its README for where each comes from and what it holds).

Each test checks one figure against what the file plainly says, read here straight from its JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

from cuvil_pgc.analyze import analyze
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
