"""Decoding steps: a call that hands a Hugging Face decoder its cache is built with the cache opened
into tensors (recompile/cache_step.py), and a loaded build runs generate()'s steps."""

from __future__ import annotations

import copy
import inspect
import json
import logging

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


def counted_build(model, step, record=len):
    """A copy of ``model`` whose forward runs ``step`` as a loaded build would (decoding_forward over
    a region that is the step's eager call), and the list each region call appends ``record(tensors)`` to."""
    from cuvil_pgc.recompile.decoding_forward import decoding_forward

    ran = []

    def region(*tensors):
        ran.append(record(tensors))
        return step(*tensors)
    fast = copy.copy(model)
    fast.forward = decoding_forward(fast, step, region)
    return fast, ran


def _length(cache) -> int:
    return int(cache.get_seq_length())


def test_a_call_passing_a_cache_is_built_as_the_step_with_the_cache_opened():
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache

    model = make()
    call = step_call(model)
    step, inputs, layout = around_cache(model, _positional(model, call))
    assert isinstance(step, CacheStep) and step.model is model and not step.training
    # completed as generate() calls it: position ids counted along the mask, logits of the last token
    assert layout.cache == 3 and layout.tensors == (0, 1, 2) and layout.split == (1,)
    assert layout.constants[6] is True and layout.constants[7] == 1 and "DynamicLayer(keys=T, values=T" in layout.skeleton
    # ids, the mask's cache part and new part, the position ids, then each layer's keys and values
    assert [tuple(t.shape) for t in inputs] == [(2, 1), (2, 9), (2, 1), (2, 1), (2, 1, 9, 16), (2, 1, 9, 16)]
    assert inputs[3].tolist() == [[9], [9]]
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
    # beside a cache, values that are neither tensors, flags nor objects of tensors (a callable)
    assert around_cache(model, (ids, None, None, step_call(model)["cache"], None, None, True, print))[2] is None


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


def test_the_loaded_forward_runs_the_build_and_extends_the_callers_cache(caplog):
    """What generate() relies on: the cache it passed comes back, extended, as the output's cache."""
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache
    from cuvil_pgc.recompile.decoding_forward import decoding_forward

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
    assert ran == [6] and got.cache is call["cache"] and _length(call["cache"]) == 7
    torch.testing.assert_close(got.logits, want.logits)
    torch.testing.assert_close(call["cache"].layers[0].keys, twin["cache"].layers[0].keys)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.decoding_forward"):
        # calls the build was not made for run the model's own forward, the steps among them counted
        assert type(forward(**call, return_dict=False)) is tuple and _length(call["cache"]) == 8
        forward(**{**call, "attention_mask": torch.ones(3, 9, dtype=torch.long), "use_cache": False})
        forward(call["input_ids"], cache=transformers.DynamicCache(config=model.config), use_cache=True)  # a prefill
    assert ran == [6] and forward.unmatched_calls == 2
    said = [r.getMessage() for r in caplog.records if "runs the model's own forward" in r.getMessage()]
    assert len(said) == 1 and "it passes return_dict=False beyond the built call's arguments" in said[0]


class _Tuples(torch.nn.Module):
    """A model whose call may return a tuple: the cache comes back in it."""

    def __init__(self):
        super().__init__()
        self.llama = make()

    def forward(self, input_ids, attention_mask, cache, return_dict):
        out = self.llama(input_ids=input_ids, attention_mask=attention_mask, cache=cache, use_cache=True)
        return out if return_dict else out.to_tuple()


def test_a_tuple_output_carries_the_callers_cache_extended():
    from cuvil_pgc.recompile.cache_step import around_cache
    from cuvil_pgc.recompile.decoding_forward import decoding_forward

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
    # ids (2, 1), the mask's new part (2, 1) and the position ids (2, 1): their token count; the cache's heads
    # and head size, never its batch or length
    assert step.static_dimensions(inputs) == {0: {1}, 2: {1}, 3: {1}, 4: {1, 3}, 5: {1, 3}}


def _mistral(window: int):
    torch.manual_seed(0)
    config = transformers.MistralConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=64, vocab_size=60,
                                        max_position_embeddings=128, sliding_window=window)
    return transformers.MistralForCausalLM(config).eval()


def test_a_cache_whose_structure_changes_every_step_is_refused_naming_the_change():
    """A sliding-window layer whose window is full counts its tokens in a plain int apart from its
    keys: no later step would match the build, and each would run the original module after the
    build's checks (slower than eager)."""
    from cuvil_pgc.errors import RecompileError
    from cuvil_pgc.recompile.cache_step import around_cache

    model = _mistral(4)                 # 9 tokens cached: the layer keeps 3
    with pytest.raises(RecompileError, match=r"cumulative_length=9 became cumulative_length=10\).*sliding window "
                                             r"is full.*at most 2 tokens"):
        around_cache(model, _positional(model, step_call(model)))


