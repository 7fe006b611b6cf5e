"""What a runtime region takes and returns beyond plain tensors: Python values computed from the
inputs (refused, not frozen), shapes and devices in the output, a dict as the positional input,
keyword calls of a region captured positionally, and why a call falls back."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile._stderr import first_line
from cuvil_pgc.recompile.accuracy import check_outputs
from cuvil_pgc.recompile.apply import ScopeInputs, realize
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.export_error import ExportError
from cuvil_pgc.recompile.output_values import check_constant_outputs, other_values

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


class ItemOut(nn.Module):
    """Returns the probabilities, their maximum as a float and a flag computed from them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 5)

    def forward(self, x: torch.Tensor):
        probs = self.fc(x).softmax(-1)
        return probs, probs.max().item(), bool(probs[0, 0] > 0.2)


class FixedExtras(nn.Module):
    """Besides a tensor: None, a shape, a number from the shape, a string and the device."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor):
        y = self.fc(x)
        return {"y": y, "none": None, "shape": y.shape, "rows": x.shape[0], "tag": "fc", "device": y.device}


def test_python_values_computed_from_the_inputs_refuse_the_runtime_naming_the_output():
    torch.manual_seed(0)
    model, x = ItemOut().eval(), torch.randn(2, 8)
    with pytest.raises(ExportError, match=r"torch\.onnx\.export failed: output\[1\] is a float that changes with the "
                                          r"input values \(0\.\d+, then 0\.\d+\)") as err:
        check_constant_outputs(model, ScopeInputs((x,)), model(x), "torch.onnx.export")
    assert err.value.exporter == "torch.onnx.export"          # the exporter's other candidates are skipped too


def test_an_object_holding_tensors_it_cannot_rebuild_is_refused_by_its_type():
    """An object the pytree leaves whole is rebuilt around the runtime's tensors
    (:mod:`~cuvil_pgc.recompile.object_outputs`); one holding tensors in ``__slots__`` cannot be,
    and putting the example's back would return its tensors for every input."""

    class Cache:
        __slots__ = ("k",)

        def __init__(self, k):
            self.k = k

    class WithCache(nn.Module):
        def forward(self, x):
            return x * 2, Cache(x + 1)

    x = torch.randn(2, 3)
    with pytest.raises(ExportError, match=r"output\[1\] is a Cache holding tensors that neither torch's pytree nor "
                                          r"cuvil-pgc opens .*use_cache=False"):
        check_constant_outputs(WithCache(), ScopeInputs((x,)), WithCache()(x), "torch.onnx.export")


def test_values_the_export_fixes_anyway_are_kept_as_constants():
    model, x = FixedExtras().eval(), torch.randn(2, 8)
    check_constant_outputs(model, ScopeInputs((x,)), model(x), "torch.onnx.export")      # does not raise


def test_a_region_that_cannot_run_on_other_values_is_refused_rather_than_trusted():
    class Picky(nn.Module):
        def forward(self, x):
            if not torch.equal(x, torch.ones_like(x)):
                raise ValueError("only ones")
            return x + 1, x.sum().item()

    x = torch.ones(3)
    with pytest.raises(ExportError, match=r"could not be checked with other input values \(ValueError: only ones\)"):
        check_constant_outputs(Picky(), ScopeInputs((x,)), Picky()(x), "torch.onnx.export")


def test_other_values_keep_shapes_dtypes_and_every_integer_a_valid_index():
    ids, x, mask = torch.tensor([[3, 1, 4, 1]]), torch.randn(2, 3), torch.tensor([[True, True, False]])
    (ids2, x2), kw = other_values(((ids, x), {"mask": mask}))
    assert ids2.shape == ids.shape and sorted(ids2.flatten().tolist()) == sorted(ids.flatten().tolist())
    assert not torch.equal(ids2, ids) and not torch.equal(x2, x) and x2.dtype == x.dtype and x2.shape == x.shape
    assert kw["mask"].dtype == torch.bool and kw["mask"].sum() == mask.sum()
    torch.testing.assert_close(other_values(x), x2)          # seeded: the same values every time


