"""A model that turns on ``torch.autocast`` inside its forward: its submodules are called under an
autocast their own call does not carry. Replayed alone, the second linear of a bf16-autocast MLP
got the first's bf16 output against its float32 weight, and `cuvil-pgc recompile` ended in an
internal error ("mat1 and mat2 must have the same dtype") before measuring anything. Such a
submodule is now searched only as part of the module that turns the autocast on."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.errors import RecompileError
from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.apply import capture_scope_inputs
from cuvil_pgc.recompile.candidates import Candidate
from tests._profiled import record_trace


class Autocast(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = self.net(x)
        return self.head(y.float())


def model_and_inputs():
    torch.manual_seed(0)
    return Autocast().eval(), (torch.randn(4, 16),)


def test_submodules_called_under_their_callers_autocast_are_not_scopes(caplog):
    model, inputs = model_and_inputs()
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.apply"):
        scopes = capture_scope_inputs(model, inputs, ["net", "net.0", "net.2", "head"])
    assert set(scopes) == {"", "head"}                       # the head runs after the autocast ends
    said, = [r.getMessage() for r in caplog.records]
    assert said.startswith("cuvil-pgc: net, net.0, net.2 run under the bf16 autocast on cpu its caller turns on")


def test_the_recompile_of_a_model_autocasting_inside_builds_and_a_pinned_submodule_is_refused(tmp_path):
    model, inputs = model_and_inputs()
    trace = record_trace(model, inputs, tmp_path / "autocast.trace.json", calls=3)
    build = recompile(model, inputs, trace, backends=("eager",), budget=2, records=False, deployed_race=False,
                      rounds=3)
    assert not any(scope.startswith("net") for scope in build.result.features)
    with torch.no_grad():
        torch.testing.assert_close(build.module(*inputs), model(*inputs))
    with pytest.raises(RecompileError, match="'net.2'.*under its caller's autocast"):
        recompile(model, inputs, plan={"net.2": Candidate("net.2", "eager")}, records=False, deployed_race=False,
                  rounds=3)
