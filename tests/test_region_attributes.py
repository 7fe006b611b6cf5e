"""A compiled region reads as the module it replaced: its parent's code and the service's code
read the original module's attributes through it (``self.proj.out_features``, tied weights,
``model.config``, ``model.generate``). They raised AttributeError, and ``region.config`` answered
with the candidate's configuration string instead of a Hugging Face model's config."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import recompile, runtimes
from cuvil_pgc.recompile.candidates import Candidate

pytestmark = pytest.mark.usefixtures("build_env")


class Tied(nn.Module):
    """A parent reading its children's attributes in forward, and a head tied to the embedding."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 16)
        self.proj = nn.Linear(16, 16)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.emb(ids)).reshape(ids.shape[0], -1, self.proj.out_features)
        return h @ self.emb.weight.T


def test_a_parent_reads_its_compiled_child_s_attributes():
    if not runtimes.check("ort").ok:
        pytest.skip("needs onnxruntime")
    torch.manual_seed(0)
    model, ids = Tied().eval(), torch.randint(0, 50, (2, 7))
    with torch.no_grad():
        ref = model(ids)
    build = recompile(model, (ids,), plan={"proj": Candidate("proj", "ort")}, records=False, deployed_race=False,
                      rounds=3)
    fast = build.module
    region = fast.proj
    assert type(region).__name__ == "CompiledRegion" and region.plan_config == "ort"
    assert region.out_features == 16 and region.weight is region.original.weight
    with torch.no_grad():
        torch.testing.assert_close(fast(ids), ref, rtol=1e-4, atol=1e-5)
    assert region.fallback_calls == 0
    with pytest.raises(AttributeError, match="no attribute 'not_there'"):
        _ = region.not_there


def test_a_hugging_face_model_built_whole_keeps_its_config_and_generate(caplog):
    """``generate`` calls the original model's forward itself, never the region: the first lookup
    says so (a service calling it saw no speedup and no word of why)."""
    transformers = pytest.importorskip("transformers")
    if not runtimes.check("ort").ok:
        pytest.skip("needs onnxruntime")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      use_cache=False)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(3, 300, (1, 12), generator=torch.Generator().manual_seed(1))
    build = recompile(model, (ids,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    fast = build.module
    assert type(fast).__name__ == "CompiledRegion" and fast.config is model.config and fast.device == model.device
    with torch.no_grad():
        expected = model.generate(ids, max_new_tokens=4, do_sample=False)
        with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.realized"):
            torch.testing.assert_close(fast.generate(ids, max_new_tokens=4, do_sample=False), expected)
            fast.generate(ids, max_new_tokens=1, do_sample=False)
    said = [r.getMessage() for r in caplog.records if "generate()" in r.getMessage()]
    assert said == ["cuvil-pgc: generate() runs the original module: it calls the model's own forward (with a "
                    "cache and positions the build was not captured with), not the build's program, which serves "
                    "calls of the loaded model itself"]
    with torch.no_grad():
        torch.testing.assert_close(fast(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-5)
    assert copy.deepcopy(fast).config is not model.config        # the copy owns its original, as before
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(fast)