@needs_ort
def test_an_ort_region_never_returns_the_examples_python_values():
    """Before, the float and the flag of the example call came back for every input."""
    torch.manual_seed(0)
    model, x = ItemOut().eval(), torch.randn(2, 8)
    with pytest.raises(ExportError, match=r"output\[1\] is a float that changes"):
        realize(model, Candidate("", "ort"), ScopeInputs((x,)), machine="t")


@needs_ort
def test_an_ort_region_returns_shapes_devices_and_constants_as_the_original_does():
    torch.manual_seed(0)
    model, x = FixedExtras().eval(), torch.randn(2, 8)
    region = realize(model, Candidate("", "ort"), ScopeInputs((x,)), machine="t").module
    with torch.no_grad():
        out, ref = region(x), model(x)
    assert type(out["shape"]) is torch.Size and out["shape"] == ref["shape"]      # not a plain tuple
    assert out["device"] == ref["device"] and out["rows"] == 2 and out["tag"] == "fc" and out["none"] is None
    assert check_outputs(ref, out).ok


def test_the_accuracy_guard_compares_devices_and_dtypes_by_value():
    ref = {"y": torch.ones(2), "device": torch.device("cpu"), "dtype": torch.float32}
    assert check_outputs(ref, {"y": torch.ones(2), "device": torch.device("cpu"), "dtype": torch.float32}).ok
    other = check_outputs(ref, {"y": torch.ones(2), "device": torch.device("meta"), "dtype": torch.float32})
    assert not other.ok and "device" in other.reason


class DictInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, batch: dict):
        return self.fc(batch["x"]) + batch["y"]


@needs_ort
def test_a_region_taking_a_dict_as_its_positional_input_exports():
    """torch.onnx.export reads a trailing dict in args as keyword arguments; the export used to fail
    with "forward() got an unexpected keyword argument 'x'"."""
    torch.manual_seed(0)
    model, batch = DictInput().eval(), {"x": torch.randn(2, 4), "y": torch.randn(2, 3)}
    region = realize(model, Candidate("", "ort"), ScopeInputs((batch,)), machine="t").module
    with torch.no_grad():
        torch.testing.assert_close(region(batch), model(batch), rtol=1e-4, atol=1e-5)


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, output_attentions: bool | None = None,
                scale: float = 1.0):
        return self.fc(input_ids * attention_mask) * scale


@needs_ort
def test_keyword_calls_of_a_region_captured_positionally_run_the_build(caplog):
    """``model(input_ids=..., attention_mask=...)`` is how services call Hugging Face models; it used
    to run the original module on every call, with the same shapes."""
    torch.manual_seed(0)
    model, ids, mask = TwoInputs().eval(), torch.randn(2, 6), torch.ones(2, 6)
    region = realize(model, Candidate("", "ort"), ScopeInputs((ids, mask)), machine="t").module
    forwards = []
    real_forward = region.forward
    region.forward = lambda *a, **k: forwards.append(k) or real_forward(*a, **k)
    with torch.no_grad():
        ref = model(ids, mask)
        for call in (lambda: region(input_ids=ids, attention_mask=mask),
                     lambda: region(ids, attention_mask=mask),
                     lambda: region(attention_mask=mask, input_ids=ids, output_attentions=None, scale=1.0)):
            torch.testing.assert_close(call(), ref, rtol=1e-4, atol=1e-5)
        assert forwards == [] and region.fallback_calls == 0          # the lean call, every time
        handle = region.register_forward_pre_hook(lambda mod, args, kwargs: None, with_kwargs=True)
        torch.testing.assert_close(region(input_ids=ids, attention_mask=mask), ref, rtol=1e-4, atol=1e-5)
        handle.remove()
        assert forwards == [{"input_ids": ids, "attention_mask": mask}]  # a hook sees the call as made
        assert region.fallback_calls == 0                                # and forward still runs the build
        with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.apply"):
            torch.testing.assert_close(region(input_ids=ids, attention_mask=mask, scale=2.0), model(ids, mask, scale=2.0))
    assert region.fallback_calls == 1                                    # a keyword the build did not fix
    assert "keyword arguments past the 2 captured input(s) (scale)" in caplog.text    # the one it cannot bind


