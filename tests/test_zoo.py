"""The bundled model zoo: contract of every factory (determinism, shapes, eval mode, names)."""

from __future__ import annotations

import re

import pytest
import torch

import cuvil_pgc.zoo as zoo
from cuvil_pgc._modelspec import load_model_spec
from cuvil_pgc.errors import ModelSpecError

EXPECTED_OUTPUT_SHAPES = {
    "mlp": [(1, 10)],
    "cnn": [(1, 10)],
    "lstm_step": [(1, 64), (1, 1, 256), (1, 1, 256)],
    "transformer": [(1, 10)],
    "mixed": [(1, 10)],
    "gru_tagger": [(1, 32, 17)],
    "tiny_bert": [(1, 2)],
}
# A dotted path of identifiers / ModuleList indices, as instrument_module turns into region names.
MODULE_PATH = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.([A-Za-z_][A-Za-z0-9_]*|[0-9]+))*$")
NAMES = sorted(zoo.ZOO)


def _run(model: torch.nn.Module, inputs: tuple) -> list[torch.Tensor]:
    with torch.inference_mode():
        out = model(*inputs)
    return list(out) if isinstance(out, tuple) else [out]


def test_registry_holds_the_issue_models() -> None:
    assert {"mlp", "cnn", "lstm_step", "transformer", "mixed", "gru_tagger", "tiny_bert"} <= set(zoo.ZOO)
    assert set(EXPECTED_OUTPUT_SHAPES) == set(zoo.ZOO)


@pytest.mark.parametrize("name", NAMES)
def test_factory_returns_eval_float32_cpu_model_and_tuple_inputs(name: str) -> None:
    model, inputs = zoo.get(name)()
    assert isinstance(model, torch.nn.Module)
    assert isinstance(inputs, tuple) and inputs
    assert all(isinstance(x, torch.Tensor) and x.device.type == "cpu" for x in inputs)
    assert all(x.shape[0] == 1 for x in inputs), "zoo models run at batch 1"
    assert not any(m.training for m in model.modules())
    tensors = list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]
    assert tensors and all(t.dtype == torch.float32 and t.device.type == "cpu" for t in tensors)


@pytest.mark.parametrize("name", NAMES)
def test_factory_is_deterministic_and_outputs_have_expected_shapes(name: str) -> None:
    model_a, inputs_a = zoo.ZOO[name]()
    model_b, inputs_b = zoo.ZOO[name]()
    for x, y in zip(inputs_a, inputs_b, strict=True):
        assert torch.equal(x, y)
    state_b = model_b.state_dict()
    for key, value in model_a.state_dict().items():
        assert torch.equal(value, state_b[key]), key
    out_a, out_b = _run(model_a, inputs_a), _run(model_b, inputs_b)
    assert [tuple(o.shape) for o in out_a] == EXPECTED_OUTPUT_SHAPES[name]
    for x, y in zip(out_a, out_b, strict=True):
        assert torch.equal(x, y)
        assert torch.isfinite(x).all()
    assert torch.equal(out_a[0], _run(model_a, inputs_a)[0]), "a second forward changed the output"


@pytest.mark.parametrize("name", NAMES)
def test_seed_changes_weights_and_leaves_global_rng_alone(name: str) -> None:
    torch.manual_seed(99)
    before = torch.get_rng_state()
    model_0, _ = zoo.ZOO[name](seed=0)
    model_1, _ = zoo.ZOO[name](seed=1)
    assert torch.equal(torch.get_rng_state(), before)
    first = next(iter(model_0.state_dict()))
    assert not torch.equal(model_0.state_dict()[first], model_1.state_dict()[first])


@pytest.mark.parametrize("name", NAMES)
def test_module_names_are_instrument_friendly(name: str) -> None:
    model, _ = zoo.ZOO[name]()
    children = [child for child, _ in model.named_children()]
    assert len(children) >= 2, "at least two top-level regions to rank"
    assert all(not child.isdigit() for child in children), "top-level regions need descriptive names"
    for path, _module in model.named_modules():
        assert path == "" or MODULE_PATH.match(path), path


def test_batchnorm_statistics_are_not_identity() -> None:
    model, _ = zoo.cnn()
    norms = [m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms
    assert all(not torch.allclose(m.running_var, torch.ones_like(m.running_var)) for m in norms)


@pytest.mark.parametrize("name", ["mlp", "lstm_step"])
def test_factories_resolve_through_model_spec(name: str) -> None:
    model, inputs = load_model_spec(f"cuvil_pgc.zoo:{name}")
    reference, ref_inputs = getattr(zoo, name)()
    assert type(model) is type(reference)
    assert all(torch.equal(x, y) for x, y in zip(inputs, ref_inputs, strict=True))


def test_get_unknown_name_lists_the_zoo() -> None:
    with pytest.raises(ModelSpecError) as info:
        zoo.get("resnet152")
    assert "resnet152" in str(info.value) and "lstm_step" in str(info.value)
