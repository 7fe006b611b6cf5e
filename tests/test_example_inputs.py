"""Example inputs given as one tensor or as a tokenizer's mapping of parameter names mean the
call they stand for (cuvil_pgc._example_inputs): one tensor used to be iterated as the tuple of
inputs, so recompile built a (1, 32) input as one (32,) argument, and a mapping became its keys."""

from __future__ import annotations

import functools
import types
from collections import UserDict

import pytest
import torch
from torch import nn

from cuvil_pgc._example_inputs import positional_inputs
from cuvil_pgc.errors import ConfigError, RecompileError
from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate

pytestmark = pytest.mark.usefixtures("build_env")


class Encoder(nn.Module):
    """A Hugging Face-like forward: ids first, then optional tensors, then flags."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc = nn.Embedding(50, 8), nn.Linear(8, 4)

    def forward(self, input_ids, attention_mask=None, token_type_ids=None, output_hidden=False):
        h = self.emb(input_ids)
        if attention_mask is not None:
            h = h * attention_mask.unsqueeze(-1)
        if token_type_ids is not None:
            h = h + token_type_ids.unsqueeze(-1)
        return self.fc(h).mean(1)


class BatchEncoding(UserDict):
    """What a tokenizer returns: a mapping, not a dict."""


def test_one_tensor_is_the_one_argument_with_its_batch_dimension():
    x = torch.randn(1, 32)
    (arg,) = positional_inputs(nn.Linear(32, 4), x)
    assert arg is x


def test_a_tuple_is_kept_and_a_list_is_one_argument():
    x = torch.randn(2, 3)
    assert positional_inputs(nn.Linear(3, 1), (x,)) == (x,)
    assert positional_inputs(nn.Linear(3, 1), [x])[0] == [x]


def test_a_mapping_of_parameter_names_binds_in_the_forward_s_order_with_skipped_defaults():
    ids, types = torch.randint(0, 50, (2, 6)), torch.zeros(2, 6)
    args = positional_inputs(Encoder(), BatchEncoding(token_type_ids=types, input_ids=ids))
    assert len(args) == 3 and args[0] is ids and args[1] is None and args[2] is types


def test_a_mapping_of_other_keys_is_one_argument_and_one_skipping_a_required_parameter_is_refused():
    batch = {"ids": torch.zeros(2)}
    assert positional_inputs(Encoder(), batch) == (batch,)
    with pytest.raises(ConfigError, match="not 'input_ids', which the model's forward takes before them"):
        positional_inputs(Encoder(), {"attention_mask": torch.ones(2, 6)})


def test_a_mapping_is_not_bound_past_positional_only_parameters():
    class PositionalOnly(nn.Module):
        def forward(self, x, /, mask=None):
            return x

    batch = {"mask": torch.ones(2)}
    assert positional_inputs(PositionalOnly(), batch) == (batch,)     # not the mask in x's place


def test_recompile_builds_one_tensor_at_its_own_shape_and_a_tokenizer_s_output_as_keywords():
    torch.manual_seed(0)
    build = recompile(nn.Linear(32, 4).eval(), torch.randn(1, 32), plan={"": Candidate("", "compile")},
                      records=False, deployed_race=False, rounds=3, calibrate=False)
    assert build.plan.choices[0].input_spec[0][0] == [1, 32]
    model, ids = Encoder().eval(), torch.randint(0, 50, (2, 6))
    build = recompile(model, BatchEncoding(input_ids=ids, attention_mask=torch.ones(2, 6)),
                      plan={"": Candidate("", "compile")}, records=False, deployed_race=False, rounds=3, calibrate=False)
    assert [spec[0] for spec in build.plan.choices[0].input_spec] == [[2, 6], [2, 6]]
    with torch.no_grad():
        torch.testing.assert_close(build.module(input_ids=ids, attention_mask=torch.ones(2, 6)), model(ids))


def test_a_tokenizer_s_output_that_skips_a_parameter_is_called_by_keyword_on_the_build():
    """GPT-2's forward takes its cache (``past_key_values``) before ``attention_mask``: its tokenizer's
    output was built with None in its place, and the same keyword call of the loaded build then ran
    the original module on every call."""
    torch.manual_seed(0)
    model, ids, types = Encoder().eval(), torch.randint(0, 50, (2, 6)), torch.ones(2, 6)
    build = recompile(model, BatchEncoding(input_ids=ids, token_type_ids=types),     # attention_mask skipped
                      plan={"": Candidate("", "compile")}, records=False, deployed_race=False, rounds=3, calibrate=False)
    region = build.module
    with torch.no_grad():
        for call in (lambda: region(input_ids=ids, token_type_ids=types), lambda: region(ids, token_type_ids=types),
                     lambda: region(token_type_ids=types, input_ids=ids, output_hidden=False)):
            torch.testing.assert_close(call(), model(ids, None, types))
        assert region.fallback_calls == 0
        torch.testing.assert_close(region(input_ids=ids, attention_mask=types), model(ids, types))  # another call
    assert region.fallback_calls == 1


def test_recompile_reports_the_model_raising_on_a_list_of_inputs_with_the_fix():
    with pytest.raises(RecompileError, match="the model raised on its example inputs") as err:
        recompile(nn.Linear(3, 1), [torch.randn(2, 3)], records=False, deployed_race=False, calibrate=False)
    assert "tuple(inputs)" in str(err.value)


class KeywordOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, *, x):
        return self.fc(x)


def test_a_mapping_of_keyword_only_parameters_is_refused_with_a_wrapper_not_as_unknown_keys():
    """The hint used to say 'x' was not among the forward's parameters."""
    with pytest.raises(RecompileError) as err:
        recompile(KeywordOnly(), {"x": torch.randn(2, 3)}, records=False, deployed_race=False, calibrate=False)
    message = str(err.value)
    assert "'x' is a keyword-only parameter of the forward" in message and "return self.model(x=x)" in message
    assert "not among them" not in message