@needs_ort
@pytest.mark.parametrize("impl", ["c", "python"])
def test_keyword_calls_bind_without_walking_the_parameters_once_seen(monkeypatch, impl):
    """Bound the long way (the forward's parameters walked, each keyword past the captured ones
    checked against its default), a keyword call cost 28 µs of a 2-layer BERT's 0.39 ms OpenVINO
    call: a call naming the captured positions, and the extras seen to bind before, binds at once."""
    from cuvil_pgc.recompile import lean_call, lean_setup, realized

    if impl == "python":
        monkeypatch.setattr(lean_setup, "keyword_positions", lean_call.python_keyword_positions)
    elif not lean_call.ACCELERATED:
        pytest.skip("the C lean call is not built")
    torch.manual_seed(0)
    model, ids, mask = TwoInputs().eval(), torch.randn(2, 6), torch.ones(2, 6)
    region = realize(model, Candidate("", "ort"), ScopeInputs((ids, mask)), machine="t").module
    walks, real = [], realized.bind_call
    monkeypatch.setattr(realized, "bind_call", lambda *a, **k: walks.append(1) or real(*a, **k))
    with torch.no_grad():
        ref = model(ids, mask)
        for call in (lambda: region(input_ids=ids, attention_mask=mask), lambda: region(ids, attention_mask=mask)):
            torch.testing.assert_close(call(), ref, rtol=1e-4, atol=1e-5)
        assert walks == []
        for _ in range(3):
            out = region(attention_mask=mask, input_ids=ids, output_attentions=None, scale=1.0)
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        assert walks == [1] and region._extras == {"output_attentions": None, "scale": 1.0}     # learned once
        clone = copy.deepcopy(region)                                                   # a replica binds alike
        torch.testing.assert_close(clone(input_ids=ids, attention_mask=mask, scale=1.0), ref, rtol=1e-4, atol=1e-5)
        assert walks == [1]
        other = region(input_ids=ids, attention_mask=mask, scale=2.0)                   # another value: the long way
        torch.testing.assert_close(other, model(ids, mask, scale=2.0), rtol=1e-4, atol=1e-5)
    assert region.fallback_calls == 1 and len(walks) > 1


class SkipsACache(nn.Module):
    """GPT-2's order: the ids, then a cache a service leaves None, then the mask; ids index a table."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc = nn.Embedding(30, 6), nn.Linear(6, 2)

    def forward(self, input_ids, past_key_values=None, attention_mask=None, use_cache: bool | None = None):
        return self.fc(self.emb(input_ids) * attention_mask.unsqueeze(-1))


@needs_ort
def test_a_region_captured_with_none_among_its_inputs_takes_the_lean_call_after_its_first():
    """A tokenizer's mapping that skips GPT-2's past_key_values is captured as (ids, None, mask): no
    spec of tensors, so every call went through nn.Module's dispatch and the hashed signature."""
    torch.manual_seed(0)
    model, ids, mask = SkipsACache().eval(), torch.randint(0, 30, (2, 5)), torch.ones(2, 5)
    region = realize(model, Candidate("", "ort"), ScopeInputs((ids, None, mask)), machine="t").module
    forwards = []
    real_forward = region.forward
    region.forward = lambda *a, **k: forwards.append(len(a)) or real_forward(*a, **k)
    with torch.no_grad():
        ref = model(ids, None, mask)
        torch.testing.assert_close(region(ids, None, mask), ref, rtol=1e-4, atol=1e-5)        # learns the call
        assert forwards == [3]
        for call in (lambda: region(ids, None, mask), lambda: region(input_ids=ids, attention_mask=mask),
                     lambda: region(ids, attention_mask=mask, use_cache=None)):
            torch.testing.assert_close(call(), ref, rtol=1e-4, atol=1e-5)
        assert forwards == [3] and region.fallback_calls == 0         # the lean call, every time
        cache = torch.zeros(2, 5)                                     # a tensor where None was captured
        torch.testing.assert_close(region(ids, cache, mask), model(ids, cache, mask))
        assert region.fallback_calls == 1
        bad = ids.clone()
        bad[0, 0] = 30                                                # an id past the table: eager's error
        with pytest.raises(IndexError):
            region(input_ids=bad, attention_mask=mask)


