"""``nn.TransformerEncoder`` with a key padding mask (rewrites.attention.ZeroPaddedTransformerEncoder): eager
runs it on a nested tensor and returns zeros at the padded positions, every exported program
computes them, so no build of such a model passed the accuracy guard and it stayed eager."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import recompile, runtimes
from cuvil_pgc.recompile.rewrites import apply_rewrites, rewrite_opportunities
from cuvil_pgc.recompile.rewrites.attention import ZeroPaddedTransformerEncoder
from tests._profiled import record_trace


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(32, 4, 64, batch_first=True, dropout=0.0)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True)
        self.head = nn.Linear(32, 3)

    def forward(self, x, pad):
        return self.head(self.encoder(x, src_key_padding_mask=pad))


def padding(lengths: list[int], size: int, at_end: bool = True) -> torch.Tensor:
    pad = torch.zeros(len(lengths), size, dtype=torch.bool)
    for row, n in enumerate(lengths):
        pad[row, n:] = True
    return pad if at_end else pad.flip(-1)


def tagger():
    torch.manual_seed(0)
    return Tagger().eval(), (torch.randn(2, 12, 32), padding([12, 7], 12))


def test_the_rewrite_keeps_eager_and_zeroes_the_dense_paths_padding():
    model, (x, pad) = tagger()
    assert set(rewrite_opportunities(model)) == {"padded_encoder:encoder",
                                                 *(f"attention_math:encoder.layers.{i}.self_attn" for i in range(2))}
    rewritten, applied = apply_rewrites(model)
    assert type(rewritten.encoder) is ZeroPaddedTransformerEncoder and "padded_encoder:encoder" in applied
    with torch.no_grad():
        reference = model(x, pad)
        torch.testing.assert_close(rewritten(x, pad), reference)               # eager: the nested path
        torch.backends.mha.set_fastpath_enabled(False)                         # what an export traces
        try:
            dense = model.encoder(x, src_key_padding_mask=pad)
            assert dense[1, 7:].abs().max() > 0.1                              # the original computes the padding
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
        exported = torch.export.export(rewritten.encoder, (x,), {"src_key_padding_mask": pad}).module()
        out = exported(x, src_key_padding_mask=pad)
        assert out[1, 7:].abs().max() == 0
        torch.testing.assert_close(out, model.encoder(x, src_key_padding_mask=pad), rtol=1e-4, atol=1e-5)
        # padding at the start of a row: eager runs the dense path there too, and so does the program
        first = padding([12, 7], 12, at_end=False)
        torch.testing.assert_close(exported(x, src_key_padding_mask=first),
                                   model.encoder(x, src_key_padding_mask=first), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
@pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")
def test_a_padded_encoder_gets_a_runtime_build_that_matches_eager_on_other_masks():
    model, inputs = tagger()
    build = recompile(model, inputs, backends=("ort",), records=False, deployed_race=False, rounds=3)
    (choice,) = build.plan.choices
    assert choice.candidate.backend == "ort" and choice.candidate.rewrite, build.plan.choices
    x = torch.randn(2, 12, 32)
    with torch.no_grad():
        for pad in (padding([9, 4], 12), padding([12, 12], 12), padding([12, 5], 12, at_end=False)):
            torch.testing.assert_close(build.module(x, pad), model(x, pad), rtol=1e-4, atol=1e-5)
    assert build.module.fallback_calls == 0


def test_encoder_layers_fed_a_nested_tensor_are_not_scopes(tmp_path, monkeypatch):
    """In inference with a padding mask, ``nn.TransformerEncoder`` hands its layers a nested tensor:
    no program can be exported for it, and the census (with the fast path off) made the layer
    raise on it, so a recompile whose profile named the layers died with an internal error
    ("NestedTensorImpl doesn't support sizes"). Such modules are not scopes; the encoder and the
    model still are, and a pinned plan naming a layer gets an error that says why."""
    from cuvil_pgc.errors import RecompileError
    from cuvil_pgc.recompile.apply import capture_scope_inputs
    from cuvil_pgc.recompile.candidates import Candidate

    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = tagger()
    captured = capture_scope_inputs(model, inputs, ["encoder", "encoder.layers.0", "encoder.layers.1", "head"])
    assert set(captured) == {"", "encoder", "head"}

    trace = record_trace(model, inputs, tmp_path / "tagger.trace.json", calls=5)
    build = recompile(model, inputs, trace, backends=("eager",), budget=2, records=False,
                      deployed_race=False, rounds=3)
    assert not any("layers" in scope for scope in build.result.features)
    with torch.no_grad():
        torch.testing.assert_close(build.module(*inputs), model(*inputs))
    with pytest.raises(RecompileError, match="encoder.layers.0.*nested tensors"):
        recompile(model, inputs, plan={"encoder.layers.0": Candidate("encoder.layers.0", "eager")}, records=False,
                  deployed_race=False, rounds=3)
