"""The prefill: generate()'s first call, the prompt's, with the cache still empty, built as a program
that returns the filled cache's tensors (recompile/cache_step.py, StepLayout.prefill), and loaded
beside a decoding step's build so that the whole of generate() runs builds."""

from __future__ import annotations

import copy
import json
import logging

import pytest
import torch

from cuvil_pgc.recompile import runtimes
from tests._service import run_service
from tests.test_cache_step import FACTORY, _mistral, _positional, counted_build, make, step_call

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")

transformers = pytest.importorskip("transformers")


def _prefill_call(model, batch=2, prompt=9, padded=3):
    from cuvil_pgc.recompile import generate_step_call

    ids = torch.randint(3, 60, (batch, prompt))
    mask = torch.ones_like(ids)
    mask[-1, :padded] = 0                        # a left-padded row, as a batch of prompts is
    return generate_step_call(model, ids, attention_mask=mask, step=0)


def _generate(model, ids, mask=None, new=4):
    kw = dict(attention_mask=torch.ones_like(ids) if mask is None else mask, max_new_tokens=new,
              min_new_tokens=new, do_sample=False, pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        return model.generate(ids, **kw)


def _same(a, b, tol=1e-5) -> bool:
    return torch.equal(a.sequences, b.sequences) and max(
        (p - q).abs().max().item() for p, q in zip(a.logits, b.logits, strict=True)) < tol


def test_the_prefill_is_built_with_a_copy_of_its_empty_cache_filled_inside():
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache

    model = make()
    call = _prefill_call(model)
    step, inputs, layout = around_cache(model, _positional(model, call))
    assert isinstance(step, CacheStep) and layout.prefill and layout.split == () and layout.objects == ()
    assert "DynamicLayer(keys=None, values=None, is_initialized=False)" in layout.skeleton
    # the call's tensors alone: the ids, the mask over the prompt, the position ids counted along it
    assert [tuple(t.shape) for t in inputs] == [(2, 9)] * 3 and inputs[2][1, 3:].tolist() == list(range(6))
    with torch.no_grad():
        out = step(*inputs)
        want = model(**{**call, "cache": transformers.DynamicCache(config=model.config)})
    assert out.past_key_values.get_seq_length() == 9 and call["cache"].get_seq_length() == 0   # a copy filled
    torch.testing.assert_close(out.logits, want.logits)
    # its prompt's length is checked up to the model's positions, as a step's cache is
    assert step.size_ceilings(inputs) == {(0, 1): 128, (1, 1): 128, (2, 1): 128}


def test_generate_runs_the_prefills_region_for_each_prompt_and_the_model_for_its_steps(caplog):
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache

    model = make()
    layout = around_cache(model, _positional(model, _prefill_call(model)))[2]
    fast, ran = counted_build(model, CacheStep(model, layout), record=lambda tensors: tuple(tensors[0].shape))
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.decoding_forward"):
        for batch, prompt in ((2, 9), (1, 5), (3, 20)):
            ids = torch.randint(3, 60, (batch, prompt))
            mask = torch.ones_like(ids)
            mask[0, :2] = 0
            assert _same(_generate(fast, ids, mask), _generate(model, ids, mask))
    assert ran == [(2, 9), (1, 5), (3, 20)]          # each prompt once; its steps on the model's own forward
    assert fast.forward.unmatched_calls == 0 and fast.forward.outside_calls == 0 and not caplog.records


def test_a_prefill_called_otherwise_than_the_built_one_is_counted_and_said_once(caplog):
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache

    model = make()
    layout = around_cache(model, _positional(model, _prefill_call(model)))[2]
    fast, ran = counted_build(model, CacheStep(model, layout))
    ids = torch.randint(3, 60, (1, 6))
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.decoding_forward"):
        for _ in range(2):
            fast(ids, cache=transformers.DynamicCache(config=model.config), use_cache=True, logits_to_keep=0)
    assert ran == [] and fast.forward.unmatched_calls == 2
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "a prefill runs the model's own forward: it passes logits_to_keep=0 where the build " \
                              "was made for 1" in said[0]


def test_a_sliding_window_prefill_runs_the_prompts_its_window_keeps_whole():
    from cuvil_pgc.errors import RecompileError
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache

    model = _mistral(16)
    with pytest.raises(RecompileError, match=r"passes 20 tokens, more than the model's sliding window keeps whole "
                                             r"\(14\).*at most 14 tokens"):
        around_cache(model, _positional(model, _prefill_call(model, prompt=20)))
    step, inputs, layout = around_cache(model, _positional(model, _prefill_call(model, prompt=9)))
    assert layout.longest == 14 and set(step.size_ceilings(inputs).values()) == {14}
    fast, ran = counted_build(model, CacheStep(model, layout), record=lambda tensors: tensors[0].shape[1])
    for prompt in (6, 14, 15):
        ids = torch.randint(3, 60, (2, prompt))
        assert _same(_generate(fast, ids), _generate(model, ids))
    assert ran == [6, 14] and fast.forward.outside_calls == 1


def test_a_prefill_built_without_a_mask_runs_calls_passing_one_of_all_ones():
    """generate() leaves an all-ones mask out of an unpadded prompt's call, so the prefill captured
    from it has none; a call of the model that passes one is the same call, a padded one is not."""
    from cuvil_pgc.recompile import generate_step_call
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache

    model = make()
    call = generate_step_call(model, torch.randint(3, 60, (1, 7)), step=0)
    layout = around_cache(model, _positional(model, call))[2]
    assert "attention_mask" not in call and len(layout.tensors) == 2      # the ids and the position ids
    fast, ran = counted_build(model, CacheStep(model, layout))
    ids = torch.randint(3, 60, (2, 9))
    padded = torch.ones_like(ids)
    padded[0, :2] = 0
    with torch.no_grad():
        for mask in (torch.ones_like(ids), padded):
            empty = transformers.DynamicCache(config=model.config)
            got = fast(ids, attention_mask=mask, cache=empty, use_cache=True, logits_to_keep=1)
            want = model(ids, attention_mask=mask, cache=transformers.DynamicCache(config=model.config),
                         use_cache=True, logits_to_keep=1)
            torch.testing.assert_close(got.logits, want.logits)
            assert got.past_key_values is empty and empty.get_seq_length() == 9
    assert ran == [2] and fast.forward.unmatched_calls == 1       # the padded one: the model's own forward


def test_a_prompt_longer_than_the_prefills_program_runs_runs_the_models_forward_said_once(caplog):
    """As a step at a cache its program does not run: the model's own forward at once (the region
    would run the original module after its checks), counted and said once."""
    import types

    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache
    from cuvil_pgc.recompile.decoding_forward import decoding_forward

    model = make()
    layout = around_cache(model, _positional(model, _prefill_call(model)))[2]
    step = CacheStep(model, layout)
    ran = []

    class Region(torch.nn.Module):       # the prefill's program: prompts of 2 to 12 tokens, any batch
        other_shapes = types.SimpleNamespace(inputs=[(torch.long, ("b", "p"))] * 3, ranges={"b": (1, 8), "p": (2, 12)})

        def forward(self, *tensors):
            ran.append(tensors[0].shape[1])
            return step(*tensors)
    fast = copy.copy(model)
    fast.forward = decoding_forward(fast, step, Region())
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.decoding_forward"):
        for prompt in (5, 20, 30):
            ids = torch.randint(3, 60, (2, prompt))
            assert _same(_generate(fast, ids), _generate(model, ids))
    assert ran == [5] and fast.forward.outside_calls == 2
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and "a prefill at batch 2 of 20 tokens runs the model's own forward: its build runs " \
                              "batches 1-8 and prompts of 2-12 tokens" in said[0]


def test_the_guard_leaves_out_a_left_padded_prefills_keys_at_its_padding():
    """Past the first layer a padded position's keys are what each runtime makes of a query with
    every key masked (ONNX Runtime's differed by 0.16 on a 2-layer Mistral): the step names the
    call's mask to the guard, which leaves them out, as it does for a plain call's outputs."""
    from cuvil_pgc.recompile.cache_step import around_cache
    from cuvil_pgc.recompile.padding import padding_of

    model = make()
    call = _prefill_call(model, batch=2, prompt=9, padded=3)
    step, inputs, _ = around_cache(model, _positional(model, call))
    padding = padding_of(step, inputs)
    assert padding is not None and padding.names == ("attention_mask",) and padding.padded == 3
    keep = padding.compared((2, 1, 9, 16))         # a layer's keys: batch, heads, positions, head size
    assert keep.shape == (2, 1, 9, 1) and keep[1, 0, :3].sum() == 0 and keep[1, 0, 3:].all() and keep[0].all()
    step_inputs = around_cache(model, _positional(model, step_call(model)))[1]
    assert padding_of(around_cache(model, _positional(model, step_call(model)))[0], step_inputs) is None  # no 0s


def test_a_prefills_example_call_repeated_as_a_profile_repeats_it_answers_alike():
    """A profile calls the example over and over, putting back the objects it changed after each:
    T5's cache marks each layer's cross-attention done in a dict, which stayed marked while the
    layers were put back empty (the next call raised), and a DynamicCache() appends its layers."""
    from cuvil_pgc._example_inputs import input_objects_kept, positional_inputs
    from tests.test_encoder_decoder_steps import generated_step_call, make_t5

    t5 = make_t5()
    llama = make()
    llama_call = {**_prefill_call(llama), "cache": transformers.DynamicCache()}       # no config: layers appended
    t5_call = generated_step_call(t5, step=0)
    for model, call in ((t5, t5_call), (llama, llama_call)):
        inputs = positional_inputs(model, call)
        restore = input_objects_kept(inputs)
        logits = []
        for _ in range(3):
            with torch.no_grad():
                logits.append(model(*inputs).logits)
            restore()
        assert all(torch.equal(x, logits[0]) for x in logits) and call["cache"].get_seq_length() == 0
    assert llama_call["cache"].layers == [] and not any(t5_call["cache"].is_updated.values())


@needs_ort
def test_a_decoding_calls_search_builds_no_region_that_runs_its_captured_sizes_only(build_env):
    """torch.compile's and CUDA graphs' regions run their captured sizes only: a prefill's build of
    torch.compile ran none of a service's prompts of other lengths. Such candidates are not built,
    and still count in the space the budget is a quarter of (the step's AOTInductor variants,
    1.4-1.7x ONNX Runtime, need those measurements)."""
    from cuvil_pgc.recompile import recompile

    model = make()
    build = recompile(model, _prefill_call(model), backends=("eager", "compile", "ort"), records=False,
                      deployed_race=False, rounds=3)
    compiled = [t for t in build.result.trials.values() if t.candidate.backend == "compile"]
    assert compiled and all(t.status == "not_measured" and t.measured_us is None for t in compiled)
    assert sum("runs only its captured sizes" in t.reason for t in compiled) >= len(compiled) - 1  # (bf16: unbuilt)
    assert {c.backend for c in build.result.choices.values()} <= {"eager", "ort"}


@needs_ort
def test_a_sliding_window_models_padded_prefill_builds_on_onnx_runtime(tmp_path, build_env):
    """Mistral's empty cache holds a tensor (each layer's window), which the prefill's export could
    not copy; its second layer's keys at padded positions differ between runtimes."""
    import warnings

    from cuvil_pgc.recompile import load_build, recompile
    from cuvil_pgc.recompile.candidates import Candidate

    torch.manual_seed(0)
    config = transformers.MistralConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                        num_key_value_heads=1, intermediate_size=64, vocab_size=60,
                                        max_position_embeddings=128, sliding_window=16)
    model = transformers.MistralForCausalLM(config).eval()
    build = recompile(model, _prefill_call(model, prompt=9, padded=2), plan={"": Candidate("", "ort")}, records=False,
                      deployed_race=False, rounds=3)
    build.save(tmp_path / "prefill.cuvilpkg")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = load_build(tmp_path / "prefill.cuvilpkg", model, allow_unsigned=True)
    for prompt in (5, 9, 14, 20):
        ids = torch.randint(3, 60, (2, prompt))
        mask = torch.ones_like(ids)
        mask[1, :2] = 0
        assert _same(_generate(fast, ids, mask), _generate(model, ids, mask), tol=1e-4)
    assert fast.forward.outside_calls == 1 and fast.forward.region.fallback_calls == 0   # 20 > its window's 14


