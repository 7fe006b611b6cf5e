"""A candidate that fails the accuracy guard by far more than its tolerance fails it with any
thread count, spinning or performance hint: the search rejects those siblings without building
them, and leaves the budget to candidates whose arithmetic differs (a rewrite, another precision
or backend). Before, a pinned runtime with a small budget spent it on such siblings, each failing
the same way, and never reached the rewrite that passes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile.accuracy import DECISIVE_EXCESS, check_outputs
from cuvil_pgc.recompile.candidates import Candidate


def test_a_failure_far_beyond_the_tolerance_is_decisive_and_a_near_miss_is_not():
    ref = torch.tensor([1.0, -2.0, 3.0])
    far = check_outputs(ref, ref + torch.tensor([0.0, 0.0, 0.5]))
    near = check_outputs(ref, ref + torch.tensor([0.0, 0.0, 6e-4]))      # 6e-4 against 1e-4 + 1e-4 * 3
    assert far.decisive and far.excess == pytest.approx(0.5 / 4e-4)
    assert not near.ok and not near.decisive and near.excess < DECISIVE_EXCESS
    assert not check_outputs(ref, ref).decisive
    assert check_outputs(ref, ref, rtol=0.0, atol=0.0).ok


def test_only_the_knobs_that_schedule_the_work_share_an_arithmetic_key():
    plain = Candidate("enc", "ort")
    for same in (Candidate("enc", "ort", knobs=(("threads", "1"),)), Candidate("enc", "ort", knobs=(("spin", "off"),)),
                 Candidate("enc", "ort", knobs=(("exec", "parallel"),))):
        assert same.arithmetic_key == plain.arithmetic_key
    for other in (Candidate("enc", "ort", knobs=(("opt", "extended"),)), Candidate("enc", "ort", rewrite=True),
                  Candidate("enc", "ort", precision="bf16"), Candidate("enc", "openvino"), Candidate("", "ort")):
        assert other.arithmetic_key != plain.arithmetic_key
    assert Candidate("", "openvino", knobs=(("hint", "throughput"),)).arithmetic_key == Candidate("", "openvino").arithmetic_key


@pytest.mark.skipif(not runtimes.check("openvino").ok, reason="needs openvino")
def test_the_siblings_of_a_decisive_failure_are_not_built_and_the_rewrite_is(monkeypatch):
    from cuvil_pgc._threads import torch_threads
    from cuvil_pgc.recompile import search as search_mod
    from cuvil_pgc.recompile.realized import Realized
    from cuvil_pgc.recompile.trials import SearchOptions

    class Off(nn.Module):          # what a runtime whose conversion computes something else returns
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(*args) + 1.0

    built: list[str] = []

    def fake_realize(module, cand, inputs, **kw):
        built.append(cand.key)
        return Realized(Off(module) if cand.backend == "openvino" and not cand.rewrite else module)

    monkeypatch.setattr("cuvil_pgc.recompile.checked_build.realize", fake_realize)
    monkeypatch.setattr(runtimes, "openvino_native_bf16", lambda: False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(4, 8, 3), nn.BatchNorm1d(8)).eval()      # a conv+BN fold: a rewrite
    inputs = (torch.randn(2, 4, 16),)                                        # batch 2: the throughput hint
    options = SearchOptions(exhaustive=True, backends=("openvino",), rounds=3, deployed_race=False)
    with torch_threads(2):
        result = search_mod.search(model, inputs, None, options=options, records=None, machine_key="m")
    plain, hinted = result.trials["<model>::openvino"], result.trials["<model>::openvino+hint=throughput"]
    assert plain.status == "accuracy_error" and "<model>::openvino" in built
    assert hinted.status == "accuracy_error" and "<model>::openvino+hint=throughput" not in built
    assert hinted.reason.startswith("not built: openvino failed the accuracy guard by 1e+04x its tolerance")
    assert hinted.reason.endswith("only schedule the work")
    assert "<model>::openvino+rewrite" in built and result.trials["<model>::openvino+rewrite"].status == "ok"
