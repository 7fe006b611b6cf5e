"""A built region's lean call: its runtime's array call, taken before nn.Module's dispatch.

:meth:`~.realized.CompiledRegion.__call__` hands a call to :func:`lean_call` where the region has
one (a runtime region on CPU tensors: :meth:`~.runtime_region.RuntimeRunner.lean_parts`). It runs
the runtime where nothing hooks into the region (torch's hook-handle counter has not moved since
the region last found none), the region is in eval mode, autocast is off, and the call fits what
the region was captured with, position by position: a tensor of the captured shape and dtype,
contiguous, that NumPy can view (in CPU memory, no autograd), a None captured as None, a value (a
number, string or bool) equal to the captured one, which the program holds; and every id input
below the rows it indexes (:func:`~.index_bounds.array_checks`). It answers with the region's
output, rebuilt in the structure the original returned, or :data:`MISFIT`: the region's checked
path then runs the call, and raises what eager raises. A region captured with dicts, lists or
tuples of tensors among its arguments (a recommender's feature dict) takes the lean call too, on
the tensors :func:`flat_leaves` takes out of them.

A size that is not an int is a misfit too: torch.jit's tracer hands sizes out as tensors
(``THPSize_NewFromSymSizes``), and a traced call must be recorded through nn.Module's dispatch, not
run. A region whose tensors have no dimension cannot tell, and asks the tracer.

``lean_call`` is the C version (``_leancall.c``, built at install like the region accelerator)
where it was built and ``CUVIL_PGC_PURE_PYTHON`` is unset, else :func:`python_lean_call`, the
reference the tests hold the C one to: between a runtime's inferences every line of Python runs on
cold caches. In one process, interleaved, the zoo's tiny BERT (one id input, OpenVINO) paid 17-21 µs
of its 0.28 ms call for the checks in Python, 2-6 µs in C; a 2-layer Hugging Face BERT on OpenVINO
paid another 6 µs of its 0.37 ms call for the gate around them in Python and 6 µs for the
ModelOutput it returns (:func:`~.hf_outputs.model_output`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from cuvil_pgc.recompile.hf_outputs import model_output

#: in the checks, a position captured as a value (:data:`~.call_binding.CAPTURED_VALUES`): (VALUE, value)
VALUE = object()
#: :func:`lean_call`'s answer to a call that does not fit: the region's checked path runs it
MISFIT = object()
#: whether torch.jit.trace is tracing (``torch._C._is_tracing``, what ``torch.jit.is_tracing`` asks;
#: ``_get_tracing_state`` returns the state, which pybind11 converts: 1 µs more between a runtime's
#: inferences, measured on the zoo's tiny BERT on OpenVINO)
is_tracing = getattr(torch._C, "_is_tracing", None) or (lambda: torch._C._get_tracing_state() is not None)
#: whether autocast is on for any device: a build computes in the precision it was built with, so
#: calls under autocast (whose outputs eager returns in bf16 or fp16) run the original module
autocast_enabled = getattr(torch._C, "_is_any_autocast_enabled", None) or (lambda: torch.is_autocast_enabled("cpu"))

#: (input count, checks per input, the runtime's array call, whether the output is its one tensor,
#: the output's build (a callable of the outputs, or a :func:`~.hf_outputs.model_output` recipe),
#: id checks, whether a traced call shows in the sizes, the arguments' nesting or None)
Lean = tuple[int, list[tuple[Any, Any]], Callable[[list[Any]], list[Any]], bool, Any,
             tuple[tuple[Any, ...], ...], bool, "tuple[Any, ...] | None"]


def python_lean_call(region: Any, lean: Lean, positional: Sequence[Any]) -> Any:
    """``region``'s output for the call of ``positional`` through its lean call ``lean``, or
    :data:`MISFIT` (see the module docstring). ``region`` is a
    :class:`~.realized.CompiledRegion`: its ``_quiet_at``, ``_quiet()`` and ``training``."""
    if RemovableHandle.next_id != region._quiet_at and not region._quiet() or region.training or autocast_enabled():
        return MISFIT
    count, checks, run, single, build, ids, sized, layout = lean
    if len(positional) != count:
        return MISFIT
    leaves = positional if layout is None else flat_leaves(positional, layout)
    # a call torch.jit traces shows it in its sizes; one without them asks
    if leaves is None or not sized and is_tracing() \
            or (arrays := python_lean_arrays(leaves, checks, ids, _Tensor, VALUE)) is None:
        return MISFIT
    outputs = run(arrays)
    return outputs[0] if single else model_output(build, outputs) if type(build) is tuple else build(outputs)


def python_keyword_positions(args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...],
                             fills: tuple[Any, ...], extras: dict[str, Any]) -> tuple[Any, ...] | None:
    """A keyword call (``model(input_ids=ids, attention_mask=mask)``, how services call Hugging
    Face models) as the positional call a lean call takes, without
    :func:`~.call_binding.bind_call`'s walk of the forward's parameters: ``names`` are the captured
    positions' parameter names, ``fills`` what a position the call leaves out takes (:data:`MISFIT`:
    it may not be left out), ``extras`` the keywords past them the region has seen bind (at the
    value given: ``return_dict=True``). None where the call does not bind so; the region then binds
    it the long way, and learns its extras. Measured in one process, interleaved, on a 2-layer BERT
    on OpenVINO: the long way cost 28 µs of a 0.39 ms call."""
    n = len(args)
    if n > len(names):
        return None
    positional, taken = list(args), 0
    for name, fill in zip(names[n:], fills[n:], strict=True):
        if name in kwargs:
            positional.append(kwargs[name])
            taken += 1
        elif fill is MISFIT:
            return None
        else:
            positional.append(fill)
    if taken != len(kwargs):
        named = names[n:]
        for name, value in kwargs.items():
            if name not in named and (name not in extras or type(value) is not type(seen := extras[name])
                                      or not (value is seen or value == seen)):
                return None
    return tuple(positional)


def python_lean_arrays(positional: Sequence[Any], checks: Sequence[tuple[Any, Any]], ids: Sequence[tuple[Any, ...]],
                       tensor_type: type, marker: object) -> list[Any] | None:
    """The NumPy arrays of ``positional``'s tensors where the call fits ``checks`` ((shape, dtype)
    per position, the shape a tuple or a free shape, a list: see :func:`_fits_free`; (None, None):
    captured as None; (``marker``, value): captured as that value) and
    every id of ``ids`` ((input among the tensors, unsigned dtype, rows, element-wise limit or None)
    per id input) is in range; else None."""
    if len(positional) != len(checks):
        return None
    arrays, named = [], {}
    for a, (shape, dtype) in zip(positional, checks, strict=True):
        if shape is None:
            if a is not None:
                return None
            continue
        if shape is marker:
            if type(a) is not type(dtype) or a != dtype:
                return None
            continue
        if type(a) is not tensor_type:
            return None
        size = a.shape
        if type(shape) is list:
            if not _fits_free(size, shape, named):
                return None
        elif size and type(size[0]) is not int or size != shape:
            return None
        if a.dtype is not dtype or not a.is_contiguous():
            return None
        try:                            # refuses a tensor that needs grad or is not in CPU memory
            arrays.append(a.numpy())
        except Exception:
            return None
    return arrays if python_ids_fit(arrays, ids) else None


#: the most named sizes a free shape may have (as ``FREE_NAMES`` in ``_leancall.c``)
FREE_NAMES = 16


def _fits_free(size: Sequence[Any], shape: list[Any], named: dict[int, int]) -> bool:
    """Whether ``size`` fits the free ``shape``: per dimension its size, or (name, smallest,
    largest), the name an index below :data:`FREE_NAMES` whose dimensions are equal in a call
    (``named``: the sizes the call's earlier dimensions set)."""
    if len(size) != len(shape):
        return False
    for n, dim in zip(size, shape, strict=True):
        if type(n) is not int:
            return False
        if type(dim) is int:
            if n != dim:
                return False
            continue
        k, lo, hi = dim
        if not (0 <= k < FREE_NAMES and lo <= n <= hi) or named.setdefault(k, n) != n:
            return False
    return True


def python_ids_fit(values: Sequence[Any], ids: Sequence[tuple[Any, ...]]) -> bool:
    """Whether every id input of ``ids`` ((position, unsigned dtype, rows, element-wise limit or
    None) each: :func:`~.index_bounds.array_checks`) among ``values`` (NumPy arrays, or tensors in
    CPU memory) is below its rows or limits: its values viewed as unsigned (a negative id is huge),
    the largest found with ``argmax`` (see :func:`~.index_bounds.out_of_range`)."""
    for i, unsigned, rows, limit in ids:
        value = values[i]
        u = (value.numpy() if type(value) is _Tensor else value).view(unsigned)
        if u.item(u.argmax()) >= rows if limit is None else (b := u >= limit).item(b.argmax()):
            return False
    return True


def leaf_positions(leaves: Sequence[Any]) -> list[tuple[Any, ...] | None]:
    """Per leaf of a call, what a lean call checks (see :meth:`~.realized.CompiledRegion._lean_call`):
    a tensor's (shape, dtype, device, strides), None, or (:data:`VALUE`, value)."""
    return [(a.shape, a.dtype, a.device, a.stride()) if type(a) is torch.Tensor else None if a is None else (VALUE, a)
            for a in leaves]


def nested_layout(args: Sequence[Any]) -> tuple[Any, ...] | None:
    """How a call's positional arguments nest their tensors, per position: None (the argument
    itself: a tensor, None or a value), ``("dict", keys)`` (a dict of tensors, keys in the order
    the export flattened them, its own), ``("list", n)`` or ``("tuple", n)`` (n tensors); None
    where an argument nests otherwise (deeper, or other than tensors inside)."""
    layout = []
    for a in args:
        if type(a) is dict:
            if not a or not all(type(v) is _Tensor for v in a.values()):
                return None
            layout.append(("dict", tuple(a)))
        elif type(a) in (list, tuple):
            if not a or not all(type(v) is _Tensor for v in a):
                return None
            layout.append((type(a).__name__, len(a)))
        else:
            layout.append(None)
    return tuple(layout)


def flat_leaves(positional: Sequence[Any], layout: tuple[Any, ...]) -> list[Any] | None:
    """``positional``'s arguments and the tensors they nest, in the order the captured call
    flattened them (a dict's by its captured keys, whatever order the call's are in); None where the
    call nests them otherwise (another container, other keys, another length)."""
    leaves = []
    for a, nest in zip(positional, layout, strict=True):
        if nest is None:
            leaves.append(a)
        elif nest[0] == "dict":
            keys = nest[1]
            if type(a) is not dict or len(a) != len(keys):
                return None
            for key in keys:
                value = a.get(key, _MISSING)
                if value is _MISSING:
                    return None
                leaves.append(value)
        else:
            if type(a).__name__ != nest[0] or type(a) not in (list, tuple) or len(a) != nest[1]:
                return None
            leaves.extend(a)
    return leaves


_MISSING = object()
_Tensor = torch.Tensor

lean_call: Callable[[Any, Lean, Sequence[Any]], Any]
ids_fit: Callable[[Sequence[Any], Sequence[tuple[Any, ...]]], bool]
keyword_positions: Callable[[tuple[Any, ...], dict[str, Any], tuple[str, ...], tuple[Any, ...], dict[str, Any]],
                            tuple[Any, ...] | None]
try:
    if os.environ.get("CUVIL_PGC_PURE_PYTHON"):
        raise ImportError("CUVIL_PGC_PURE_PYTHON is set")
    from cuvil_pgc.recompile import _leancall
    _leancall.configure(_Tensor, VALUE, MISFIT, RemovableHandle, autocast_enabled, is_tracing, flat_leaves)
    lean_call, ids_fit, keyword_positions = _leancall.lean_call, _leancall.ids_fit, _leancall.keyword_positions
    ACCELERATED = True
except ImportError:
    lean_call, ids_fit, keyword_positions = python_lean_call, python_ids_fit, python_keyword_positions
    ACCELERATED = False