class Flagged(SkipsACache):
    def forward(self, input_ids, past_key_values=None, attention_mask=None, use_cache: bool | None = None):
        out = super().forward(input_ids, past_key_values, attention_mask)
        return out if use_cache is False else out + 1


@needs_ort
def test_a_region_captured_with_a_flag_among_its_inputs_takes_the_lean_call_after_its_first():
    """A Hugging Face call with use_cache=False is captured as (ids, None, mask, False): every call
    went through nn.Module's dispatch, the hashed signature and the runner's generic call (an OPT on
    OpenVINO: 219 µs a call against 121 µs for its runner's own call)."""
    torch.manual_seed(0)
    model, ids, mask = Flagged().eval(), torch.randint(0, 30, (2, 5)), torch.ones(2, 5)
    region = realize(model, Candidate("", "ort"), ScopeInputs((ids, None, mask, False)), machine="t").module
    forwards = []
    real_forward = region.forward
    region.forward = lambda *a, **k: forwards.append(len(a)) or real_forward(*a, **k)
    with torch.no_grad():
        ref = model(ids, None, mask, False)
        torch.testing.assert_close(region(ids, None, mask, False), ref, rtol=1e-4, atol=1e-5)   # learns the call
        for call in (lambda: region(ids, None, mask, False),
                     lambda: region(input_ids=ids, attention_mask=mask, use_cache=False)):
            torch.testing.assert_close(call(), ref, rtol=1e-4, atol=1e-5)
        assert forwards == [4] and region.fallback_calls == 0         # the lean call, every time
        for flag in (True, 0, None):                                  # another value or type: the original module
            torch.testing.assert_close(region(ids, None, mask, flag), model(ids, None, mask, flag))
        assert region.fallback_calls == 3


@needs_ort
def test_the_fallback_warning_says_what_does_not_fit(caplog):
    torch.manual_seed(0)
    model, ids, mask = TwoInputs().eval(), torch.randn(2, 6), torch.ones(2, 6)
    region = realize(model, Candidate("", "ort"), ScopeInputs((ids, mask)), machine="t").module
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.apply"):
        region(torch.randn(3, 6), torch.ones(3, 6))
    assert "input 0 has shape (3, 6), built for (2, 6) (the build is shape-specialized; `recompile --dynamic` adds programs for other sizes)" in caplog.text
    assert "other input shapes" not in caplog.text


def test_a_native_message_is_read_past_the_source_locations_before_it():
    text = ("Exception from src/inference/src/cpp/core.cpp:117:\nException from src/plugins/intel_cpu/src/node.cpp:771:\n"
            "Subgraph node with name 'linear_1.0' Subgraph doesn't support f64 precision at input port 0.\n")
    assert first_line(text) == "Subgraph node with name 'linear_1.0' Subgraph doesn't support f64 precision at input port 0."
    assert first_line("Exception from src/inference/src/cpp/core.cpp:117:") == \
        "Exception from src/inference/src/cpp/core.cpp:117:"                 # nothing else: the location itself
    assert first_line("  \nplain message\nmore") == "plain message"


