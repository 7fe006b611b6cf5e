"""A built region called with exactly its captured tensors runs its program straight from
``CompiledRegion.__call__``, without ``nn.Module``'s dispatch and ``forward`` (about 4 µs of the
zoo MLP's 100 µs AOTInductor call, after the package's run has left the caches cold), and only where
``forward`` would have run the program too: any hook, autograd through an input, autocast, other
inputs or changed weights take ``forward``'s checks, which run the original module."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile.matching import input_signature
from cuvil_pgc.recompile.realized import CompiledRegion


class Program:
    """A stand-in for a compiled program: counts its calls, answers 2x + 1."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return x * 2 + 1


def _region(original: nn.Module, program, x: torch.Tensor) -> CompiledRegion:
    spec = [[list(x.shape), str(x.dtype).removeprefix("torch."), str(x.device), list(x.stride())]]
    return CompiledRegion(original, program, input_signature(((x,), {})), "test", spec=spec)


@pytest.fixture
def region(monkeypatch):
    torch.manual_seed(0)
    original, x = nn.Linear(4, 4).eval(), torch.randn(2, 4)
    region = _region(original, Program(), x)
    forward = CompiledRegion.forward
    seen = []
    monkeypatch.setattr(CompiledRegion, "forward", lambda self, *a, **k: seen.append(1) or forward(self, *a, **k))
    return region, x, seen


def test_the_captured_call_runs_the_program_without_the_module_dispatch(region):
    region, x, forward_calls = region
    with torch.no_grad():
        torch.testing.assert_close(region(x), x * 2 + 1)
    assert (region.compiled.calls, forward_calls, region.fallback_calls) == (1, [], 0)
    with torch.no_grad():
        torch.testing.assert_close(region(input=x), x * 2 + 1)      # a keyword call: forward binds it
    assert (region.compiled.calls, forward_calls, region.fallback_calls) == (2, [1], 0)
    seen = []
    region.register_forward_hook(lambda m, args, out: seen.append(out.shape))     # on the region: the dispatch calls it
    with torch.no_grad():
        region(x)
    assert (region.compiled.calls, forward_calls, seen) == (3, [1, 1], [torch.Size([2, 4])])


@pytest.mark.parametrize("why", ["requires grad", "autocast", "other shape", "hook", "weights", "training"])
def test_a_call_forward_would_not_run_the_program_for_takes_forwards_checks(region, why):
    region, x, forward_calls = region
    original = region.original
    call = lambda: region(x)                                         # noqa: E731
    if why == "requires grad":
        x = x.clone().requires_grad_()
    elif why == "other shape":
        x = torch.randn(3, 4)
    elif why == "hook":
        original.register_forward_hook(lambda m, args, out: None)
    elif why == "weights":
        state = {k: v + 1 for k, v in region.state_dict().items()}
        region.load_state_dict(state)
    elif why == "training":
        region.train()
    if why == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = call()
    else:
        out = call()
    assert forward_calls == [1] and region.compiled.calls == 0
    with torch.no_grad():
        torch.testing.assert_close(out.float(), original(x).float(), rtol=2e-2, atol=2e-2)


def test_a_torch_compile_program_with_autograd_on_runs_the_original(monkeypatch):
    original, x = nn.Linear(4, 4).eval(), torch.randn(2, 4)
    program = torch.compile(nn.Linear(4, 4).eval(), backend="eager")
    region = _region(original, program, x)
    with torch.enable_grad():
        torch.testing.assert_close(region(x), original(x))
    assert region.fallback_calls == 1
    with torch.no_grad():
        torch.testing.assert_close(region(x), program(x))
    assert region.fallback_calls == 1


def test_a_region_in_training_mode_runs_the_original_module_until_eval():
    """The programs compute in eval mode: after model.train() (a loaded build the service forgot to
    leave in eval, or fine-tunes) they answered without dropout, silently."""
    torch.manual_seed(0)
    original, x = nn.Sequential(nn.Linear(4, 64), nn.Dropout(0.5)).eval(), torch.randn(2, 4)
    region = _region(original, Program(), x)
    assert not region.training                                # a build is made in eval mode
    parent = nn.Sequential(region).train()                    # model.train() reaches the region
    with torch.no_grad():
        first, second = parent(x), parent(x)
    assert not torch.equal(first, second) and region.compiled.calls == 0   # dropout, as eager in training
    assert region.fallback_calls == 2 and "training mode" in region.first_fallback
    parent.eval()
    with torch.no_grad():
        torch.testing.assert_close(parent(x), x * 2 + 1)
    assert region.compiled.calls == 1


@pytest.mark.parametrize("layout", ["transposed", "sliced", "channels_last"])
def test_a_call_in_another_layout_of_the_captured_sizes_is_copied_into_it(layout):
    """A program is built for its inputs' strides: a slice, a transpose or channels_last images of
    the captured sizes ran the original module, every call (the speedup lost to one warning)."""
    torch.manual_seed(0)
    if layout == "channels_last":
        original = nn.Conv2d(3, 4, 3).eval()
        captured = torch.randn(2, 3, 8, 8)
        x = torch.randn(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    else:
        original, captured = nn.Linear(4, 4).eval(), torch.randn(2, 4)
        x = torch.randn(4, 2).t() if layout == "transposed" else torch.randn(2, 8)[:, :4]
    assert x.shape == captured.shape and x.stride() != captured.stride()
    region = _region(original, Program(), captured)
    with torch.no_grad():
        torch.testing.assert_close(region(x), x * 2 + 1)
    assert region.compiled.calls == 1 and region.fallback_calls == 0


def test_a_layout_no_copy_reaches_runs_the_original_module():
    """Captured with strides that are neither contiguous nor channels_last (an expanded input): no
    copy makes them, and a call in another layout runs the original module, as before."""
    original, captured = nn.Linear(4, 4).eval(), torch.randn(1, 4).expand(3, 4)
    region, x = _region(original, Program(), captured), torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(region(x), original(x))
    assert region.compiled.calls == 0 and region.fallback_calls == 1
