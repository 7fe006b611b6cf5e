"""An encoder-decoder's decoding steps (T5, BART: what a translation or summarization service's
generate() runs per token) are built: the step's call holds the encoder's outputs (a ModelOutput,
opened into its tensors) and an EncoderDecoderCache; its attention mask is over the encoder's
tokens, not the cache's. Such calls used to be refused as changing an object they are given."""

from __future__ import annotations

import copy
import gc
import inspect
import json
import weakref

import pytest
import torch

from cuvil_pgc.recompile import runtimes

transformers = pytest.importorskip("transformers")
needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")


def make_t5():
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=60, d_model=32, d_kv=16, d_ff=64, num_layers=1, num_decoder_layers=1,
                                   num_heads=2, decoder_start_token_id=0, pad_token_id=0)
    return transformers.T5ForConditionalGeneration(config).eval()


def generated_step_call(model, step: int = 3) -> dict:
    """generate()'s call for its ``step``-th token (the encoder's outputs, the cache, the encoder's mask)."""
    from cuvil_pgc.recompile import generate_step_call

    ids = torch.randint(3, 60, (2, 7))
    return generate_step_call(model, ids, attention_mask=torch.ones_like(ids), step=step)


def _positional(model, call):
    from cuvil_pgc._example_inputs import positional_inputs

    return positional_inputs(model, call)


def test_the_step_opens_the_encoders_outputs_and_leaves_its_mask_whole():
    from cuvil_pgc.recompile.cache_step import StepLayout, around_cache

    model = make_t5()
    call = generated_step_call(model)
    assert type(call["cache"]).__name__ == "EncoderDecoderCache"
    twin = {**call, "cache": copy.deepcopy(call["cache"])}
    step, inputs, layout = around_cache(model, _positional(model, call))
    names = list(inspect.signature(type(model).forward).parameters)[1:]
    [(at, text, count)] = layout.objects
    assert names[at] == "encoder_outputs" and "BaseModelOutput" in text and count == 1
    assert layout.split == ()             # the mask is over the encoder's 7 tokens, not the cache's 3 and the new one
    with torch.no_grad():
        got, want = step(*inputs), model(**twin)
    torch.testing.assert_close(got.logits, want.logits)
    assert StepLayout.from_json(json.loads(json.dumps(layout.to_json())), "b.cuvilpkg") == layout
    from cuvil_pgc.errors import BuildError
    for broken in ([[layout.cache, text, 1]], [[at, text, 0]]):
        with pytest.raises(BuildError, match="cache_step"):
            StepLayout.from_json({**layout.to_json(), "objects": broken}, "b.cuvilpkg")


def test_generate_runs_the_step_on_the_build_and_opens_the_encoders_outputs_once(monkeypatch):
    from cuvil_pgc.recompile import cache_step
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache
    from tests.test_cache_step import counted_build

    model = make_t5()
    layout = around_cache(model, _positional(model, generated_step_call(model)))[2]
    step, opens = CacheStep(model, layout), []
    real = cache_step.opened_input
    monkeypatch.setattr(cache_step, "opened_input", lambda value: opens.append(1) or real(value))

    fast, ran = counted_build(model, step)
    ids = torch.randint(3, 60, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    kw = dict(attention_mask=mask, max_new_tokens=8, min_new_tokens=8, do_sample=False, output_logits=True,
              return_dict_in_generate=True)
    with torch.no_grad():
        a, b = fast.generate(ids, **kw), model.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert max((p - q).abs().max().item() for p, q in zip(a.logits, b.logits, strict=True)) < 1e-5
    # the first decoder call fills the cross-attention cache (the model's own forward), the 7 after it
    # run the build; the encoder's outputs, the same object every step, are opened once
    assert len(ran) == 7 and len(opens) == 1
    opens.clear()
    call = generated_step_call(model)
    kept = weakref.ref(call["encoder_outputs"])
    with torch.no_grad():
        fast(**call)
        fast(**call)                    # the same encoder outputs: not opened again
    assert len(opens) == 1 and len(ran) == 9
    del call
    gc.collect()
    assert kept() is None               # a finished generation's encoder outputs are not kept alive by the memo


@needs_ort
def test_an_encoder_decoders_onnx_runtime_build_runs_generate_as_eager(tmp_path, build_env):
    import warnings

    from cuvil_pgc.recompile import load_build, recompile
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.plan_doc import OPENED_INPUTS_FORMAT

    model = make_t5()
    build = recompile(model, generated_step_call(model), plan={"": Candidate("", "ort")}, records=False,
                      deployed_race=False, rounds=3)
    assert build.plan.to_json()["format"] == OPENED_INPUTS_FORMAT       # which an older cuvil-pgc refuses
    build.save(tmp_path / "t5.cuvilpkg")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = load_build(tmp_path / "t5.cuvilpkg", make_t5(), allow_unsigned=True)
    ids = torch.randint(3, 60, (2, 9))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, min_new_tokens=8, do_sample=False,
              output_logits=True, return_dict_in_generate=True)
    ran = []
    fast.forward.region.register_forward_pre_hook(lambda module, args: ran.append(1))
    with torch.no_grad():
        a, b = fast.generate(ids, **kw), model.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences)
    assert max((p - q).abs().max().item() for p, q in zip(a.logits, b.logits, strict=True)) < 1e-4
    assert len(ran) == 7 and fast.forward.region.fallback_calls == 0 and fast.forward.outside_calls == 0