def test_a_prefills_layout_round_trips_and_its_plan_is_a_format_older_versions_refuse():
    from cuvil_pgc.errors import BuildError
    from cuvil_pgc.recompile.cache_step import StepLayout, around_cache
    from cuvil_pgc.recompile.plan_doc import OPENED_INPUTS_FORMAT, PREFILL_FORMAT, READ_FORMATS, Plan

    model = make()
    layout = around_cache(model, _positional(model, _prefill_call(model)))[2]
    doc = json.loads(json.dumps(layout.to_json()))
    assert StepLayout.from_json(doc, "p.cuvilpkg") == layout and doc["prefill"] is True
    with pytest.raises(BuildError, match="cache_step"):
        StepLayout.from_json({**doc, "split": [1]}, "p.cuvilpkg")       # a prefill has no cache to split at
    assert Plan(cache_step=doc).to_json()["format"] == PREFILL_FORMAT and PREFILL_FORMAT in READ_FORMATS
    # a decoding step's plan is written as before: no prefill field, its format unchanged
    step_doc = around_cache(model, _positional(model, step_call(model)))[2].to_json()
    assert "prefill" not in step_doc and Plan(cache_step=step_doc).to_json()["format"] < OPENED_INPUTS_FORMAT


def test_generate_step_call_counts_calls_from_the_prefill():
    from cuvil_pgc.errors import ConfigError
    from cuvil_pgc.recompile import generate_step_call

    model = make()
    ids = torch.randint(3, 60, (1, 7))
    call = generate_step_call(model, ids, step=0)
    assert call["input_ids"].shape == (1, 7) and call["cache"].get_seq_length() == 0
    with pytest.raises(ConfigError, match="counted from 0"):
        generate_step_call(model, ids, step=-1)


