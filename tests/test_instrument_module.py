"""instrument_module: regions per submodule, depth, exact removal, no graph breaks when idle."""

from __future__ import annotations

import json

import pytest
import torch

from cuvil_pgc import profile
from cuvil_pgc.errors import ConfigError
from cuvil_pgc.instrument.module import instrument_module
from tests._regionlines import with_paths


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.ReLU(),
        torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh()),
    ).eval()


def _state(model):
    return [(dict(m.__dict__), len(m._forward_hooks), len(m._forward_pre_hooks)) for m in model.modules()]


def _region_paths(path):
    doc = json.loads(open(path, encoding="utf-8").read())
    return [e["args"]["path"] for e in with_paths(doc["traceEvents"])]


def test_regions_named_by_module_path_and_nested(tmp_path):
    model, x = _model(), torch.randn(2, 8)
    handle = instrument_module(model)
    with profile(tmp_path / "m.trace.json", ops=False, compile=False, sample_hz=0, gpu="off") as s:
        model(x)
    handle.remove()
    paths = _region_paths(s.path)
    assert sorted(paths) == sorted([
        "model", "model/model.0", "model/model.1", "model/model.2",
        "model/model.2/model.2.0", "model/model.2/model.2.1"])


def test_depth_limits_regions(tmp_path):
    model = _model()
    with instrument_module(model, depth=1) as handle:
        assert handle.paths == ["model", "model.0", "model.1", "model.2"]
    with instrument_module(model, depth=0, prefix="net") as handle:
        assert handle.paths == ["net"]


def test_remove_restores_model_exactly():
    model, x = _model(), torch.randn(2, 8)
    before_state, before_out = _state(model), model(x)
    handle = instrument_module(model)
    assert _state(model) != before_state
    handle.remove()
    handle.remove()  # idempotent
    assert _state(model) == before_state
    assert torch.equal(model(x), before_out)


class _Named(torch.nn.Module):
    """Returns its outputs by name, as a Hugging Face model traced with strict=False does."""

    def __init__(self) -> None:
        super().__init__()
        self.body = _model()
        self.unused = torch.nn.Linear(4, 4)        # never called: its traced copy has no forward

    def forward(self, x):
        return {"out": self.body(x)}


def test_a_torch_jit_loaded_model_gets_its_region_and_its_submodules_none(tmp_path):
    """TorchScript calls a loaded model's submodules in C++, never through their Python forward
    (a traced submodule that was never called has none): wrapping them made `cuvil-pgc profile`
    end in an internal error (AttributeError: no attribute 'forward')."""
    x = torch.randn(2, 8)
    torch.jit.save(torch.jit.trace(_Named().eval(), (x,), strict=False), str(tmp_path / "named.pt"))
    model = torch.jit.load(str(tmp_path / "named.pt")).eval()
    expected, forward = model(x)["out"], model.__dict__.get("forward")
    with instrument_module(model) as handle:
        assert handle.paths == ["model"]
        with profile(tmp_path / "m.trace.json", ops=False, compile=False, sample_hz=0, gpu="off") as s:
            assert torch.equal(model(x)["out"], expected)
    assert _region_paths(s.path) == ["model"] and model.__dict__.get("forward") is forward


def test_user_instance_forward_is_wrapped_and_put_back(tmp_path):
    model = torch.nn.Linear(2, 2)
    calls = []

    def custom_forward(x):
        calls.append(1)
        return x * 2

    model.forward = custom_forward
    with instrument_module(model):
        with profile(tmp_path / "c.trace.json", ops=False, compile=False, sample_hz=0, gpu="off") as s:
            out = model(torch.ones(1, 2))
    assert model.forward is custom_forward and torch.equal(out, torch.full((1, 2), 2.0))
    assert calls == [1] and _region_paths(s.path) == ["model"]


def test_exception_inside_module_closes_region(tmp_path):
    class Boom(torch.nn.Module):
        def forward(self, x):
            raise RuntimeError("boom")

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), Boom())
    with instrument_module(model):
        with profile(tmp_path / "b.trace.json", ops=False, compile=False, sample_hz=0, gpu="off") as s:
            with pytest.raises(RuntimeError):
                model(torch.randn(1, 2))
    assert sorted(_region_paths(s.path)) == ["model", "model/model.0", "model/model.1"]


def test_bad_arguments():
    with pytest.raises(ConfigError):
        instrument_module(object())
    with pytest.raises(ConfigError):
        instrument_module(_model(), depth=-1)


@pytest.mark.slow
def test_idle_instrumentation_causes_no_graph_break_or_recompile():
    from torch._dynamo.utils import counters

    model, x = _model(), torch.randn(2, 8)
    handle = instrument_module(model)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, backend="eager")
    for _ in range(3):
        compiled(x)
    graph_breaks = sum(counters["graph_break"].values())
    unique_graphs = counters["stats"]["unique_graphs"]
    handle.remove()
    torch._dynamo.reset()
    assert graph_breaks == 0
    assert unique_graphs == 1
