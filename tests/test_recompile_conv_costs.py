"""Convolution costs under freezing and channels_last: kernel ratios measured on this CPU, weighted
by the convolutions' share of a scope's FLOPs."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile.candidates import Candidate, ScopeFeatures
from cuvil_pgc.recompile.cost_models import PRIORS, MachineFigures, PlanCostModel
from cuvil_pgc.recompile.features import op_census
from cuvil_pgc.recompile.measure import conv_kernel_ratios

#: this CPU class as measured (see measure.conv_kernel_ratios): freezing's convolutions are slower
MEASURED = {"channels_last": 0.77, "prepacked": 1.25, "prepacked_channels_last": 1.3}


def conv_scope(share: float | None = None) -> ScopeFeatures:
    return ScopeFeatures(scope="", path="model", bottleneck="compute", eager_us=2000.0, ops=60, pointwise_ops=30,
                         flops=5e7, bytes=2e6, has_conv=True, labels=["compute"],
                         evidence={} if share is None else {"conv_share": share})


def predicted(ratios: dict[str, float], share: float | None = None) -> dict[str, float]:
    model = PlanCostModel(MachineFigures(conv_ratios=ratios))
    cands = [Candidate("", "aoti", freezing=f, channels_last=cl) for f in (False, True) for cl in (False, True)]
    return {c.config: model.predict(c, conv_scope(share)) for c in cands}


def test_measured_kernel_ratios_rank_plain_channels_last_first():
    times = predicted(MEASURED)
    assert min(times, key=times.get) == "aoti+channels_last"
    assert times["aoti+freezing"] > times["aoti"]
    assert times["aoti+freezing+channels_last"] > times["aoti+channels_last"]
    # where prepacked kernels are faster (the priors), freezing wins as before
    priors = predicted(PRIORS["conv_ratios"])
    assert priors["aoti+freezing+channels_last"] < priors["aoti+channels_last"]


def test_kernel_ratios_apply_to_the_convolutions_share_of_the_work():
    whole, tenth = predicted(MEASURED, share=1.0), predicted(MEASURED, share=0.1)
    assert predicted(MEASURED) == whole                    # no census split: all of the work
    gap_whole = whole["aoti+freezing"] / whole["aoti"] - 1.0
    gap_tenth = tenth["aoti+freezing"] / tenth["aoti"] - 1.0
    assert 0.0 < gap_tenth < gap_whole / 3


def test_census_splits_convolution_flops():
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Flatten(), nn.Linear(8 * 8 * 8, 10)).eval()
    census = op_census(model, (torch.randn(1, 3, 8, 8),), {})
    assert census["conv_flops"] == 2 * 3 * 8 * 9 * 64
    assert census["flops"] == census["conv_flops"] + 2 * 512 * 10


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="oneDNN is not built in")
def test_conv_kernel_ratios_are_measured_on_this_cpu():
    """The four kernels run here and give a ratio each; their values are timings, which a loaded
    machine moves anywhere (a CI run beside other work measured one outside 0.05-20)."""
    ratios = conv_kernel_ratios(rounds=3)
    assert ratios is not None and set(ratios) == set(MEASURED)
    assert all(math.isfinite(v) and v > 0 for v in ratios.values())