@needs_ort
def test_a_service_loads_the_prefills_build_beside_the_steps_and_generate_runs_both(tmp_path, build_env):
    """Two builds of one model, loaded one onto the other in either order, as a service loads them:
    every prompt runs the prefill's program, every step the step's, and the tokens are eager's."""
    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.candidates import Candidate

    model = make()
    prefill = recompile(model, _prefill_call(model), plan={"": Candidate("", "ort")}, records=False,
                        deployed_race=False, rounds=3)
    choice, = prefill.plan.choices
    assert prefill.plan.cache_step["prefill"] and choice.other_shapes    # the prompt's length varies
    prefill.save(tmp_path / "prefill.cuvilpkg")
    recompile(model, step_call(model), plan={"": Candidate("", "ort")}, records=False, deployed_race=False,
              rounds=3).save(tmp_path / "step.cuvilpkg")
    (tmp_path / "factory.py").write_text(FACTORY)
    result = run_service('''
import json, sys, warnings
import torch
sys.path.insert(0, ".")
from factory import make
from cuvil_pgc import load_build

model, eager = make(), make()

def load(*paths):
    fast = model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for path in paths:
            fast = load_build(path, fast, allow_unsigned=True)
    return fast

def generate(m, ids, mask):
    kw = dict(attention_mask=mask, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=0,
              output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        return m.generate(ids, **kw)

out = {}
for order in (("prefill", "step"), ("step", "prefill"), ("prefill", "step", "prefill")):
    fast = load(*[f"{name}.cuvilpkg" for name in order])
    same = []
    for batch, prompt in ((1, 5), (2, 9), (3, 30)):
        ids = torch.randint(3, 60, (batch, prompt))
        mask = torch.ones_like(ids)
        mask[0, :2] = 0
        a, b = generate(fast, ids, mask), generate(eager, ids, mask)
        same.append(bool(torch.equal(a.sequences, b.sequences))
                    and max((p - q).abs().max().item() for p, q in zip(a.logits, b.logits)) < 1e-4)
    forwards, depth = {}, 0
    f = fast.forward
    while f is not None:
        depth += 1
        r = f.region
        forwards["prefill" if f.step.layout.prefill else "step"] = [
            r.other_shape_calls, r.fallback_calls, f.unmatched_calls, f.outside_calls]
        f = f.otherwise
    out["+".join(order)] = {"same": same, "forwards": forwards, "depth": depth, "notes": fast.cuvil_load_report.notes,
                            "model_untouched": "forward" not in vars(model)}
print(json.dumps(out))
''', cwd=tmp_path)
    for order, got in result.items():
        assert got["same"] == [True, True, True] and got["model_untouched"], order
        assert got["depth"] == 2, order         # a build loaded again replaces its kind's, not chained to it
        prefill_runs, step_runs = got["forwards"]["prefill"], got["forwards"]["step"]
        # each of the three prompts ran the prefill's programs, each of their 3 steps the step's
        assert prefill_runs[0] >= 2 and prefill_runs[1:] == [0, 0, 0], order
        assert step_runs[0] >= 8 and step_runs[1:] == [0, 0, 0], order
    assert "the decoding steps run the build it was loaded onto" in result["step+prefill"]["notes"][-1]
    assert "the prefill runs the build it was loaded onto" in result["prefill+step"]["notes"][-1]
