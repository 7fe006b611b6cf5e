"""What a recompile leaves behind in the user's process: torch's configuration as it found it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.runtimes import check


class _Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(12, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def _inductor_config() -> dict:
    return {k: repr(v) for k, v in torch._inductor.config.get_config_copy().items()}


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_an_aoti_build_leaves_inductors_config_as_it_was():
    """AOTInductor fills ``aot_inductor.metadata`` in place, and that dict is part of the FX graph
    cache key: after a recompile, the user's next ``torch.compile`` of an unchanged function
    missed the cache a fresh process hits (found by the compile-telemetry test running after an
    AOTInductor build in one pytest process)."""
    before = _inductor_config()
    recompile(_Small().eval(), (torch.randn(3, 12),), plan={"": Candidate("", "aoti")}, records=False,
              deployed_race=False, rounds=3, dynamic=True)
    after = _inductor_config()
    assert {k: (before[k], after.get(k)) for k in before if before[k] != after.get(k)} == {}


@pytest.mark.usefixtures("build_env")
@pytest.mark.skipif(not check("ort").ok, reason="needs onnxruntime")
def test_a_recompile_leaves_torchs_random_generator_and_onnx_runtimes_spinning_as_it_found_them():
    """The search draws other input values and a runtime's build random tensors from torch's
    global generator: a caller that seeded torch drew different numbers after a recompile. And the
    search's ONNX Runtime sessions stop spinning after each run (``measuring_in_process``), the
    sessions made after it, as a service's, spin as their plan says."""
    import onnxruntime as ort

    from cuvil_pgc.recompile.runtime_region import ort_session_options

    torch.manual_seed(0)
    model, x = _Small().eval(), torch.randn(2, 12)
    before = torch.get_rng_state()
    build = recompile(model, (x,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    assert torch.equal(torch.get_rng_state(), before)
    stop = "session.force_spinning_stop"
    assert build.module._compiled.session.get_session_options().get_session_config_entry(stop) == "1"
    with pytest.raises(RuntimeError, match="does not have configuration"):
        ort_session_options(ort, {}).get_session_config_entry(stop)
