"""Decoding steps: a call that hands a Hugging Face decoder its cache is built with the cache opened
into tensors (recompile/cache_step.py), and a loaded build runs generate()'s steps."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from cuvil_pgc.recompile import runtimes
from tests._service import run_service

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")

transformers = pytest.importorskip("transformers")

#: a tiny Llama and one decoding step's call: a token, the cache of the 9 before it, the mask over all 10;
#: the service process below makes the same model from this source
FACTORY = '''
import torch, transformers

def make():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                      num_key_value_heads=1, intermediate_size=64, vocab_size=60,
                                      max_position_embeddings=128)
    return transformers.LlamaForCausalLM(config).eval()

def step_call(model, batch=2, prompt=9):
    ids = torch.randint(3, 60, (batch, prompt))
    with torch.no_grad():
        cache = model(ids, use_cache=True).past_key_values
    return {"input_ids": torch.randint(3, 60, (batch, 1)), "attention_mask": torch.ones(batch, prompt + 1, dtype=torch.long),
            "cache": cache, "use_cache": True}
'''
_scope: dict = {}
exec(FACTORY, _scope)
make, step_call = _scope["make"], _scope["step_call"]


def _positional(model, call):
    from cuvil_pgc._example_inputs import positional_inputs

    return positional_inputs(model, call)


def _length(cache) -> int:
    return int(cache.get_seq_length())


def test_a_call_passing_a_cache_is_built_as_the_step_with_the_cache_opened():
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache

    model = make()
    call = step_call(model)
    step, inputs, layout = around_cache(model, _positional(model, call))
    assert isinstance(step, CacheStep) and step.model is model and not step.training
    assert layout.cache == 3 and layout.tensors == (0, 1) and layout.split == (1,)
    assert layout.constants[6] is True and "DynamicLayer(keys=T, values=T" in layout.skeleton
    # ids, the mask's cache part and new part, then each layer's keys and values
    assert [tuple(t.shape) for t in inputs] == [(2, 1), (2, 9), (2, 1), (2, 1, 9, 16), (2, 1, 9, 16)]
    with torch.no_grad():
        got = step(*inputs)
        want = model(**{**call, "cache": copy.deepcopy(call["cache"])})
    assert _length(call["cache"]) == 9                 # the step never extends the caller's cache
    torch.testing.assert_close(got.logits, want.logits)
    assert _length(got.cache) == 10 and got.cache is not call["cache"]


def test_calls_that_are_no_decoding_step_are_left_as_they_are():
    from cuvil_pgc.recompile.cache_step import around_cache

    model = make()
    ids = torch.randint(3, 60, (1, 5))
    assert around_cache(model, (ids,))[2] is None                          # no cache
    empty = transformers.DynamicCache(config=model.config)
    assert around_cache(model, (ids, None, None, empty))[2] is None        # the prefill's empty cache


def test_the_layout_round_trips_and_a_malformed_one_is_refused():
    from cuvil_pgc.errors import BuildError
    from cuvil_pgc.recompile.cache_step import StepLayout, around_cache

    model = make()
    layout = around_cache(model, _positional(model, step_call(model)))[2]
    assert StepLayout.from_json(json.loads(json.dumps(layout.to_json())), "b.cuvilpkg") == layout
    for broken in ({}, {**layout.to_json(), "cache": 99}, {**layout.to_json(), "constants": [object()]},
                   {**layout.to_json(), "split": [5]}):
        with pytest.raises(BuildError, match="cache_step"):
            StepLayout.from_json(broken, "b.cuvilpkg")


def test_a_plan_for_a_decoding_step_is_a_format_older_versions_refuse():
    from cuvil_pgc.recompile.plan_doc import CACHE_STEP_FORMAT, Plan

    doc = Plan(cache_step={"count": 1}).to_json()
    assert doc["format"] == CACHE_STEP_FORMAT and Plan.from_json(doc).cache_step == {"count": 1}
    assert "cache_step" not in Plan().to_json() and Plan().to_json()["format"] < CACHE_STEP_FORMAT


def test_the_loaded_forward_runs_the_build_and_extends_the_callers_cache():
    """What generate() relies on: the cache it passed comes back, extended, as the output's cache."""
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache, decoding_forward

    model = make()
    layout = around_cache(model, _positional(model, step_call(model)))[2]
    step = CacheStep(model, layout)
    ran = []

    def region(*tensors):               # the loaded build of the step: its eager call, counted
        ran.append(len(tensors))
        return step(*tensors)
    forward = decoding_forward(model, step, region)
    call, twin = step_call(model, batch=3, prompt=6), None
    twin = {**call, "cache": copy.deepcopy(call["cache"])}
    with torch.no_grad():
        got, want = forward(**call, return_dict=True), model(**twin)
    assert ran == [5] and got.cache is call["cache"] and _length(call["cache"]) == 7
    torch.testing.assert_close(got.logits, want.logits)
    torch.testing.assert_close(call["cache"].layers[0].keys, twin["cache"].layers[0].keys)
    with torch.no_grad():              # calls the build was not made for run the model's own forward
        assert type(forward(**call, return_dict=False)) is tuple and _length(call["cache"]) == 8
        forward(**{**call, "attention_mask": torch.ones(3, 9, dtype=torch.long), "use_cache": False})
        forward(call["input_ids"], cache=transformers.DynamicCache(config=model.config), use_cache=True)
    assert ran == [5]


