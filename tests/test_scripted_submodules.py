"""Models with TorchScript submodules (``self.block = torch.jit.script(Block())``): profiling and
recompiling them used to crash on reading the scripted class's ``forward``; TorchScript also
refuses the hooks the recompiler captures scope inputs with."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc._structure import class_name, module_tree_digest, structural_hash
from cuvil_pgc.analyze.analysis import Analysis, RegionStats
from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.apply import capture_scope_inputs

pytestmark = pytest.mark.usefixtures("build_env")


class Residual(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x)) + x


class Squash(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class WithScripted(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.inp, self.block, self.out = nn.Linear(8, 32), torch.jit.script(block), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.block(self.inp(x)))


def test_scripted_submodules_hash_by_their_scripted_class_and_code():
    torch.manual_seed(0)
    a, b = WithScripted(Residual()), WithScripted(Squash())
    assert class_name(a.block) == "script:Residual" and class_name(a.inp) == "Linear"
    assert structural_hash(a) != structural_hash(b)          # every scripted class is RecursiveScriptModule
    assert module_tree_digest(a) != module_tree_digest(b)
    assert structural_hash(a) == structural_hash(WithScripted(Residual()))


def test_scopes_in_or_under_a_scripted_module_are_not_captured():
    torch.manual_seed(0)
    model, x = WithScripted(Residual()).eval(), torch.randn(2, 8)
    captured = capture_scope_inputs(model, (x,), ["inp", "block", "block.fc"])
    assert set(captured) == {"", "inp"}


@pytest.mark.slow   # a small search
def test_a_model_with_a_scripted_submodule_recompiles_with_the_profile_naming_it():
    def region(path, module):
        return RegionStats(path=path, calls=10, total_us=500.0, self_us=300.0, mean_us=50.0, p50_us=50.0,
                           p95_us=50.0, p99_us=50.0, share=0.5, hotness=300.0, bottleneck="launch_overhead",
                           confidence=0.9, evidence={"module": module})
    analysis = Analysis(regions=[region("model", "WithScripted"), region("model/model.block", "Residual"),
                                 region("model/model.inp", "Linear")])
    torch.manual_seed(0)
    model, x = WithScripted(Residual()).eval(), torch.randn(2, 8)
    build = recompile(model, (x,), analysis=analysis, backends=("compile",), budget=3, rounds=3, records=False,
                      deployed_race=False)
    assert "block" not in build.result.scope_inputs
    with torch.no_grad():
        torch.testing.assert_close(build(x), model(x))


def test_torch_export_s_failure_on_a_scripted_submodule_names_it():
    """torch.export's own message ("Residual.forward() takes 2 positional arguments but 3 were
    given") does not say that the call into TorchScript is the cause; the rejection does."""
    from cuvil_pgc.recompile.apply import ScopeInputs, export_program
    from cuvil_pgc.recompile.export_error import ExportError

    torch.manual_seed(0)
    model, x = WithScripted(Residual()).eval(), torch.randn(2, 8)
    with pytest.raises(ExportError, match="calls the TorchScript module 'block', which torch.export cannot trace"):
        export_program(model, ScopeInputs((x,)))