def test_a_python_number_returned_as_a_tensor_fails_the_guard():
    """AOTInductor returns a region's ``.item()`` as a 0-d tensor: equal in value, not in type."""
    assert not check_outputs((torch.ones(1), 0.5), (torch.ones(1), torch.tensor(0.5))).ok
    assert "expected a float, got a tensor" in check_outputs((0.5,), (torch.tensor(0.5),)).reason
    assert check_outputs((torch.ones(1), 0.5), (torch.ones(1), 0.5)).ok


@needs_ort
def test_a_region_saves_and_loads_the_original_models_state_dict_and_runs_new_weights_correctly(caplog):
    """``fast.load_state_dict(model.state_dict())`` used to fail on ``original.``-prefixed keys, and
    weights loaded after the build were silently ignored by the compiled program."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval(), torch.randn(3, 4)
    region = realize(model, Candidate("", "ort"), ScopeInputs((x,)), machine="t").module
    assert list(region.state_dict()) == list(model.state_dict())
    region.load_state_dict(model.state_dict())                   # the same weights: the build keeps running
    assert not region.weights_changed and region._lean is not None
    scaled = {k: v * 1.1 for k, v in model.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.apply"):
        region.load_state_dict(scaled)
    assert region.weights_changed and "differ from the ones it was built with (0.weight, 0.bias, 2.weight and 1 more)" \
        in caplog.text
    model.load_state_dict(scaled)
    with torch.no_grad():
        torch.testing.assert_close(region(x), model(x))           # the new weights, through the original module
    parent = nn.Sequential(region)                                 # a region inside a model: its keys as the model's
    assert list(parent.state_dict()) == [f"0.{k}" for k in model.state_dict()]


def test_a_torch_compile_regions_state_dict_leaves_out_the_compiled_programs_copy():
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval(), torch.randn(3, 4)
    region = realize(model, Candidate("", "compile"), ScopeInputs((x,)), machine="t").module
    assert "_compiled" in region._modules                        # the OptimizedModule is a submodule
    assert list(region.state_dict()) == list(model.state_dict())
    assert not region.load_state_dict(model.state_dict()).missing_keys and not region.weights_changed


@needs_ort
def test_a_deep_copy_shares_the_runtime_and_owns_its_weights_and_counters(caplog):
    """Services copy a model to serve replicas; a runtime session cannot be copied (it raised
    "cannot pickle InferenceSession"), and rebuilding it would repeat the build's compile time."""
    import copy

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2)).eval(), torch.randn(3, 4)
    parent = nn.Sequential(realize(model, Candidate("", "ort"), ScopeInputs((x,)), machine="t").module)
    twin = copy.deepcopy(parent)
    region, copied = parent[0], twin[0]
    assert copied.compiled is region.compiled and copied._lean is region._lean
    assert copied.original is not region.original and copied.original[0].weight is not region.original[0].weight
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model(x), rtol=1e-4, atol=1e-5)
        twin(torch.randn(5, 4))                                      # a misfit counts on the copy only
    assert copied.fallback_calls == 1 and region.fallback_calls == 0
    scaled = {k: v * 1.1 for k, v in twin.state_dict().items()}
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.apply"):
        twin.load_state_dict(scaled)
    assert copied.weights_changed and not region.weights_changed
    model.load_state_dict({k.removeprefix("0."): v for k, v in scaled.items()})
    with torch.no_grad():
        torch.testing.assert_close(twin(x), model(x))                # the copy's new weights
        assert not torch.allclose(parent(x), model(x))               # the source keeps its own


