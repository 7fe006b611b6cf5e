"""Refuse, before searching, a model whose call changes state that outlives the call.

A build runs a program captured from one call: ONNX Runtime, OpenVINO and AOTInductor programs
return outputs and change nothing else, and the accuracy guard compares each candidate's outputs
with eager's on the same inputs. A forward that changes one of its buffers in place (a running
sum, a step counter, a cache written into a buffer) or one of its inputs breaks both: the search's
hundreds of calls advanced the user's buffer and example inputs (an input doubled in place each
call reached inf), every candidate then failed the guard against references computed in an
earlier state, and the user read "fails the accuracy guard ... off by up to nan".

:func:`check_stateless` calls the model twice, puts back what the calls changed, and raises a
:class:`~cuvil_pgc.errors.RecompileError` naming the buffer or input and the fix. Parameters are
not snapshotted: copying a large model's weights would double its memory, and a forward that
rewrites its own weights is rare enough to be left to the guard.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil_pgc.errors import RecompileError


def check_stateless(model: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
    """Call ``model`` twice on ``inputs`` (no autograd): if the second call changes a buffer or an
    input tensor (the first may build a cache lazily, as eager's first call does), put back what
    both calls changed and raise :class:`RecompileError` naming them."""
    original = _tracked(model, inputs)
    at_start = _values(original)
    _call(model, inputs)
    settled = _values(_tracked(model, inputs))
    _call(model, inputs)
    now = _tracked(model, inputs)
    changed = [key for key, t in now.items() if key not in settled or not _same(t, settled[key])]
    if not changed:
        return
    with torch.no_grad():              # the user's buffers and example inputs as they were
        for key, t in original.items():
            t.copy_(at_start[key])
            if key.startswith("buffer "):
                owner, _, attr = key.removeprefix("buffer ").rpartition(".")
                setattr(model.get_submodule(owner), attr, t)      # (a forward may have assigned a new one)
    raise RecompileError(
        f"the model's forward changes {', '.join(changed[:4])}{' and more' if len(changed) > 4 else ''} on every "
        "call; a build runs a program captured from one call, which changes nothing but its outputs, so it "
        "cannot reproduce that state (recompile put back what its two calls to check this changed)",
        fix="recompile a submodule whose forward leaves its buffers and inputs as it found them, or move the "
            "state out of the forward (clone an input before changing it; keep counters and caches outside the "
            "model)")


def _tracked(model: torch.nn.Module, inputs: tuple[Any, ...]) -> dict[str, torch.Tensor]:
    """The tensors a call could change for the next one, keyed ``buffer NAME`` and ``input I``."""
    out = {f"buffer {name}": b for name, b in model.named_buffers()}
    out.update({f"input {i}": t for i, t in enumerate(pytree.tree_leaves(inputs)) if isinstance(t, torch.Tensor)})
    return out


def _values(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: t.detach().clone() for key, t in tensors.items()}


def _call(model: torch.nn.Module, inputs: tuple[Any, ...]) -> None:
    with torch.no_grad():
        model(*inputs)


def _same(now: torch.Tensor, before: torch.Tensor) -> bool:
    """Bit-for-bit the same values (NaN where NaN was: an untouched buffer of NaNs is unchanged)."""
    if now.shape != before.shape or now.dtype != before.dtype:
        return False
    if torch.equal(now, before):
        return True
    if now.is_floating_point() or now.is_complex():
        return bool(((now == before) | (now.isnan() & before.isnan())).all())
    return False