class NamedFeatures(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.text, self.image = nn.Linear(3, 2), nn.Linear(4, 2)

    def forward(self, **features):
        return self.text(features["text"]) + self.image(features["image"])


def test_a_forward_taking_only_kwargs_gets_the_wrapper_that_names_them():
    """``forward(self, **features)``: the hint said to keep only the forward's parameters, which
    names none; the fix is a wrapper whose forward names each feature, and that one builds."""
    inputs = {"text": torch.randn(2, 3), "image": torch.randn(2, 4)}
    with pytest.raises(RecompileError) as err:
        recompile(NamedFeatures(), inputs, records=False, deployed_race=False, calibrate=False)
    message = str(err.value)
    assert "takes its inputs as **kwargs ('text', 'image')" in message, message
    assert "def forward(self, text, image): return self.model(text=text, image=image)" in message

    class Named(nn.Module):          # the wrapper the hint writes
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, text, image):
            return self.model(text=text, image=image)

    build = recompile(Named(NamedFeatures()), inputs, records=False, deployed_race=False, calibrate=False,
                      backends=("eager",))
    torch.testing.assert_close(build.module(**inputs), NamedFeatures.forward(build.module.model, **inputs))


class SomeKeywordOnly(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 1)

    def forward(self, x, *, scale=1.0):
        return self.fc(x) * scale


def test_the_wrapper_for_keyword_only_parameters_passes_the_positional_ones_too():
    """The suggested wrapper dropped the forward's positional parameters (x)."""
    with pytest.raises(RecompileError) as err:
        recompile(SomeKeywordOnly(), {"x": torch.randn(2, 3), "scale": torch.tensor(2.0)}, records=False,
                  deployed_race=False, calibrate=False)
    assert "def forward(self, x, scale): return self.model(x, scale=scale)" in str(err.value)


def _passes_use_cache_by_keyword(forward):
    """As Hugging Face's ``merge_with_config_defaults`` does where a ``deprecate_kwarg`` wrapper hides
    the parameter's position from it (an M2M100 in transformers 5): the flag goes in by keyword too."""

    @functools.wraps(forward)
    def wrapper(self, *args, **kwargs):
        kwargs.setdefault("use_cache", self.config.use_cache)
        return forward(self, *args, **kwargs)
    return wrapper


class Decorated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.config = nn.Linear(3, 1), types.SimpleNamespace(use_cache=True)

    @_passes_use_cache_by_keyword
    def forward(self, x, use_cache=None):
        return self.fc(x)


def test_a_parameter_the_forward_s_decorator_passes_by_keyword_gets_the_config_as_the_fix():
    """The hint used to say the mapping was passed as one argument, whose keys were not all
    parameters of the forward: they all were, and the call bound them by position."""
    with pytest.raises(RecompileError) as err:
        recompile(Decorated(), {"x": torch.randn(2, 3), "use_cache": False}, records=False, deployed_race=False,
                  calibrate=False)
    message = str(err.value)
    assert "got multiple values for argument 'use_cache'" in message
    assert "set model.config.use_cache = False and leave 'use_cache' out of the example inputs" in message
    assert "passed as one argument" not in message
