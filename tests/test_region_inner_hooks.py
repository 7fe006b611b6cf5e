"""A hook registered on a module inside a built region runs: the region runs the original module
while the hook stays (a compiled program or a runtime session does not call the region's
modules, so a hook to capture or change a layer's output used to be skipped without a word), and
goes back to its program once the hook is removed."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.runtimes import check

pytestmark = [pytest.mark.usefixtures("build_env"),
              pytest.mark.skipif(not check("ort").ok, reason="needs onnxruntime (the [ort] extra)")]


class TwoLayers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


@pytest.fixture
def built():
    torch.manual_seed(0)
    model, x = TwoLayers().eval(), torch.randn(2, 16)
    build = recompile(model, (x,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    return model, build.module, x


def test_a_hook_inside_the_region_runs_and_changes_the_output_as_in_eager(built, caplog):
    model, fast, x = built
    with torch.no_grad():
        plain = model(x)
        torch.testing.assert_close(fast(x), plain)
        assert fast.fallback_calls == 0
        seen = []
        handle = model.fc1.register_forward_hook(lambda m, args, out: seen.append(out.shape) or out * 0)
        with caplog.at_level(logging.WARNING, logger="cuvil_pgc"):
            hooked = fast(x)
        torch.testing.assert_close(hooked, model.fc2(torch.zeros(2, 32)))     # the hook's zeros went on
        assert seen == [torch.Size([2, 32])]
        assert fast.fallback_calls == 1 and "a hook is registered on 'fc1'" in caplog.text
        handle.remove()
        torch.testing.assert_close(fast(x), plain)
        fast(x)
    assert fast.fallback_calls == 1                  # the program again once the hook is gone


def test_a_hook_on_the_model_itself_or_a_pre_hook_counts_too(built):
    model, fast, x = built
    with torch.no_grad():
        handle = model.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
        torch.testing.assert_close(fast(x), model(x))
        assert fast.fallback_calls == 1
        handle.remove()
        fast(x)
    assert fast.fallback_calls == 1


def test_a_hook_on_the_module_the_build_put_in_place_runs_around_its_program(built):
    """What recompile tells a service whose model carries a monitoring hook: registered on the
    loaded model instead, the hooks run (changing input and output, as in eager) around the program."""
    model, fast, x = built
    seen = []
    fast.register_forward_pre_hook(lambda m, args: (args[0] * 2,))
    fast.register_forward_hook(lambda m, args, out: seen.append(out.shape) or out + 1)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x * 2) + 1)
    assert seen == [torch.Size([2, 4])] and fast.fallback_calls == 0


def test_torch_s_own_hooks_inside_the_region_leave_it_on_its_program():
    """The old weight_norm recomputes its weight in a forward pre-hook: part of the model the
    program was exported from, so the region keeps running its program."""
    torch.manual_seed(0)
    model = TwoLayers()
    with warnings.catch_warnings():       # deprecated in favour of parametrizations.weight_norm
        warnings.simplefilter("ignore")
        torch.nn.utils.weight_norm(model.fc1)
    model, x = model.eval(), torch.randn(2, 16)
    fast = recompile(model, (x,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False,
                     rounds=3).module
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))
        fast(x)
    assert fast.fallback_calls == 0
