"""A factory or model of the user's that fails is reported as theirs, with the fix, not as
cuvil-pgc's internal error (`--model FILE:FACTORY` on profile, recompile and compare)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from cuvil_pgc._modelspec import load_model_spec
from cuvil_pgc.errors import ModelSpecError

SOURCE = textwrap.dedent('''
    import types

    import torch
    from torch import nn


    def raises():
        raise RuntimeError("no weights here")


    def list_inputs():
        return nn.Linear(4, 2), [torch.randn(3, 4)]


    def dict_inputs():
        return nn.Linear(4, 2), {"features": torch.randn(3, 4)}


    def keyword_inputs():
        return nn.Linear(4, 2), {"input": torch.randn(3, 4)}


    class Flagged(nn.Module):      # as Hugging Face models in transformers 5 take their flags
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)

        def forward(self, input_ids, attention_mask=None, **kwargs):
            out = self.fc(input_ids * attention_mask)
            return (out, out) if kwargs.get("output_hidden_states") else out


    def flag_inputs():
        x = torch.randn(3, 4)
        return Flagged(), {"input_ids": x, "attention_mask": torch.ones_like(x), "output_hidden_states": True}


    class Configured(Flagged):      # ... and read each flag from their config where a call leaves it out
        def __init__(self):
            super().__init__()
            self.config = types.SimpleNamespace(output_hidden_states=False, return_dict=True)


    def config_flag_inputs():
        x = torch.randn(3, 4)
        return Configured(), {"input_ids": x, "attention_mask": torch.ones_like(x), "output_hidden_states": True,
                              "return_dict": True}


    def bad_shape():
        return nn.Linear(4, 2), (torch.randn(3, 5),)


    def fine():
        return nn.Linear(4, 2), [torch.randn(3, 4)][0]


    class Counting(nn.Module):      # a streaming model: its forward assigns its counter anew
        def __init__(self):
            super().__init__()
            self.bn = nn.BatchNorm1d(4)
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))

        def forward(self, x):
            self.calls = self.calls + 1
            return self.bn(x)


    def training_mode():            # the factory forgot .eval(): the call moves the running statistics
        return Counting(), (torch.randn(8, 4) + 3,)


    class Growing(nn.Module):       # a cache its first call grows in place
        def __init__(self):
            super().__init__()
            self.register_buffer("cache", torch.zeros(2))

        def forward(self, x):
            self.cache.resize_(x.shape[0]).fill_(1.0)
            return x + self.cache[:, None]


    def growing():
        return Growing(), (torch.randn(5, 3),)


    class Counted(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))

        def forward(self, x):
            self.calls.add_(1)
            return self.fc(x)


    def scripted():                 # a TorchScript model, as a service loads one with torch.jit.load
        return torch.jit.script(Counted().eval()), (torch.randn(3, 4),)
''')


@pytest.fixture
def models(tmp_path):
    path = tmp_path / "user_models.py"
    path.write_text(SOURCE)
    return path


def test_a_factory_that_raises_names_the_factory_and_the_error(models):
    with pytest.raises(ModelSpecError, match=r"raises: the factory raised RuntimeError: no weights here") as err:
        load_model_spec(f"{models}:raises")
    assert "--debug" in str(err.value)


def test_a_list_of_inputs_is_one_argument_and_the_error_says_to_return_a_tuple(models):
    with pytest.raises(ModelSpecError, match=r"the model raised on its example inputs: TypeError") as err:
        load_model_spec(f"{models}:list_inputs")
    assert "example_inputs is a list" in str(err.value) and "tuple(inputs)" in str(err.value)


def test_the_check_call_leaves_the_model_s_buffers_as_the_factory_made_them(models):
    model, inputs = load_model_spec(f"{models}:training_mode")
    fresh = model.bn.running_mean.clone()
    assert model.training and model.bn.num_batches_tracked.item() == 0
    assert torch.equal(model.bn.running_mean, torch.zeros(4)) and torch.equal(fresh, torch.zeros(4))
    assert model.calls.item() == 0 and model.calls is model._buffers["calls"]
    model(*inputs)                  # the model itself still updates them
    assert model.calls.item() == 1 and model.bn.num_batches_tracked.item() == 1


def test_the_check_call_puts_back_a_torchscript_model_s_buffers(models):
    """A TorchScript module's ``_buffers`` is torch.jit's wrapper, without ``get``: the check call's
    put-back raised into every profile of a model loaded with ``torch.jit.load`` that had a buffer."""
    model, inputs = load_model_spec(f"{models}:scripted")
    assert isinstance(model, torch.jit.ScriptModule) and model.calls.item() == 0
    model(*inputs)
    assert model.calls.item() == 1


def test_a_buffer_the_check_call_resized_in_place_is_put_back_whole(models):
    model, inputs = load_model_spec(f"{models}:growing")
    assert torch.equal(model.cache, torch.zeros(2))
    assert model(*inputs).shape == (5, 3)


def test_a_dict_naming_the_forward_s_parameters_is_the_call_s_keywords(models):
    model, inputs = load_model_spec(f"{models}:keyword_inputs")
    assert len(inputs) == 1 and inputs[0].shape == (3, 4)


def test_a_dict_of_other_keys_is_one_argument_and_the_error_says_to_name_the_parameters(models):
    with pytest.raises(ModelSpecError, match=r"the model raised on its example inputs: TypeError") as err:
        load_model_spec(f"{models}:dict_inputs")
    assert "example_inputs is a dict whose keys are not all parameters of the forward ('features' not among them)" \
        in str(err.value)
    assert "input_ids, attention_mask" in str(err.value)


def test_a_flag_for_the_forward_s_kwargs_gets_the_wrapper_to_write_as_its_fix(models):
    """transformers 5 moved output_hidden_states, return_dict and the like into **kwargs: "keep only
    the forward's parameters" would drop what the user asked for."""
    with pytest.raises(ModelSpecError, match=r"the model raised on its example inputs") as err:
        load_model_spec(f"{models}:flag_inputs")
    message = str(err.value)
    assert "'output_hidden_states' is not among the forward's named parameters but goes to its **kwargs" in message
    assert ("def forward(self, input_ids, attention_mask): return self.model(input_ids=input_ids, "
            "attention_mask=attention_mask, output_hidden_states=True)") in message
    assert "keep only the forward's parameters" not in message