class _Tuples(torch.nn.Module):
    """A model whose call may return a tuple: the cache comes back in it."""

    def __init__(self):
        super().__init__()
        self.llama = make()

    def forward(self, input_ids, attention_mask, cache, return_dict):
        out = self.llama(input_ids=input_ids, attention_mask=attention_mask, cache=cache, use_cache=True)
        return out if return_dict else out.to_tuple()


def test_a_tuple_output_carries_the_callers_cache_extended():
    from cuvil_pgc.recompile.cache_step import around_cache, decoding_forward

    model = _Tuples().eval()
    call = step_call(model.llama)
    del call["use_cache"]
    args = (call["input_ids"], call["attention_mask"], call["cache"], False)
    step, inputs, layout = around_cache(model, args)
    assert layout.constants[3] is False
    forward = decoding_forward(model, step, step)
    twin = copy.deepcopy(args)
    with torch.no_grad():
        got, want = forward(*args), model(*twin)
    assert type(got) is tuple and got[1] is call["cache"] and _length(call["cache"]) == 10
    torch.testing.assert_close(got[0], want[0])


def test_the_factory_check_call_leaves_the_example_cache_as_it_was(tmp_path):
    from cuvil_pgc._modelspec import load_model_spec

    path = tmp_path / "spec.py"
    path.write_text(FACTORY + "\nSEEN = []\ndef factory():\n    m = make()\n    c = step_call(m)\n"
                              "    SEEN.append(c['cache'])\n    return m, c\n")
    model, inputs = load_model_spec(f"{path}:factory")
    cache = next(v for v in inputs if isinstance(v, transformers.DynamicCache))
    assert _length(cache) == 9


def test_a_profile_of_the_model_matches_the_steps_submodules():
    from cuvil_pgc.analyze.analysis import Analysis, RegionStats
    from cuvil_pgc.recompile.cache_step import around_cache
    from cuvil_pgc.recompile.matching import match_regions

    def stats(path: str, module: str) -> RegionStats:
        return RegionStats(path=path, calls=10, total_us=1e3, self_us=1e3, mean_us=100.0, p50_us=100.0, p95_us=100.0,
                           p99_us=100.0, share=0.5, hotness=1e3, bottleneck="compute", confidence=0.9,
                           evidence={"module": module})

    model = make()
    step = around_cache(model, _positional(model, step_call(model)))[0]
    profile = Analysis(regions=[stats("model", "LlamaForCausalLM"), stats("model/model.lm_head", "Linear")])
    assert {m.qualname for m in match_regions(profile, step).matched} == {"model", "model.lm_head"}


