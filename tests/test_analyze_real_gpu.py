"""The analyzer on two real ResNet-50 training traces recorded on a V100 (tests/data/kineto_resnet50,
copied from shared/traces/kineto-resnet50).

The files are read as they are: torch 1.8-1.10 wrote the older capitalised categories
(``Operator``, ``Runtime``, ``Kernel``, ``Memcpy``, ``Memset``), which the reader takes. Every figure is
checked against the same figure computed here straight from the JSON (within 1%); the verdicts are
those the traces support: the GPU is busy 56% (num_workers=0) and 72% (num_workers=4) of the steps,
so ``compute`` (cuDNN convolutions) is primary, and with num_workers=0 the DataLoader on the main
thread leaves the GPU idle for a third of each step (``host_bound`` second), which 4 workers remove.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from cuvil_pgc.analyze import analyze
from cuvil_pgc.trace.reader import load_trace

TRACES = Path(__file__).resolve().parent / "data" / "kineto_resnet50"     # see its README
GPU_CATS = ("kernel", "gpu_memcpy", "memcpy", "gpu_memset", "memset")

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not TRACES.is_dir(), reason=f"the real traces are missing ({TRACES})")]


def _merged(iv):
    out: list[list[float]] = []
    for a, b in sorted(iv):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _overlap(xs, ws):
    ws = _merged(ws)
    return sum(max(0.0, min(b, wb) - max(a, wa)) for a, b in _merged(xs) for wa, wb in ws)


@pytest.fixture(scope="module", params=["num_workers_0", "num_workers_4"])
def real(request):
    src = next(TRACES.glob(f"resnet50_{request.param}_*.json.gz"))
    doc = json.load(gzip.open(src))
    assert {e.get("cat") for e in doc["traceEvents"]} >= {"Operator", "Kernel", "Runtime"}   # the old format
    return request.param, doc, analyze(load_trace(str(src)))


def test_real_resnet_figures_match_the_json(real):
    _, doc, a = real
    ev = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in ev if re.match(r"ProfilerStep#\d+$", e["name"])]
    gpu = [e for e in ev if str(e.get("cat")).lower() in GPU_CATS]
    launches = [e for e in ev if str(e.get("cat")).lower() in ("cuda_runtime", "runtime")
                and e["name"] == "cudaLaunchKernel"
                and any(a0 <= e["ts"] < b0 for a0, b0 in steps)]
    step = a.region("ProfilerStep")
    assert step.calls == len(steps) == 6
    assert not [r for r in a.regions if r.path.startswith("ProfilerStep#")]
    assert step.self_us == pytest.approx(sum(b - a0 for a0, b in steps), rel=0.01)
    busy = _overlap([(e["ts"], e["ts"] + e["dur"]) for e in gpu], steps)
    assert step.evidence["gpu_busy_us"] == pytest.approx(busy, rel=0.01)
    assert step.evidence["kernel_time_us"] <= step.self_us
    assert step.evidence["runtime_by_api_us"]["launch"] >= sum(e["dur"] for e in launches)
    assert a.machine["cuda"]["source"] == "datasheet" and "V100" in a.machine["cuda"]["name"]
    roots = [r for r in a.regions if r.parent is None]
    assert sum(r.hotness for r in roots) <= a.trace["run_duration_us"]


def test_real_resnet_verdicts(real):
    name, _, a = real
    step = a.region("ProfilerStep")
    assert step.bottleneck == "compute"
    host = step.evidence["explained_us"]["host_bound"] / step.self_us
    if name == "num_workers_0":
        assert host > 0.35           # DataLoader on the main thread: the GPU idles
    else:
        assert host < 0.25           # four loader processes keep the GPU fed; what is left is eager
        # host work with the GPU idle (input copies in aten::to, the zero_grad loop, conv / batch
        # norm dispatch), which is not launch overhead
    # launch overhead is the GPU idle in launch calls (and the wait for their kernels), nothing else:
    # num_workers_4 had 128 ms of eager ops around launches counted as 161 ms of launch overhead
    ev = step.evidence
    assert ev["explained_us"]["launch_overhead"] == pytest.approx(ev["gpu_idle_by_host_us"]["launch"])
    assert ev["explained_us"]["launch_overhead"] < ev["runtime_by_api_us"]["launch"]
