"""What a cell rewrite saves: the RNN op's time less its unrolled cells, whose GEMMs are timed on
this machine for the scope's shapes; for a compiled RNN with no fused kernel, the per-step input
projections it batches into one."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile.apply import capture_scope_inputs
from cuvil_pgc.recompile.candidates import Candidate, ScopeFeatures
from cuvil_pgc.recompile.cost_models import MachineFigures, PlanCostModel
from cuvil_pgc.recompile.features import op_census, rnn_cell_gemms, scope_features


def rnn_scope(**evidence) -> ScopeFeatures:
    return ScopeFeatures(scope="", path="model", bottleneck="launch_overhead", eager_us=500.0, ops=10,
                         rewrites=["lstm_cell:rnn"], labels=["launch_overhead"],
                         evidence={"rnn_us": 450.0, "rnn_steps": 32, "rnn_calls": 1, **evidence})


def test_the_cells_gemms_are_listed_per_layer_and_direction():
    lstm = nn.LSTM(64, 96, num_layers=2, batch_first=True, bidirectional=True)
    assert rnn_cell_gemms(lstm, (torch.randn(3, 12, 64),)) == [
        (2, 36, 64, 384), (24, 3, 96, 384),          # layer 0: both directions' projections, 12 steps each
        (2, 36, 192, 384), (24, 3, 96, 384)]         # layer 1 reads both directions' outputs
    assert rnn_cell_gemms(nn.GRU(8, 16), (torch.randn(5, 8),)) == [(1, 5, 8, 48), (5, 1, 16, 48)]   # unbatched
    assert rnn_cell_gemms(nn.GRU(8, 16), (torch.randn(5, 8),), stepwise=True) == [(5, 1, 8, 48), (5, 1, 16, 48)]
    assert rnn_cell_gemms(nn.LSTM(8, 16, proj_size=4), (torch.randn(5, 1, 8),)) == []           # not rewritten

@pytest.mark.filterwarnings("ignore::UserWarning")       # mkldnn.flags() touches a deprecated tf32 switch
def test_scope_features_time_the_cells_and_an_unfused_rnns_stepwise_gemms():
    lstm = nn.LSTM(32, 64, batch_first=True).eval()
    x = torch.randn(1, 8, 32)
    inputs = capture_scope_inputs(lstm, (x,), [""])[""]
    fused = scope_features("", lstm, inputs, None, None, 1.0, 1.0)
    assert fused.evidence["cell_gemm_us"] > 0 and "stepwise_gemm_us" not in fused.evidence
    with torch.backends.mkldnn.flags(enabled=False):                 # cell ops, as a CPU nn.GRU always runs
        assert op_census(lstm, (x,), {})["stepwise_gemms"] == rnn_cell_gemms(lstm, (x,), stepwise=True)
        unfused = scope_features("", lstm, inputs, None, None, 1.0, 1.0)
    assert unfused.evidence["stepwise_gemm_us"] > 0


def test_a_long_sequence_whose_cells_cost_what_the_op_does_gains_nothing_compiled():
    model = PlanCostModel(MachineFigures(dispatch_us=2.0))
    aoti, aoti_rw = Candidate("", "aoti"), Candidate("", "aoti", rewrite=True)
    one_step = dataclasses.replace(rnn_scope(cell_gemm_us=60.0), evidence={
        "rnn_us": 450.0, "rnn_steps": 1, "rnn_calls": 1, "cell_gemm_us": 60.0})
    assert model.predict(aoti_rw, one_step) < 0.5 * model.predict(aoti, one_step)   # the op's fixed cost goes
    # 32 matrix-vector steps measured at 14 µs each: the unrolled cells cost what the op does
    assert model.predict(aoti_rw, rnn_scope(cell_gemm_us=450.0)) >= model.predict(aoti, rnn_scope(cell_gemm_us=450.0))
    # without the measurement the prior says 80 % of the op is fixed cost
    assert model.predict(aoti_rw, rnn_scope()) < 0.5 * model.predict(aoti, rnn_scope())


def test_a_compiled_rnn_without_a_fused_kernel_saves_its_per_step_input_projections():
    model = PlanCostModel(MachineFigures(dispatch_us=2.0))
    f = rnn_scope(cell_gemm_us=100.0, stepwise_gemm_us=160.0)
    aoti, aoti_rw = Candidate("", "aoti"), Candidate("", "aoti", rewrite=True)
    assert model.launch.rewrite_saving(aoti_rw, f) == pytest.approx(60.0)
    assert model.predict(aoti_rw, f) < model.predict(aoti, f)
    assert model.launch.rewrite_saving(Candidate("", rewrite=True), f) != 60.0     # eager: the op's own ops


def test_no_cell_rewrite_is_offered_for_an_rnn_the_cell_math_would_not_run():
    from cuvil_pgc.recompile.rewrites.cells import MAX_UNROLLED_STEPS
    from tests.test_recompile_cell_rewrite import PackedTagger

    model = PackedTagger(nn.GRU(8, 16, batch_first=True)).eval()

    def features(*args):
        return scope_features("", model, capture_scope_inputs(model, args, [""])[""], None, None, 1.0, 1.0)

    short = features(torch.randn(3, 7, 8), torch.tensor([7, 4, 2]))
    assert short.rewrites == [] and "rnn_steps" not in short.evidence and "cell_gemm_us" not in short.evidence

    class Plain(nn.Module):
        def __init__(self, steps: int) -> None:
            super().__init__()
            self.rnn, self.steps = nn.GRU(8, 16, batch_first=True), steps

        def forward(self, x):
            return self.rnn(x[:, :self.steps])[0]

    x = torch.randn(1, MAX_UNROLLED_STEPS + 1, 8)
    for steps, offered in ((MAX_UNROLLED_STEPS, ["gru_cell:rnn"]), (MAX_UNROLLED_STEPS + 1, [])):
        plain = Plain(steps).eval()
        feats = scope_features("", plain, capture_scope_inputs(plain, (x,), [""])[""], None, None, 1.0, 1.0)
        assert feats.rewrites == offered