@needs_ort
@pytest.mark.slow   # a one-layer Llama's decoding step exported for ONNX Runtime, at its size and for others
def test_generate_runs_a_loaded_decoding_steps_build_in_a_service(tmp_path, build_env):
    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.candidates import Candidate

    model = make()
    build = recompile(model, step_call(model), plan={"": Candidate("", "ort")}, records=False,
                      deployed_race=False, rounds=3)       # --dynamic follows: the cache grows every call
    choice, = build.plan.choices
    assert choice.candidate.backend == "ort" and choice.other_shapes and build.plan.cache_step
    build.save(tmp_path / "decode.cuvilpkg")
    (tmp_path / "factory.py").write_text(FACTORY)
    result = run_service('''
import json, sys, warnings
import torch
sys.path.insert(0, ".")
from factory import make
from cuvil_pgc import load_build

model, eager = make(), make()
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    fast = load_build(sys.argv[1], model, allow_unsigned=True)
same = []
for batch, prompt, new in ((1, 5, 6), (2, 9, 4), (3, 20, 3)):
    ids = torch.randint(3, 60, (batch, prompt))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False, pad_token_id=0,
              output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        a, b = fast.generate(ids, **kw), eager.generate(ids, **kw)
    same.append(bool(torch.equal(a.sequences, b.sequences))
                and max((p - q).abs().max().item() for p, q in zip(a.logits, b.logits)) < 1e-4)
region = fast.forward.region
with warnings.catch_warnings():     # loaded again onto what it returned (a service switching builds)
    warnings.simplefilter("ignore")
    again = load_build(sys.argv[1], fast, allow_unsigned=True)
with torch.no_grad():
    a, b = again.generate(ids, **kw), eager.generate(ids, **kw)
print(json.dumps({"no_size_programs": region.other_shapes.size_programs is None, "same": same, "model_untouched": "forward" not in vars(model) and fast is not model and fast._modules is not model._modules, "fallbacks": region.fallback_calls,
                  "other_sizes": region.other_shape_calls, "notes": fast.cuvil_load_report.notes,
                  "again": bool(torch.equal(a.sequences, b.sequences)) and again.forward.region is not region
                           and again.cuvil_load_report.applied == fast.cuvil_load_report.applied
                           and again.forward.step.model is model}))
''', tmp_path / "decode.cuvilpkg", cwd=tmp_path)
    assert result["same"] == [True, True, True] and result["model_untouched"]
    # every step after each prefill ran the build (5 + 3 + 2 steps, one at the captured sizes)
    assert result["fallbacks"] == 0 and result["other_sizes"] >= 9
    assert result["no_size_programs"]        # no program of its own per length: each is called once a generation
    assert any("decoding step" in n for n in result["notes"]) and result["again"]


def test_the_step_keeps_the_new_tokens_count_static_in_a_free_size_export():
    from cuvil_pgc.recompile.cache_step import around_cache

    model = make()
    step, inputs, _ = around_cache(model, _positional(model, step_call(model)))
    # ids (2, 1) and the mask's new part (2, 1): their token count; the cache's heads and head size, never its
    # batch or length
    assert step.static_dimensions(inputs) == {0: {1}, 2: {1}, 3: {1, 3}, 4: {1, 3}}


def test_a_cache_whose_structure_changes_every_step_is_refused_naming_the_change():
    """Mistral's sliding-window layers count their tokens in a plain int: no later step would match
    the build, and each would run the original module after the build's checks (slower than eager)."""
    from cuvil_pgc.errors import RecompileError
    from cuvil_pgc.recompile.cache_step import around_cache

    torch.manual_seed(0)
    config = transformers.MistralConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=64, vocab_size=60,
                                        max_position_embeddings=128, sliding_window=4)
    model = transformers.MistralForCausalLM(config).eval()
    with pytest.raises(RecompileError, match=r"cumulative_length=9 became cumulative_length=10"):
        around_cache(model, _positional(model, step_call(model)))


@needs_ort
def test_a_step_whose_plan_replaces_a_submodule_runs_it_in_generate(tmp_path, build_env):
    """A plan for the step's submodules (the whole step left eager) runs them from the copy apply_plan
    makes, which rebuilds the cache as the step does."""
    import warnings

    from cuvil_pgc.recompile import load_build, recompile
    from cuvil_pgc.recompile.candidates import Candidate

    model = make()
    build = recompile(model, step_call(model), plan={"model.lm_head": Candidate("model.lm_head", "ort")},
                      records=False, deployed_race=False, rounds=3)
    assert [c.scope for c in build.plan.choices] == ["model.lm_head"] and build.plan.cache_step
    build.save(tmp_path / "head.cuvilpkg")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = load_build(tmp_path / "head.cuvilpkg", make(), allow_unsigned=True)
    head = fast.forward.region.model.lm_head
    ran = []
    head.register_forward_hook(lambda module, args, out: ran.append(tuple(args[0].shape)))
    ids = torch.randint(3, 60, (2, 6))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=4, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(fast.generate(ids, **kw), model.generate(ids, **kw))
    # the three steps after the prefill ran the ONNX Runtime region at its captured size
    assert type(head).__name__ == "CompiledRegion" and ran == [(2, 1, 32)] * 3 and head.fallback_calls == 0
