"""FLOP and byte estimates for the operators of a torch.profiler (Kineto) trace recorded with
``record_shapes=True`` (cuvil_pgc.analyze.op_estimates): such a trace carries each op's shapes and
dtypes but no estimate, so its regions had no work to weigh against the machine's roofs."""

from __future__ import annotations

import json
import subprocess
import sys

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, record_function

ANALYZE = """
import json, sys
from cuvil_pgc.analyze import analyze
from cuvil_pgc.analyze.machine import MachineModel
machine = MachineModel(device="cpu", name="t", fingerprint="t", peak_flops={"fp32": 1e11}, mem_bw=1e10,
                       dispatch_overhead_s=2e-6)
a = analyze(sys.argv[1], machine=machine)
r = a.region("infer")
print(json.dumps({"flops": r.evidence.get("flops"), "bytes": r.evidence.get("bytes"),
                  "fusion_bytes": [c.bytes_saved for c in a.fusion_candidates], "torch": "torch" in sys.modules}))
"""


def test_a_kineto_trace_s_ops_get_flops_and_bytes_from_their_shapes_without_importing_torch(tmp_path):
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 32)).eval(), torch.randn(8, 64)
    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(5):
            with record_function("infer"):
                model(x)
    path = tmp_path / "kineto.json"
    prof.export_chrome_trace(str(path))
    ops = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("name") == "aten::linear"]
    assert ops and all("Input Dims" in e["args"] and "flops" not in e["args"] for e in ops)   # shapes, no estimate

    out = subprocess.run([sys.executable, "-c", ANALYZE, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["flops"] == 5 * (2 * 8 * 64 * 128 + 2 * 8 * 128 * 32)          # the two GEMMs, 5 calls
    weights_and_activations = 4 * (8 * 64 + 128 * 64 + 128 + 8 * 128 + 32 * 128 + 32 + 8 * 32)
    assert report["bytes"] >= 5 * weights_and_activations
    assert report["fusion_bytes"] and report["fusion_bytes"][0] > 0            # linear → linear's intermediate
    assert report["torch"] is False                                           # analysis stays torch-free
