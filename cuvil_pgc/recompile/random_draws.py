"""Which modules of a model draw random numbers, and the generators' state to hold while searching.

A forward that draws from torch's random generators (a VAE's sampled latent, a TTS model's noise,
dropout left on) returns other outputs on every call, and no program draws what eager draws. Where
the draws happen outside the modules that carry the work (the latent sampled between an encoder and
a decoder), those modules can still have programs: :func:`drawing_modules` names the modules whose
calls draw (every module inside whose call an operator moves a generator's state), which recompile
keeps eager, and :func:`generator_state` / :func:`put_back_generators` let the search start
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
    """Records the modules being called when an operator draws random numbers: one tagged
    ``nondeterministic_seeded`` that moves a generator's state. The tag alone says that it may: every
    dropout and ``scaled_dot_product_attention`` carry it, and in eval mode (or at ``dropout_p=0``)
    draw nothing, which marked every attention layer of a ViTMAE as drawing."""

    def __init__(self, calling: list[str], drawing: set[str]) -> None:
        super().__init__()
        self.calling, self.drawing = calling, drawing

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if torch.Tag.nondeterministic_seeded not in getattr(func, "tags", ()):
            return func(*args, **(kwargs or {}))
        before = generator_state()
        out = func(*args, **(kwargs or {}))
        if not _same_state(before, generator_state()):
            self.drawing.update(self.calling)
        return out


def _same_state(a: GeneratorState, b: GeneratorState) -> bool:
    (cpu_a, cuda_a), (cpu_b, cuda_b) = a, b
    return torch.equal(cpu_a, cpu_b) and (cuda_a is None) == (cuda_b is None) and \
        (cuda_a is None or all(torch.equal(x, y) for x, y in zip(cuda_a, cuda_b, strict=True)))


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
