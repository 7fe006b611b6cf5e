"""A torch.compile region in a loaded build, called the way a service calls it: it never compiles
again on the request path (a new batch size, a call with autograd recording) but runs the original
module for such calls, counted and warned once, as every other backend's region does.

torch.compile is faked at its seam with Dynamo's ``eager`` backend: Dynamo still guards the
program and would compile it again for the calls below, which is what these tests count, without
Inductor's seconds of compile time per test."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn
from torch._dynamo.utils import counters

from cuvil_pgc.recompile import apply, load_build, recompile
from cuvil_pgc.recompile.apply import ScopeInputs, realize
from cuvil_pgc.recompile.candidates import Candidate

pytestmark = pytest.mark.usefixtures("build_env")


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def head():
    torch.manual_seed(0)
    return Head().eval(), (torch.randn(2, 16),)


@pytest.fixture
def dynamo_eager(monkeypatch):
    """torch.compile with Dynamo's guards but no Inductor; a clean Dynamo cache before and after."""
    monkeypatch.setattr(apply, "_compile_kwargs", lambda cand: {"backend": "eager"})
    torch._dynamo.reset()
    counters.clear()
    yield
    torch._dynamo.reset()


def _compiles() -> int:
    return counters["stats"]["unique_graphs"]


def test_a_loaded_compile_region_never_compiles_again_on_the_request_path(tmp_path, keys, dynamo_eager, caplog):
    model, inputs = head()
    build = recompile(model, inputs, plan={"": Candidate("", "compile")}, rounds=3, records=False,
                      deployed_race=False)
    path = build.save(tmp_path / "c.cuvilpkg", signing_key=str(keys[0]))
    torch._dynamo.reset()
    fast = load_build(path, head()[0], pubkey=str(keys[1]))
    region = fast                                            # the whole model is the one region
    with torch.inference_mode():
        out = fast(*inputs)                                  # the first call compiles, as torch.compile does
    compiled = _compiles()
    assert compiled >= 1 and region.fallback_calls == 0
    torch.testing.assert_close(out, model(*inputs).detach())
    x5 = torch.randn(5, 16)
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.apply"), torch.inference_mode():
        other = fast(x5)                                     # another batch size: the original module
        assert fast(*inputs).shape == (2, 4)                 # the captured one: still the compiled program
    torch.testing.assert_close(other, model(x5).detach())
    assert other.shape == (5, 4) and region.fallback_calls == 1 and _compiles() == compiled
    assert "input 0 has shape (5, 16), built for (2, 16)" in caplog.text
    grad = fast(*inputs)                                     # autograd recording: the original module
    assert grad.requires_grad and region.fallback_calls == 2 and _compiles() == compiled
    torch.testing.assert_close(grad.detach(), out)


def test_a_call_with_autograd_recording_says_how_to_call_the_build(dynamo_eager, caplog):
    model, inputs = head()
    region = realize(model, Candidate("", "compile"), ScopeInputs(inputs)).module
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.apply"):
        out = region(*inputs)
    assert region.fallback_calls == 1 and _compiles() == 0 and out.grad_fn is not None
    assert "autograd recording" in caplog.text and "torch.inference_mode()" in caplog.text
    with torch.no_grad():
        region(*inputs)
    assert region.fallback_calls == 1 and _compiles() == 1


def test_inputs_that_require_grad_and_autocast_do_not_compile_again(dynamo_eager):
    model, inputs = head()
    region = realize(model, Candidate("", "compile"), ScopeInputs(inputs)).module
    with torch.no_grad():
        region(*inputs)
        compiled = _compiles()
        region(inputs[0].clone().requires_grad_())             # Dynamo guards on requires_grad
        with torch.autocast("cpu", dtype=torch.bfloat16):      # and on autocast (5 s with Inductor)
            assert region(*inputs).dtype == torch.bfloat16
        region(*inputs)
    assert _compiles() == compiled and region.fallback_calls == 2
