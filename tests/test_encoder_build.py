"""An encoder-decoder's encoder gets a build of its own: generate() runs it once per generation on
the source, beside the decoding builds, and loading it never changes the user's model (BART's
encoder sits two levels down, T5's one)."""

from __future__ import annotations

import warnings

import pytest
import torch

from cuvil_pgc.recompile import runtimes
from tests._service import run_service

transformers = pytest.importorskip("transformers")
needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")


FACTORY = '''
import torch, transformers

def make_bart():
    torch.manual_seed(0)
    config = transformers.BartConfig(vocab_size=60, d_model=32, encoder_layers=1, decoder_layers=1,
                                     encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=64,
                                     decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=1,
                                     bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                                     forced_bos_token_id=None, forced_eos_token_id=None)
    return transformers.BartForConditionalGeneration(config).eval()

def source(batch, length, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, 60, (batch, length), generator=g)
    mask = torch.ones_like(ids)
    mask[0, length - 2:] = 0          # right-padded, as BART's tokenizer pads
    return ids, mask
'''
_scope: dict = {}
exec(FACTORY, _scope)
make_bart, source = _scope["make_bart"], _scope["source"]


def test_the_encoders_call_is_captured_from_generate_without_its_output_flags():
    from cuvil_pgc._example_inputs import SizesVary, positional_inputs
    from cuvil_pgc.errors import ConfigError
    from cuvil_pgc.recompile import generate_encoder_call

    model = make_bart()
    ids, mask = source(2, 9, 0)
    call = generate_encoder_call(model, ids, attention_mask=mask)
    assert isinstance(call, SizesVary)          # recompile gives it programs for other sources' sizes
    assert isinstance(positional_inputs(model.get_encoder(), call), SizesVary)     # as the command line passes it
    assert sorted(call) == ["attention_mask", "input_ids"]
    assert torch.equal(call["input_ids"], ids) and torch.equal(call["attention_mask"], mask)
    assert "forward" not in vars(model.get_encoder())          # the spy is gone
    gpt2 = transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=60)).eval()
    with pytest.raises(ConfigError, match="GPT2LMHeadModel is not an encoder-decoder"):
        generate_encoder_call(gpt2, ids)


def _load(path, model):
    from cuvil_pgc.recompile import load_build

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return load_build(path, model, allow_unsigned=True)


def _generate(model, ids, mask):
    with torch.no_grad():
        return model.generate(ids, attention_mask=mask, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                              num_beams=1, output_logits=True, return_dict_in_generate=True)


@needs_ort
def test_an_encoders_build_loads_onto_the_model_beside_the_steps_in_either_order(tmp_path, build_env):
    from cuvil_pgc.recompile import generate_encoder_call, generate_step_call, recompile
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.decoding_forward import own_model
    from cuvil_pgc.recompile.realized import CompiledRegion

    model = make_bart()
    encoder = model.get_encoder()
    ids, mask = source(2, 9, 0)
    kw = dict(plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    built = recompile(encoder, generate_encoder_call(model, ids, attention_mask=mask), **kw)
    assert built.plan.choices[0].other_shapes          # sources of other sizes run it, without dynamic=True
    built.save(tmp_path / "encoder.cuvilpkg")
    recompile(model, generate_step_call(model, ids, attention_mask=mask, step=3), **kw).save(tmp_path / "step.cuvilpkg")

    fast = _load(tmp_path / "encoder.cuvilpkg", model)
    region = fast.get_encoder()
    assert isinstance(region, CompiledRegion) and region.original is encoder
    assert model.get_encoder() is encoder and model.model is not fast.model      # the user's model is as it was
    assert "an encoder's build (BartEncoder)" in " ".join(fast.cuvil_load_report.notes)
    both = [_load(tmp_path / "step.cuvilpkg", fast), _load(tmp_path / "encoder.cuvilpkg", _load(tmp_path / "step.cuvilpkg", model))]
    again = _load(tmp_path / "encoder.cuvilpkg", fast)         # replaces the loaded encoder's build, not wraps it
    assert again.get_encoder().original is encoder and own_model(again) is model
    for built in [fast, *both, again]:
        ran = []
        handle = built.get_encoder().register_forward_pre_hook(lambda module, args, ran=ran: ran.append(1))
        for batch, length, seed in ((2, 9, 1), (3, 13, 2)):         # the captured sizes and others
            ids, mask = source(batch, length, seed)
            a, b = _generate(built, ids, mask), _generate(model, ids, mask)
            assert torch.equal(a.sequences, b.sequences)
            assert max((p - q).abs().max().item() for p, q in zip(a.logits, b.logits, strict=True)) < 1e-4
        handle.remove()
        assert len(ran) == 2 and built.get_encoder().fallback_calls == 0     # once per generate(), on its program
    for built in both:
        assert built.forward.region.fallback_calls == 0 and built.forward.outside_calls == 0
    assert model.get_encoder() is encoder and "forward" not in vars(model)

    (tmp_path / "factory.py").write_text(FACTORY)        # a service process loads them, in both orders
    result = run_service('''
import json, sys, warnings
import torch
sys.path.insert(0, ".")
from factory import make_bart, source
from cuvil_pgc import load_build

model, eager = make_bart(), make_bart()
out = {}
for order in (("encoder", "step"), ("step", "encoder")):
    fast = model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in order:
            fast = load_build(f"{name}.cuvilpkg", fast, allow_unsigned=True)
    ids, mask = source(3, 11, 5)
    kw = dict(attention_mask=mask, max_new_tokens=5, min_new_tokens=5, do_sample=False, num_beams=1)
    with torch.no_grad():
        same = bool(torch.equal(fast.generate(ids, **kw), eager.generate(ids, **kw)))
    encoder = fast.get_encoder()
    out["+".join(order)] = [same, type(encoder).__name__, encoder.fallback_calls, encoder.other_shape_calls,
                            fast.forward.region.fallback_calls, type(model.get_encoder()).__name__]
print(json.dumps(out))
''', cwd=tmp_path)
    for order in ("encoder+step", "step+encoder"):
        assert result[order] == [True, "CompiledRegion", 0, 1, 0, "BartEncoder"], (order, result)


def test_a_build_of_another_models_class_is_still_refused(tmp_path, build_env):
    from cuvil_pgc.errors import BuildError
    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.candidates import Candidate

    mlp = torch.nn.Sequential(torch.nn.Linear(4, 4)).eval()
    recompile(mlp, (torch.randn(2, 4),), plan={"": Candidate("", "eager", rewrite=False)}, records=False,
              deployed_race=False, rounds=3).save(tmp_path / "mlp.cuvilpkg")
    with pytest.raises(BuildError, match="recompiled from a Sequential, this model is a BartForConditionalGeneration"):
        _load(tmp_path / "mlp.cuvilpkg", make_bart())