def test_a_static_cache_written_in_place_is_refused_naming_the_default_cache():
    from cuvil_pgc.errors import RecompileError
    from cuvil_pgc.recompile.cache_step import around_cache

    model = make()
    cache = transformers.StaticCache(config=model.config, max_cache_len=32)
    with torch.no_grad():
        model(torch.randint(3, 60, (2, 9)), cache=cache, use_cache=True)
    call = {**step_call(model), "cache": cache}
    with pytest.raises(RecompileError, match=r"StaticCache.*in place.*DynamicCache generate\(\) uses by default"):
        around_cache(model, _positional(model, call))


def test_a_sliding_window_step_runs_while_its_window_keeps_every_token_and_the_models_forward_after():
    """Mistral's, Phi-3's and Gemma's cache layers count the tokens they have seen in a plain int:
    as a constant, no later step matched the built one and every such model was refused. Until the
    window is full the count is the keys' length, which the step rebuilds it from; a step at a
    longer cache (whose layer drops its oldest token) runs the model's own forward."""
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache

    model = _mistral(16)
    step, inputs, layout = around_cache(model, _positional(model, step_call(model)))
    assert layout.longest == 14 and "cumulative_length=keys.shape[-2]" in layout.skeleton
    assert set(step.size_ceilings(inputs).values()) == {14}
    # each step's cache length: the last layer's keys (then its values, its window as a tensor)
    fast, ran = counted_build(model, CacheStep(model, layout), record=lambda tensors: tensors[-3].shape[-2])
    ids = torch.randint(3, 60, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    kw = dict(attention_mask=mask, max_new_tokens=14, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        a, b = fast.generate(ids, **kw), model.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert max((p - q).abs().max().item() for p, q in zip(a.logits, b.logits, strict=True)) < 1e-5
    # the steps after 6 ... 14 cached tokens ran the build, those after 15 ... 18 the model's own forward
    assert ran == list(range(6, 15)) and fast.forward.outside_calls == 4


@needs_ort
def test_a_sliding_window_steps_onnx_runtime_build_counts_the_tokens_as_its_keys_length(tmp_path, build_env):
    """The count traced as the keys' length (a symbol in the export): the program for other sizes
    answers at every length its window keeps whole, and an older cuvil-pgc refuses the plan."""
    import warnings

    from cuvil_pgc.recompile import load_build, recompile
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.plan_doc import SLIDING_CACHE_FORMAT

    model = _mistral(16)
    build = recompile(model, step_call(model), plan={"": Candidate("", "ort")}, records=False, deployed_race=False,
                      rounds=3)
    assert build.plan.to_json()["format"] == SLIDING_CACHE_FORMAT
    build.save(tmp_path / "step.cuvilpkg")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = load_build(tmp_path / "step.cuvilpkg", _mistral(16), allow_unsigned=True)
    ids = torch.randint(3, 60, (2, 6))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=14, do_sample=False, pad_token_id=0,
              output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        a, b = fast.generate(ids, **kw), model.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert max((p - q).abs().max().item() for p, q in zip(a.logits, b.logits, strict=True)) < 1e-4
    assert fast.forward.region.fallback_calls == 0 and fast.forward.outside_calls == 4


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


def test_a_step_passing_the_cache_written_back_last_is_not_opened_again(monkeypatch):
    """generate() passes back the cache the last step wrote into: an identity check tells it is
    as left, where opening it took 10 µs a layer. A cache changed between steps (a beam search
    reorders it) is opened again, and a finished generation's cache is not kept alive."""
    import gc
    import weakref

    from cuvil_pgc.recompile import decoding_forward as loaded
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache
    from cuvil_pgc.recompile.decoding_forward import decoding_forward

    model = make()
    layout = around_cache(model, _positional(model, step_call(model)))[2]
    step = CacheStep(model, layout)
    opens = []
    real = loaded.opened
    monkeypatch.setattr(loaded, "opened", lambda cache: opens.append(1) or real(cache))
    fast = copy.copy(model)
    fast.forward = decoding_forward(fast, step, step)
    ids = torch.randint(3, 60, (2, 7))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=6, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(fast.generate(ids, **kw), model.generate(ids, **kw))
    assert len(opens) == 2                 # the prefill's empty cache and the first of the five steps only
    opens.clear()
    with torch.no_grad():                  # each step's cache reordered by the beams: opened every step
        assert torch.equal(fast.generate(ids, num_beams=2, **kw), model.generate(ids, num_beams=2, **kw))
    assert len(opens) == 6                 # the prefill and every step: the beams reorder the cache between steps
    call = step_call(model)
    with torch.no_grad():
        fast(**call)
        fast(**{**call, "attention_mask": torch.ones(2, 11, dtype=torch.long), "input_ids": call["input_ids"]})
    kept = weakref.ref(call["cache"].layers[0].keys)
    del call
    gc.collect()
    assert kept() is None


def test_generate_calls_a_loaded_step_as_it_calls_the_model_and_a_padded_gpt2_batch_answers_as_eager():
    """generate() reads the forward's parameters to decide what it passes: a forward showing none
    got no position ids, and a left-padded GPT-2 batch (absolute positions) answered 0.32 off
    eager's logits. The step is built as generate() calls it (position ids, logits_to_keep=1), and
    calls leaving out what it can count itself (an all-ones mask, the positions after the cache)
    run it too."""
    import inspect

    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=60,
                                                                 n_positions=128)).eval()
    call = step_call(model)
    layout = around_cache(model, _positional(model, call))[2]
    fast, ran = counted_build(model, CacheStep(model, layout))
    assert inspect.signature(fast.forward) == inspect.signature(model.forward)
    ids = torch.randint(3, 60, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    kw = dict(attention_mask=mask, max_new_tokens=5, do_sample=False, pad_token_id=0, output_logits=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        a, b = fast.generate(ids, **kw), model.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences) and len(ran) == 4
    assert max((p - q).abs().max().item() for p, q in zip(a.logits, b.logits, strict=True)) < 1e-5
    ran.clear()
    twin = {**call, "cache": copy.deepcopy(call["cache"])}
    with torch.no_grad():                  # a direct call: no position ids, an all-ones mask left out
        got = fast(input_ids=call["input_ids"], cache=call["cache"], use_cache=True)
        want = model(input_ids=twin["input_ids"], cache=twin["cache"], use_cache=True)
    torch.testing.assert_close(got.logits, want.logits)
    assert len(ran) == 1
    with torch.no_grad():                  # no position ids over padding: the model counts them otherwise
        padded = torch.ones(2, 11, dtype=torch.long)
        padded[0, 0] = 0
        fast(input_ids=call["input_ids"], attention_mask=padded, cache=call["cache"], use_cache=True)
    assert len(ran) == 1 and fast.forward.unmatched_calls == 1       # counted: a step not on the build


def test_a_step_built_without_an_output_flag_runs_the_calls_that_pass_the_configs_value(caplog):
    """generate() passes return_dict=True, which Bloom's forward names: a step built from a call that
    left it out ran none of generate()'s steps. A flag left None on one side and set to the config's
    value on the other is the same call; the config's opposite is not."""
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache

    torch.manual_seed(0)
    model = transformers.BloomForCausalLM(transformers.BloomConfig(hidden_size=32, n_layer=1, n_head=2,
                                                                   vocab_size=60)).eval()
    assert "return_dict" in inspect.signature(type(model).forward).parameters
    layout = around_cache(model, _positional(model, step_call(model)))[2]
    fast, ran = counted_build(model, CacheStep(model, layout))
    ids = torch.randint(3, 60, (2, 6))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=5, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(fast.generate(ids, **kw), model.generate(ids, **kw))
        assert len(ran) == 4
        call = step_call(model)
        with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.decoding_forward"):
            assert type(fast(**call, return_dict=False)) is tuple and len(ran) == 4     # not the config's: eager's
            fast(**step_call(model), return_dict=False)
    # counted, and said once, naming what differs
    assert fast.forward.unmatched_calls == 2 and fast.forward.outside_calls == 0
    said = [r.getMessage() for r in caplog.records if "runs the model's own forward" in r.getMessage()]
    assert len(said) == 1 and "it passes return_dict=False where the build was made for None" in said[0]


def test_generate_step_call_is_the_call_generate_makes_as_it_made_it():
    """The example call for a decoding step, taken from generate() itself: copied before the model
    extends its cache (a call kept by reference held a cache two tokens longer than its mask, and
    Bloom's step raised), the model's forward left as it was."""
    from cuvil_pgc.errors import ConfigError
    from cuvil_pgc.recompile import generate_step_call
    from cuvil_pgc.recompile.cache_step import around_cache

    model = make()
    ids = torch.randint(3, 60, (2, 6))
    mask = torch.ones_like(ids)
    mask[0, 0] = 0                        # (generate() drops a mask of all ones)
    call = generate_step_call(model, ids, attention_mask=mask, step=2, pad_token_id=0)
    assert _length(call["cache"]) == 7 and call["attention_mask"].shape == (2, 8) and call["input_ids"].shape == (2, 1)
    assert "return_dict" not in call and "forward" not in vars(model)
    assert around_cache(model, _positional(model, call))[2] is not None
    own = model.forward
    model.forward = own                   # an instance forward (a loaded build's) is put back
    generate_step_call(model, ids, step=1, pad_token_id=0)
    assert vars(model)["forward"] is own
    with pytest.raises(ConfigError, match="none for step 5"):
        generate_step_call(model, ids, step=5, max_new_tokens=2, min_new_tokens=2, pad_token_id=0)