def test_a_hugging_face_flag_in_the_example_inputs_gets_the_config_setting_as_its_fix(models):
    """A model with a config reads the flag from it: setting it there needs no wrapper, and calls
    passing the flag then run the build (they repeat the config, see realized._as_configured)."""
    with pytest.raises(ModelSpecError, match=r"the model raised on its example inputs") as err:
        load_model_spec(f"{models}:config_flag_inputs")
    message = str(err.value)
    assert ("'output_hidden_states', 'return_dict' go to the forward's **kwargs, which a build's example inputs "
            "cannot carry; a Hugging Face model reads them from its config: set model.config.output_hidden_states = "
            "True; model.config.return_dict = True (in the process that loads the build too") in message
    assert "calls passing output_hidden_states=True, return_dict=True run the build" in message
    assert "def forward(self" not in message


def test_a_model_failing_on_its_inputs_is_reported_before_any_work(models):
    with pytest.raises(ModelSpecError, match=r"bad_shape: the model raised on its example inputs: RuntimeError"):
        load_model_spec(f"{models}:bad_shape")
    model, inputs = load_model_spec(f"{models}:fine")
    assert inputs[0].shape == (3, 4)
    model, inputs = load_model_spec(f"{models}:bad_shape", check=False)      # asked not to call it


@pytest.mark.parametrize("command", ["profile", "recompile"])
def test_the_cli_prints_the_users_error_not_an_internal_one(models, tmp_path, command):
    args = {"profile": ["profile", "--model", f"{models}:raises", "-o", str(tmp_path / "t.json")],
            "recompile": ["recompile", str(tmp_path / "missing.trace.json"), "--model", f"{models}:list_inputs",
                          "-o", str(tmp_path / "b.cuvilpkg")]}[command]
    run = subprocess.run([sys.executable, "-m", "cuvil_pgc", *args], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    assert "internal error" not in run.stderr and "Traceback" not in run.stderr
    assert ("the factory raised RuntimeError: no weights here" if command == "profile"
            else "the model raised on its example inputs") in run.stderr


@pytest.mark.parametrize(("source", "expected"), [
    ("import torch\nimport not_installed_dependency_xyz\n", "raised ModuleNotFoundError: No module named 'not_installed_dependency_xyz'"),
    ("def build(:\n", "raised SyntaxError"),
    ("raise RuntimeError('no GPU here')\n", "raised RuntimeError: no GPU here"),
])
def test_a_model_file_that_fails_to_import_is_the_users_error(tmp_path, monkeypatch, source, expected):
    (tmp_path / "broken_models.py").write_text(source)
    with pytest.raises(ModelSpecError, match=expected):
        load_model_spec(f"{tmp_path / 'broken_models.py'}:build")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ModelSpecError, match=f"importing broken_models {expected}"):
        load_model_spec("broken_models:build")
    monkeypatch.delitem(sys.modules, "broken_models", raising=False)


def test_a_module_that_does_not_exist_is_named_as_such():
    with pytest.raises(ModelSpecError, match="cannot import module 'no_such_models_xyz.sub'"):
        load_model_spec("no_such_models_xyz.sub:build")
