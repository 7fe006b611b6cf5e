"""A Python number among a model's example inputs (a diffusion denoiser's ``int(t)``, a
``temperature``) is held by the build's programs as the constant it was captured with: calls with
another value run the original module, and a sampling loop over fifty timesteps never ran the build
while the one warning it got said only that "the inputs differ". Recompile now says so up front,
with the fix (the number as a 0-d tensor, which the program takes as an input), and the fix holds:
a build made and called with the tensor runs its program at every value."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from cuvil_pgc import load_build
from cuvil_pgc._example_inputs import number_inputs
from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate

pytestmark = pytest.mark.usefixtures("build_env")


class Denoiser(nn.Module):
    def __init__(self):
        super().__init__()
        self.t_mlp = nn.Linear(8, 16)
        self.conv = nn.Conv2d(4, 16, 3, padding=1)

    def forward(self, x, t, scale: float = 1.0, use_bias: bool = True):
        freqs = torch.exp(-math.log(1000) * torch.arange(4, dtype=torch.float32) / 4)
        emb = torch.cat([(t * freqs).sin(), (t * freqs).cos()])[None]
        return (self.conv(x) + self.t_mlp(emb)[:, :, None, None]) * scale


def denoiser():
    torch.manual_seed(0)
    return Denoiser().eval()


def test_the_numbers_named_are_those_a_call_must_repeat():
    x = torch.randn(1, 4, 8, 8)
    assert number_inputs(denoiser(), (x, 500)) == [("t", 500)]
    assert number_inputs(denoiser(), (x, 500, 0.5)) == [("t", 500), ("scale", 0.5)]
    assert number_inputs(denoiser(), (x, torch.tensor(500), 1.0, False)) == []   # a default, a bool: not numbers to vary
    assert number_inputs(denoiser(), (x, 2.0)) == [("t", 2.0)]


def test_recompile_says_a_number_is_held_as_a_constant_and_names_the_tensor_fix(caplog):
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.build"):
        recompile(denoiser(), (torch.randn(1, 4, 8, 8), 500), plan={"": Candidate("", "eager")}, records=False,
                  deployed_race=False, rounds=3)
    said = [r.getMessage() for r in caplog.records if "as a Python number" in r.getMessage()]
    assert len(said) == 1 and "t=500" in said[0] and "torch.tensor(500)" in said[0]
    caplog.clear()
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.build"):
        recompile(denoiser(), (torch.randn(1, 4, 8, 8), torch.tensor(500)), plan={"": Candidate("", "eager")},
                  records=False, deployed_race=False, rounds=3)
    assert not any("as a Python number" in r.getMessage() for r in caplog.records)


def test_a_build_made_and_called_with_the_number_as_a_tensor_runs_its_program_at_every_value(tmp_path, keys):
    pytest.importorskip("onnxruntime")
    x = torch.randn(1, 4, 8, 8)
    build = recompile(denoiser(), (x, torch.tensor(500)), plan={"": Candidate("", "ort")}, records=False,
                      deployed_race=False, rounds=3)
    path = build.save(tmp_path / "d.cuvilpkg", signing_key=str(keys[0]))
    fast, eager = load_build(path, denoiser(), pubkey=str(keys[1])), denoiser()
    with torch.no_grad():
        for t in (500, 499, 10, 999):
            torch.testing.assert_close(fast(x, torch.tensor(t)), eager(x, t), rtol=1e-4, atol=1e-5)
    assert fast.fallback_calls == 0
    with torch.no_grad():                  # the number itself still runs the original module
        torch.testing.assert_close(fast(x, 499), eager(x, 499))
    assert fast.fallback_calls == 1 and "pass torch.tensor(499, dtype=torch.int64)" in fast.first_fallback


def test_a_build_made_with_the_number_says_why_another_value_runs_the_original_module(tmp_path, keys):
    pytest.importorskip("onnxruntime")
    x = torch.randn(1, 4, 8, 8)
    build = recompile(denoiser(), (x, 500), plan={"": Candidate("", "ort")}, records=False, deployed_race=False,
                      rounds=3)
    path = build.save(tmp_path / "d.cuvilpkg", signing_key=str(keys[0]))
    fast, eager = load_build(path, denoiser(), pubkey=str(keys[1])), denoiser()
    with torch.no_grad():
        for t in (500, 499):
            torch.testing.assert_close(fast(x, t), eager(x, t), rtol=1e-4, atol=1e-5)
    assert fast.fallback_calls == 1 and "the value of a Python number" in fast.first_fallback
