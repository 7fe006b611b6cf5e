"""A candidate whose build fails inside torch and leaves the thread's dispatch state changed is a
rejected candidate: the search puts the state back and goes on. torch.compile of a forward decorated
with ``@torch.inference_mode()`` (Meta's reference Llama code) fails in torch 2.13 and 2.14 and left
the Python dispatcher's keys set: every later call in the process raised "Hit PythonDispatcher
dispatch key but PythonDispatcherTLS was not set", and recompile ended with an internal error."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.dispatch_state import kept


class InferenceModeForward(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.table = torch.randn(16, 8)        # a plain tensor, sliced under inference mode

    @torch.inference_mode()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.table[: x.shape[0]]


def test_the_keys_and_grad_mode_a_failing_block_leaves_are_put_back():
    model, x = nn.Linear(4, 4), torch.randn(2, 4)
    with pytest.raises(RuntimeError, match="inside torch"), kept("a test block"):
        torch._C._dispatch_tls_set_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher, True)
        torch._C._dispatch_tls_set_dispatch_key_excluded(torch._C.DispatchKey.Functionalize, True)
        torch.set_grad_enabled(False)
        raise RuntimeError("a failure inside torch")
    assert not torch._C._dispatch_tls_is_dispatch_key_included(torch._C.DispatchKey.PythonDispatcher)
    assert not torch._C._dispatch_tls_is_dispatch_key_excluded(torch._C.DispatchKey.Functionalize)
    assert torch.is_grad_enabled()
    assert model(x).shape == (2, 4)


@pytest.mark.usefixtures("build_env")
def test_a_compile_candidate_that_breaks_the_process_is_rejected_and_the_search_goes_on():
    torch.manual_seed(0)
    model, x = InferenceModeForward().eval(), torch.randn(4, 8)
    build = recompile(model, (x,), records=False, backends=("eager", "compile"), rounds=3, deployed_race=False,
                      exhaustive=True)
    assert build.result.choices or build.result.trials          # it finished
    with torch.no_grad():
        assert model(x).shape == (4, 8)                        # and the process still runs torch
    assert torch.is_grad_enabled()
