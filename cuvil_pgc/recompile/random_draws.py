"""Which modules of a model draw random numbers, and the generators' state to hold while searching.

A forward that draws from torch's random generators (a VAE's sampled latent, a TTS model's noise,
dropout left on) returns other outputs on every call, and no program draws what eager draws. Where
the draws happen outside the modules that carry the work (the latent sampled between an encoder and
a decoder), those modules can still have programs: :func:`drawing_modules` names the modules whose
calls draw (every module whose call an operator tagged ``nondeterministic_seeded`` runs inside), which
recompile keeps eager, and :func:`generator_state` / :func:`put_back_generators` let the search start
each of its calls of the model from the same generator state, so that eager's draws repeat and the
accuracy guard compares calls that drew alike.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: (the CPU generator's state, each CUDA device's, or None where CUDA is not in use)
GeneratorState = tuple[torch.Tensor, list[torch.Tensor] | None]


def generator_state() -> GeneratorState:
    """The state of torch's default generators (CUDA's only where this process has started CUDA)."""
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    return torch.get_rng_state(), cuda


def put_back_generators(state: GeneratorState) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


class _Draws(TorchDispatchMode):
    """Records the modules being called when an operator that draws random numbers runs."""

    def __init__(self, calling: list[str], drawing: set[str]) -> None:
        super().__init__()
        self.calling, self.drawing = calling, drawing

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if torch.Tag.nondeterministic_seeded in getattr(func, "tags", ()):
            self.drawing.update(self.calling)
        return func(*args, **(kwargs or {}))


def drawing_modules(model: torch.nn.Module, call: Any) -> frozenset[str]:
    """The qualified names (``""`` the model) of the modules inside whose calls a random number is
    drawn during ``call()`` (one call of the model, no autograd): the module that draws and each one
    that calls it."""
    calling: list[str] = []
    drawing: set[str] = set()

    def leave(*_: Any) -> None:           # (a forward hook's result would replace the output)
        calling.pop()

    handles = []
    for qualname, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(lambda *_, q=qualname: calling.append(q)))
        handles.append(module.register_forward_hook(leave, always_call=True))
    try:
        with torch.no_grad(), _Draws(calling, drawing):
            call()
    finally:
        for handle in handles:
            handle.remove()
    return frozenset(drawing)
