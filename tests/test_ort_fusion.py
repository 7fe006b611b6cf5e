"""ONNX Runtime's transformer optimizer as the ``fuse`` knob of ``ort`` candidates, for scopes with
attention: the fused graph holds ONNX Runtime's contrib operators, and a region it cannot fuse is a
rejected candidate with the reason."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile.candidates import RuntimeSpace, ScopeFeatures, scope_candidates
from cuvil_pgc.recompile.ort_fusion import attention_shape

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


class Block(nn.Module):
    """A post-norm encoder block: attention, residual + LayerNorm, GELU feed-forward."""

    def __init__(self, d: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x, x, x, need_weights=False)[0])
        return self.ln2(x + self.ff(x))


class SelfAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.embed_dim = 6, 48


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(model_type="gpt2", n_head=12, n_embd=768)
        self.h = nn.Linear(2, 2)


def test_attention_shape_reads_heads_and_width_from_the_module():
    assert attention_shape(Block()) == {"model_type": "bert", "num_heads": 4, "hidden_size": 32}
    assert attention_shape(Decoder()) == {"model_type": "gpt2", "num_heads": 12, "hidden_size": 768}
    assert attention_shape(nn.Sequential(SelfAttention())) == {"model_type": "bert", "num_heads": 6,
                                                               "hidden_size": 48}
    assert attention_shape(nn.Sequential(nn.Linear(2, 2), nn.ReLU())) is None


def test_only_scopes_with_attention_get_the_fuse_knob():
    space = RuntimeSpace(("ort",), threads=1)

    def configs(**evidence):
        feats = ScopeFeatures(scope="", path="m", bottleneck="compute", eager_us=500.0, labels=["compute"],
                              evidence=evidence)
        return {c.config for c in scope_candidates(feats, runtimes=space)}

    assert "ort+fuse=gpt2" in configs(attention={"model_type": "gpt2", "num_heads": 12, "hidden_size": 768})
    assert not any("fuse" in c for c in configs())


def test_the_features_record_the_attention_the_optimizer_needs():
    from cuvil_pgc.recompile.apply import ScopeInputs
    from cuvil_pgc.recompile.features import scope_features

    feats = scope_features("", Block().eval(), ScopeInputs((torch.randn(1, 8, 32),)), None, None, 1.0, 1.0)
    assert feats.evidence["attention"] == {"model_type": "bert", "num_heads": 4, "hidden_size": 32}


@pytest.mark.slow   # one ONNX export and the optimizer (~10-20 s on a shared 2-core machine)
@needs_ort
def test_the_fuse_knob_runs_a_graph_of_onnx_runtimes_fused_operators():
    import onnx

    from cuvil_pgc.recompile.apply import ScopeInputs, realize
    from cuvil_pgc.recompile.candidates import Candidate

    torch.manual_seed(0)
    model, x = Block().eval(), torch.randn(1, 8, 32)
    realized = realize(model, Candidate("", "ort", knobs=(("fuse", "bert"),)), ScopeInputs((x,)), machine="t")
    fused = {n.op_type for n in onnx.load(realized.artifact).graph.node if n.domain == "com.microsoft"}
    assert {"SkipLayerNormalization"} <= fused and fused & {"BiasGelu", "FastGelu", "Gelu"}
    with torch.no_grad():
        torch.testing.assert_close(realized.module(x), model(x), rtol=1e-4, atol=1e-5)
    plain = realize(model, Candidate("", "ort"), ScopeInputs((x,)), machine="t")   # the same export, unfused
    assert not any(n.domain == "com.microsoft" for n in onnx.load(plain.artifact).graph.node)


@pytest.mark.slow   # one ONNX export
@needs_ort
def test_a_region_the_optimizer_cannot_fuse_is_rejected_with_the_reason():
    from cuvil_pgc.recompile.apply import ScopeInputs, realize
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.ort_fusion import FusionError

    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(8, 8), nn.ReLU()).eval(), torch.randn(2, 8)
    with pytest.raises(FusionError, match="fused nothing in this region"):
        realize(model, Candidate("", "ort", knobs=(("fuse", "bert"),)), ScopeInputs((x,)), machine="t")
