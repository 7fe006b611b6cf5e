"""The Python values in a region's output, which an exported graph cannot compute.

An ONNX, OpenVINO or TensorRT graph returns tensors only, as does an AOTInductor package of a
region's output tensors (:mod:`.aoti_outputs`). The runner puts every other leaf of the
original output back as a constant: the value the example call returned (see
:class:`~.output_template.OutputTemplate`). That is right for what the export fixes anyway (None,
a shape, a flag from the module's configuration) and wrong for a value computed from the inputs'
values (``probs.max().item()``, ``bool(x.sum() > 0)``): the build would return the example's
value for every input. An object holding tensors that :mod:`.object_outputs` opens (a Hugging Face
cache) is rebuilt around the runtime's tensors; the rest of it must stay the same.

:func:`check_constant_outputs` tells the two apart by calling the region again with other values
of the same shapes and dtypes. A value that changes, or a call that cannot run, rejects the
region's runtime (and such AOTInductor) builds with an :class:`~.export_error.ExportError` naming the output.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cuvil_pgc.recompile.object_outputs import (
    MAX_DEPTH,
    ObjectLeaf,
    holds_tensors,
    is_output_leaf,
    same_value,
)


def check_constant_outputs(prepared: nn.Module, inputs: Any, reference: Any, exporter: str) -> None:
    """Raise ExportError (``<exporter> failed: ...``) when a non-tensor, non-None leaf of
    ``reference`` (``prepared``'s output for ``inputs``, a :class:`~.apply.ScopeInputs`) changes
    when the inputs' values change."""
    from cuvil_pgc.recompile.export_error import ExportError

    leaves = pytree.tree_flatten_with_path(reference, is_leaf=is_output_leaf)[0]
    values = [(path, v) for path, v in leaves if not isinstance(v, torch.Tensor) and v is not None]
    if not values:
        return
    try:
        with torch.no_grad():
            other = prepared(*other_values(inputs.args), **other_values(inputs.kwargs))
    except Exception as exc:
        raise ExportError(f"{exporter} failed: the region returns Python values besides tensors "
                          f"({_name(values[0][0])}: {type(values[0][1]).__name__}), which an exported graph "
                          f"cannot compute, and they could not be checked with other input values "
                          f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from exc
    found = dict(pytree.tree_flatten_with_path(other, is_leaf=is_output_leaf)[0])
    for path, value in values:
        if (opened := ObjectLeaf.of(value)) is not None:        # a cache: its tensors are outputs
            if path not in found or not opened.same_shape(ObjectLeaf.of(found[path])):
                raise ExportError(f"{exporter} failed: {_name(path)} is a {type(value).__name__} holding tensors "
                                  "whose other contents change with the input values (its structure, or a value "
                                  "besides the tensors), which an exported graph cannot return (return the tensors "
                                  "alone)")
        elif holds_tensors(value):
            raise ExportError(f"{exporter} failed: {_name(path)} is a {type(value).__name__} holding tensors that "
                              "neither torch's pytree nor cuvil-pgc opens (slots, a cycle, or deeper than "
                              f"{MAX_DEPTH} levels), so an exported graph cannot return them in it (register "
                              "the class with torch.utils._pytree.register_dataclass, or return a tuple or dict; for a "
                              "Hugging Face decoder's cache: use_cache=False)")
        elif path not in found or not same_value(found[path], value):
            seen = f"{_short(value)}, then {_short(found[path])}" if path in found else "then missing"
            raise ExportError(f"{exporter} failed: {_name(path)} is a {type(value).__name__} that changes with the "
                              f"input values ({seen}); an exported graph returns tensors only and would return the "
                              "example's (return it as a tensor, or leave it out: use_cache=False for a Hugging "
                              "Face decoder)")


def other_values(tree: Any) -> Any:
    """``tree`` with each tensor's values changed, shapes, dtypes and devices kept: floating
    tensors scaled and shifted by seeded noise, other tensors (token ids, masks) rolled along
    their last dimension, so every value stays one the caller passed (a valid index)."""
    generator = torch.Generator().manual_seed(0)

    def change(t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.numel() == 0:
            return t
        if t.is_floating_point():
            noise = torch.rand(t.shape, generator=generator).to(t.device, t.dtype)
            return t.detach() * (0.5 + noise) + (noise - 0.5) * 0.1
        return torch.roll(t.detach(), 1, -1) if t.dim() else t

    return pytree.tree_map(change, tree)


def _name(path: tuple[Any, ...]) -> str:
    return "output" + pytree.keystr(path)


def _short(value: Any) -> str:
    """A number, flag or short string as itself; an object by its type (its repr may look the same)."""
    if isinstance(value, (bool, int, float, complex, str)):
        text = repr(value)
        return text if len(text) <= 40 else text[:37] + "..."
    return f"a new {type(value).__name__}"
