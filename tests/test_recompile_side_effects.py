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

    from cuvil_pgc.recompile.ort_runner import ort_session_options

    torch.manual_seed(0)
    model, x = _Small().eval(), torch.randn(2, 12)
    before = torch.get_rng_state()
    build = recompile(model, (x,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    assert torch.equal(torch.get_rng_state(), before)
    stop = "session.force_spinning_stop"
    assert build.module._compiled.session.get_session_options().get_session_config_entry(stop) == "1"
    with pytest.raises(RuntimeError, match="does not have configuration"):
        ort_session_options(ort, {}).get_session_config_entry(stop)


class _Varied(nn.Module):
    """A LayerNorm, a BatchNorm in eval, a config-like attribute and a scripted block. (Not
    ``nn.MultiheadAttention``: the TorchScript exporter cannot export a trace of it, "transpose for
    tensor of unknown rank", so a model holding both has no runtime candidate.)"""

    def __init__(self) -> None:
        super().__init__()
        self.temperature = 0.5
        self.proj = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.bn = nn.BatchNorm1d(16)
        self.block = torch.jit.script(nn.Sequential(nn.Linear(16, 16), nn.ReLU()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.softmax(self.proj(x) @ x.transpose(1, 2), -1) @ x
        h = self.bn(self.norm(h + x).transpose(1, 2)).transpose(1, 2)
        return self.block(h) / self.temperature


def _state(model: nn.Module) -> dict:
    """Everything of the model a build is matched by, and each submodule's attributes and code."""
    from cuvil_pgc._structure import settings_digest, structural_hash, weights_digest

    return {"structure": structural_hash(model), "weights": weights_digest(model),
            "settings": settings_digest(model), "training": [m.training for m in model.modules()],
            "attributes": [sorted(vars(m)) for m in model.modules() if not isinstance(m, torch.jit.ScriptModule)],
            "code": [m.code for m in model.modules() if isinstance(m, torch.jit.ScriptModule)]}


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_a_runtime_build_leaves_the_user_s_model_as_it_found_it(backend):
    """A recompile reads the user's model; it must not change it. The TorchScript exporter rewrote
    the graphs of the scripted block inside such a model in place, which changed its code and
    structural hash, so a build no longer applied to the model it was made from. Compared: the
    hashes a build is matched by, each submodule's mode and attributes, and the scripted code."""
    if not check(backend).ok:
        pytest.skip(f"needs {backend}")
    torch.manual_seed(0)
    model = _Varied().eval()
    before = _state(model)
    build = recompile(model, (torch.randn(2, 6, 16),), plan={"": Candidate("", backend)}, records=False,
                      deployed_race=False, rounds=3)
    assert [c.candidate.backend for c in build.plan.choices] == [backend]
    assert _state(model) == before
