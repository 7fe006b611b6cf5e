"""A Hugging Face mixture-of-experts runs its experts through transformers' own custom op
(``transformers.grouped_mm_fallback``), which torch's ONNX exporter has no translation for: every
ONNX Runtime and OpenVINO candidate of Mixtral, Qwen-MoE or OLMoE failed. The export takes the
translations transformers' own exporter passes (recompile/runtime_build.library_translations)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile.runtime_build import library_translations

transformers = pytest.importorskip("transformers")


def make_moe():
    torch.manual_seed(0)
    config = transformers.Qwen2MoeConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                         num_key_value_heads=1, intermediate_size=64, moe_intermediate_size=32,
                                         shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                                         vocab_size=60, max_position_embeddings=64)
    return transformers.Qwen2MoeForCausalLM(config).eval()


def test_only_a_hugging_face_model_gets_its_librarys_translations():
    table = library_translations(make_moe())
    assert table is not None and torch.ops.transformers.grouped_mm_fallback.default in table
    assert library_translations(nn.Sequential(nn.Linear(2, 2))) is None


@pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")
def test_a_mixture_of_experts_is_built_on_onnx_runtime(build_env):
    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.candidates import Candidate

    model = make_moe()
    ids = torch.randint(3, 60, (2, 7))
    build = recompile(model, {"input_ids": ids, "use_cache": False}, plan={"": Candidate("", "ort")},
                      records=False, deployed_race=False, rounds=3)
    assert [c.candidate.config for c in build.plan.choices] == ["ort"]
    with torch.no_grad():
        torch.testing.assert_close(build.module(ids, use_cache=False).logits, model(ids, use_cache=False).logits)


def test_the_benchmarks_plain_export_is_torchs_own(monkeypatch, tmp_path):
    """The runtimes' baselines race what a user's plain torch.onnx.export makes, without them."""
    from cuvil_pgc.recompile import runtime_build
    from cuvil_pgc.recompile.apply import ScopeInputs

    seen = []

    def export(*args, **kwargs):
        seen.append(kwargs.get("custom_translation_table"))
        raise RuntimeError("stop after the call")
    monkeypatch.setattr(torch.onnx, "export", export)
    model, inputs = make_moe(), ScopeInputs((torch.randint(3, 60, (1, 4)),))
    for plain in (False, True):
        with runtime_build.plain_exports() if plain else contextlib.nullcontext(), \
                pytest.raises(Exception, match="stop after"):
            runtime_build.export_onnx(model, inputs, tmp_path / f"{plain}.onnx", 1)
    assert seen[0] is not None and seen[1] is None