def test_a_compiled_region_refuses_pickling_with_the_way_to_ship_it():
    import io
    import pickle

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(4, 8), nn.ReLU()).eval(), torch.randn(3, 4)
    region = realize(model, Candidate("", "compile"), ScopeInputs((x,)), machine="t").module
    for dump in (pickle.dumps, lambda m: torch.save(m, io.BytesIO())):
        with pytest.raises(TypeError, match="cannot be pickled .*state_dict.*load_build on the .cuvilpkg"):
            dump(nn.Sequential(region))
    import copy

    with torch.no_grad():
        torch.testing.assert_close(copy.deepcopy(region)(x), model(x))
        torch.testing.assert_close(copy.copy(region)(x), model(x))


class ConfiguredFlags(nn.Module):
    """Like a Hugging Face model: output flags default to None (the config's), and ``**kwargs``."""

    def __init__(self) -> None:
        super().__init__()
        import types

        self.config = types.SimpleNamespace(return_dict=True, output_attentions=False)
        self.fc = nn.Linear(6, 2)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **kwargs):
        out = {"logits": self.fc(input_ids * attention_mask)}
        return out if kwargs.get("return_dict", self.config.return_dict) else tuple(out.values())


@needs_ort
def test_keyword_flags_that_repeat_the_models_config_run_the_build():
    """Services pass ``return_dict=True`` on every call of a Hugging Face model; it ran the original
    module every time although it asks for what the config gives anyway."""
    torch.manual_seed(0)
    model, ids, mask = ConfiguredFlags().eval(), torch.randn(2, 6), torch.ones(2, 6)
    region = realize(model, Candidate("", "ort"), ScopeInputs((ids, mask)), machine="t").module
    with torch.no_grad():
        ref = model(ids, mask)
        out = region(input_ids=ids, attention_mask=mask, return_dict=True, output_attentions=False)
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        assert region.fallback_calls == 0
        as_tuple = region(input_ids=ids, attention_mask=mask, return_dict=False)   # not what the build returns
        assert isinstance(as_tuple, tuple) and region.fallback_calls == 1
        region(ids, mask, output_attentions=1)                                   # a bool flag, not a number
    assert region.fallback_calls == 2


class LanguageModelStep(nn.Module):
    """An LSTM step that takes and returns its (h, c) state: ``model(x, state=(h, c))``."""

    def __init__(self) -> None:
        super().__init__()
        self.lstm, self.head = nn.LSTM(8, 8, batch_first=True), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None, temperature: float = 1.0):
        out, state = self.lstm(x, state)
        return self.head(out) / temperature, state


@needs_ort
def test_keyword_calls_with_nested_inputs_run_the_build():
    """A region captured as ``model(x, (h, c))`` and called ``model(x, state=(h, c))`` ran the
    original module on every call (the keyword binding needed every captured input to be a tensor)."""
    torch.manual_seed(0)
    model, x = LanguageModelStep().eval(), torch.randn(2, 5, 8)
    state = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    region = realize(model, Candidate("", "ort"), ScopeInputs((x, state)), machine="t").module
    with torch.no_grad():
        ref, (h, c) = model(x, state)
        for call in (lambda: region(x, state), lambda: region(x, state=state),
                     lambda: region(x=x, state=state, temperature=1.0)):
            out, (h2, c2) = call()
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(c2, c, rtol=1e-4, atol=1e-5)
        assert region.fallback_calls == 0
        region(x, state=state, temperature=2.0)              # a setting the build did not fix
        region(x)                                            # no state: another signature
    assert region.fallback_calls == 2


@needs_ort
def test_a_region_captured_with_keywords_still_matches_its_keyword_call():
    torch.manual_seed(0)
    model, x = LanguageModelStep().eval(), torch.randn(2, 5, 8)
    state = (torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    region = realize(model, Candidate("", "ort"), ScopeInputs((x,), {"state": state}), machine="t").module
    with torch.no_grad():
        torch.testing.assert_close(region(x, state=state)[0], model(x, state)[0], rtol=1e-4, atol=1e-5)
    assert region.fallback_calls == 0
