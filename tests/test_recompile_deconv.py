"""The transposed-convolution rewrite: GEMM + col2im in compiled graphs, the original elsewhere."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile.candidates import Candidate, ScopeFeatures
from cuvil_pgc.recompile.cost_models import MachineFigures, PlanCostModel
from cuvil_pgc.recompile.features import op_census
from cuvil_pgc.recompile.rewrites import apply_rewrites, rewrite_opportunities
from cuvil_pgc.recompile.rewrites.deconv import (
    MAX_GEMM_DECONV_OUTPUT,
    GemmConvTranspose1d,
    GemmConvTranspose2d,
    gemm_deconv_applies,
)


class Decoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Sequential(nn.ConvTranspose2d(16, 8, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(8, 1, 4, 2, 1))
        self.big = nn.ConvTranspose2d(1, 64, 3, 1, 1)             # 64 x 28 x 28 outputs: too large
        self.grouped = nn.ConvTranspose2d(1, 2, 2, 2, groups=1, dilation=2)

    def forward(self, z):
        y = self.up(z)
        return y, self.big(y)


@pytest.fixture
def compiling(monkeypatch):
    """Run forwards as a compiled graph traces them (the rewrite's branch), and make sure the GEMM
    form, not oneDNN's deconvolution, computes them."""
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)


CASES = [  # (module, input shape)
    (nn.ConvTranspose2d(16, 8, 4, 2, 1), (1, 16, 7, 7)),
    (nn.ConvTranspose2d(8, 1, 4, 2, 1, bias=False), (2, 8, 14, 14)),
    (nn.ConvTranspose2d(8, 4, 3, 2, 1, output_padding=1), (1, 8, 9, 9)),
    (nn.ConvTranspose2d(8, 4, (3, 5), (1, 2), (1, 2)), (3, 8, 6, 7)),
    (nn.ConvTranspose1d(16, 8, 4, 2, 1), (2, 16, 50)),
    (nn.ConvTranspose1d(4, 4, 3, 3, 0, output_padding=2), (1, 4, 20)),
]


@pytest.mark.parametrize("conv, shape", CASES)
def test_gemm_conv_transpose_matches_torch(conv, shape, compiling, monkeypatch):
    torch.manual_seed(0)
    conv.eval()
    x = torch.randn(shape)
    with torch.no_grad():
        expected = conv(x)
        rewritten, applied = apply_rewrites(conv)
        assert applied == ["deconv_gemm:"] and gemm_deconv_applies(rewritten, x)
        for name in ("conv_transpose1d", "conv_transpose2d"):         # the GEMM form computes it
            monkeypatch.setattr(nn.functional, name, None)
        got = rewritten(x)
    assert got.shape == expected.shape
    assert (got - expected).abs().max() < 1e-5


def test_eager_large_grouped_and_sized_calls_keep_the_original():
    torch.manual_seed(0)
    model = Decoder().eval()
    rewritten, applied = apply_rewrites(model)
    assert sorted(applied) == sorted(rewrite_opportunities(model)) == ["deconv_gemm:big", "deconv_gemm:up.0",
                                                                      "deconv_gemm:up.2"]
    assert type(rewritten.grouped) is nn.ConvTranspose2d                     # dilated: not rewritten
    assert type(rewritten.up[0]) is GemmConvTranspose2d and type(model.up[0]) is nn.ConvTranspose2d
    z = torch.randn(1, 16, 7, 7)
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(rewritten(z), model(z), strict=True))   # eager: the original ran
        y = rewritten.up(z)
    assert gemm_deconv_applies(rewritten.up[0], z)
    assert not gemm_deconv_applies(rewritten.big, y)                         # 64 * 28 * 28 > the limit
    assert 64 * 28 * 28 > MAX_GEMM_DECONV_OUTPUT
    assert not gemm_deconv_applies(rewritten.up[0], z, output_size=[14, 14])
    assert not gemm_deconv_applies(rewritten.up[0], z[0])                    # unbatched
    one_d, _ = apply_rewrites(nn.ConvTranspose1d(2, 2, 3))
    assert type(one_d) is GemmConvTranspose1d


def test_exported_graph_runs_gemm_and_col2im_and_equals_eager():
    torch.manual_seed(0)
    model = Decoder().eval()
    rewritten, _ = apply_rewrites(model)
    z = torch.randn(1, 16, 7, 7)
    with torch.no_grad():
        exported = torch.export.export(rewritten, (z,))
        targets = [str(n.target) for n in exported.graph.nodes if n.op == "call_function"]
        assert sum("col2im" in t for t in targets) == 2                  # up.0 and up.2
        assert sum("conv_transpose" in t for t in targets) == 1          # big stays a deconvolution
        got, expected = exported.module()(z), model(z)
    assert all((a - b).abs().max() < 1e-5 for a, b in zip(got, expected, strict=True))


def test_census_counts_the_rewritable_calls_and_compiled_candidates_are_predicted_to_gain():
    model = Decoder().eval()
    census = op_census(model, (torch.randn(1, 16, 7, 7),), {})
    assert census["deconv_calls"] == 2                                    # not the large one
    costs = PlanCostModel(MachineFigures())

    def scope(calls: int) -> ScopeFeatures:
        return ScopeFeatures(scope="", path="model", bottleneck="compute", eager_us=400.0, ops=12,
                             flops=2e6, bytes=2e5, rewrites=["deconv_gemm:up.0"],
                             evidence={"deconv_calls": calls} if calls else {})
    aoti, rewritten = Candidate("", "aoti"), Candidate("", "aoti", rewrite=True)
    assert costs.predict(rewritten, scope(2)) < costs.predict(aoti, scope(2))
    assert costs.predict(rewritten, scope(0)) == costs.predict(aoti, scope(0))
    assert costs.predict(Candidate("", rewrite=True), scope(2)) == costs.predict(Candidate(""), scope(2))
