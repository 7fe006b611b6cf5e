"""Which positions of a call's outputs are padding, which the accuracy guard does not compare.

A service batches sequences of different lengths by padding them to one length, and says which
positions are real in the call's attention mask (Hugging Face's ``attention_mask``: 1 for a
token, 0 for padding). What a model computes at a padded position is never used, and is not
defined: under a causal mask, a left-padded position's query has every key masked, and eager's
softmax, ONNX Runtime's and OpenVINO's answer such a row each in their own way (an OPT with a
left-padded batch: 0.4 apart at its six padded positions, 4e-7 everywhere else). A guard that
compared them refused every program for the whole model.

:func:`padding_of` reads the masks from a call: each 2-D input bound to a parameter whose name
ends in ``attention_mask`` (``attention_mask``, ``decoder_attention_mask``), holding only 0 and 1
with at least one 0. An output laid out by batch then positions (its first dimension the mask's
batch, a later one its length: logits ``(batch, length, vocab)``, a cache's keys ``(batch, heads,
length, dim)``) is compared where every such position is real; any other output, everywhere.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

#: how the name of a parameter taking a padding mask ends
MASK_SUFFIX = "attention_mask"


@dataclass(frozen=True)
class Padding:
    """A call's attention masks: ``names`` and, per mask, ``real`` (``(batch, length)``, bool)."""

    names: tuple[str, ...]
    real: tuple[torch.Tensor, ...]

    @property
    def padded(self) -> int:
        """How many positions the masks mark as padding."""
        return sum(int((~r).sum()) for r in self.real)

    def compared(self, shape: torch.Size | tuple[int, ...]) -> torch.Tensor | None:
        """Which values of an output of ``shape`` the guard compares (bool, broadcastable to it);
        None where it compares them all (no dimension laid out as a mask's positions)."""
        keep = None
        for real in self.real:
            batch, length = real.shape
            if len(shape) < 2 or shape[0] != batch:
                continue
            for dim in range(1, len(shape)):
                if shape[dim] == length:
                    view = [1] * len(shape)
                    view[0], view[dim] = batch, length
                    here = real.reshape(view)
                    keep = here if keep is None else keep & here
        return keep

    def describe(self) -> str:
        """E.g. "the 6 positions `attention_mask` marks as padding"."""
        return (f"the {self.padded} position{'s' if self.padded != 1 else ''} "
                f"{' and '.join(f'`{n}`' for n in self.names)} mark{'s' if len(self.names) == 1 else ''} as padding")


def padding_of(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None) -> Padding | None:
    """The padding ``module``'s call with ``args``/``kwargs`` marks (see the module docstring);
    None where it marks none. A module whose forward takes tensors in place of a call (a decoding
    step's, :class:`~.cache_step.CacheStep`) names them by ``named_inputs(args)``."""
    kwargs = kwargs or {}
    named = getattr(module, "named_inputs", None)
    try:
        bound = named(args) if callable(named) and not kwargs else \
            inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):      # a signature the call does not fit: its keywords alone
        bound = kwargs
    names, real = [], []
    for name, value in bound.items():
        if name.endswith(MASK_SUFFIX) and _is_padding_mask(value):
            names.append(name)
            real.append(value.detach().cpu() != 0)
    return Padding(tuple(names), tuple(real)) if names else None


def _is_padding_mask(value: Any) -> bool:
    """A 2-D tensor of 0s and 1s with at least one 0."""
    if not isinstance(value, torch.Tensor) or value.dim() != 2 or value.is_complex() or not value.numel():
        return False
    v = value.detach()
    return bool(((v == 0) | (v == 1)).all()) and bool((v == 0).any())
