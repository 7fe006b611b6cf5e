"""A torch.profiler trace recorded with ``with_stack=True`` holds every module call as a
``python_function`` event ``nn.Module: <Class>_<n>``: the reader makes them regions (they were
"other events", and the whole run one "(outside regions)" row), and recompile maps them to the
model's submodules by the order the profiled run first called each class's instances."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from cuvil_pgc.recompile.build import _analyze
from cuvil_pgc.recompile.matching import match_regions
from cuvil_pgc.recompile.profiler_modules import module_call_names, profiled_qualname
from cuvil_pgc.trace import load_trace
from cuvil_pgc.trace.schema import Kind


class Calls(nn.Module):
    """Calls ``b`` (twice) before ``blk`` and ``a``; ``unused`` never."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(16, 16)
        self.unused = nn.Linear(16, 16)
        self.b = nn.Linear(16, 16)
        self.blk = nn.Sequential(nn.Linear(16, 16), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(self.blk(self.b(self.b(x))))


CALLED = {"Calls_0": "", "Linear_0": "b", "Sequential_0": "blk", "Linear_1": "blk.0", "ReLU_0": "blk.1",
          "Linear_2": "a"}


def calls():
    torch.manual_seed(0)
    return Calls().eval(), (torch.randn(4, 16),)


@pytest.fixture
def stack_trace(tmp_path: Path) -> str:
    """The trace a user records with torch.profiler's own API, elsewhere."""
    model, inputs = calls()
    model(*inputs)
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof, torch.no_grad():
        for _ in range(2):
            model(*inputs)
    path = str(tmp_path / "stack.pt.trace.json")
    prof.export_chrome_trace(path)
    return path


def test_module_calls_are_regions_with_their_operators(stack_trace: str) -> None:
    trace = load_trace(stack_trace)
    ev, strings = trace.events, trace.strings
    regions = [strings[int(r)] for r in ev["region"][ev["kind"] == Kind.REGION]]
    assert {"Calls_0", "Calls_0/Linear_0", "Calls_0/Sequential_0/Linear_1", "Calls_0/Linear_2"} <= set(regions)
    assert regions.count("Calls_0/Linear_0") == 4        # b, twice per forward
    addmm = (ev["kind"] == Kind.CPU_OP) & (ev["name"] == strings.intern("aten::addmm"))
    assert {strings[int(r)] for r in ev["region"][addmm]} == {"Calls_0/Linear_0", "Calls_0/Sequential_0/Linear_1",
                                                               "Calls_0/Linear_2"}
    other = [w for w in trace.sources[0].warnings if "python_function" in w]
    assert other and all("nn.Module" not in w for w in other)     # the rest of the stack: other events


def test_a_gpu_kernel_belongs_to_the_module_call_that_launched_it(tmp_path: Path) -> None:
    """On a GPU trace the kernel is found through its launch's correlation id, as for annotations."""
    def x(cat, name, ts, dur, tid=1, **args):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid, "args": args}

    events = [x("python_function", "nn.Module: Net_0", 0, 100), x("python_function", "nn.Module: Linear_0", 10, 40),
              x("cpu_op", "aten::addmm", 12, 30), x("cuda_runtime", "cudaLaunchKernel", 15, 5, correlation=7),
              x("python_function", "torch/nn/modules/linear.py(125): forward", 11, 35),
              x("kernel", "gemm_kernel", 30, 20, tid=7, correlation=7, device=0, stream=7)]
    path = tmp_path / "gpu_stack.json"
    path.write_text(json.dumps({"traceEvents": events}))
    trace = load_trace(str(path))
    ev, strings = trace.events, trace.strings
    kernel = ev["kind"] == Kind.KERNEL
    assert [strings[int(r)] for r in ev["region"][kernel]] == ["Net_0/Linear_0"]
    assert sorted(strings[int(r)] for r in ev["region"][ev["kind"] == Kind.REGION]) == ["Net_0", "Net_0/Linear_0"]


def test_module_call_names_number_each_class_in_first_call_order() -> None:
    model, inputs = calls()
    assert module_call_names(model, inputs) == CALLED
    assert profiled_qualname("ProfilerStep/Calls_0/Sequential_0/Linear_1", CALLED) == "blk.0"
    assert profiled_qualname("Calls_0", CALLED) == ""
    assert profiled_qualname("Calls_0/Linear_1/Linear_0", CALLED) is None     # b is not inside blk.0
    assert profiled_qualname("Calls_0/Other_0", CALLED) is None
    assert profiled_qualname("Calls_0/my range/Linear_1", CALLED) == "blk.0"    # a record_function in forward
    assert profiled_qualname("preprocess", CALLED) is None


def test_recompile_matches_the_profilers_module_regions_to_submodules(stack_trace: str) -> None:
    model, inputs = calls()
    analysis = _analyze([stack_trace], None)
    matched = match_regions(analysis, model, module_call_names(model, inputs))
    assert {m.qualname for m in matched.matched} >= {"", "b", "blk", "blk.0", "a"} and not matched.stale
    assert not match_regions(analysis, model).matched          # by path alone nothing fits


def test_a_recompile_from_the_profilers_trace_searches_its_hot_submodules(stack_trace: str) -> None:
    from cuvil_pgc.recompile import recompile

    model, inputs = calls()
    build = recompile(model, inputs, stack_trace, records=False, backends=("eager",), rounds=3,
                      deployed_race=False)
    assert build.plan.stale == [] and not any(p.startswith("Calls_0") for p in build.plan.unmatched)
    assert {r.path for r in build.plan.regions} & {"Calls_0/Linear_0", "Calls_0/Sequential_0", "Calls_0/Linear_2"}
