"""What a built region's lean call checks before it hands a call's tensors to its runtime.

:meth:`~.realized.CompiledRegion.__call__` takes the lean call for a call that fits what the region
was captured with, position by position: a tensor of the captured shape and dtype, contiguous, that
NumPy can view (in CPU memory, no autograd), a None captured as None, a value (a number, string or
bool) equal to the captured one, which the program holds; and every id input below the rows it
indexes (:func:`~.index_bounds.array_checks`). :func:`lean_arrays` answers with the arrays to hand
the runtime, or None: the region's checked path then runs the call, and raises what eager raises.
A region captured with dicts, lists or tuples of tensors among its arguments (a recommender's
feature dict) takes the lean call too, on the tensors :func:`flat_leaves` takes out of them.

A size that is not an int is a mismatch too: torch.jit's tracer hands sizes out as tensors
(``THPSize_NewFromSymSizes``), and a traced call must be recorded through nn.Module's dispatch, not
run. A region whose tensors have no dimension cannot tell, and asks the tracer
(:meth:`~.realized.CompiledRegion.__call__`).

``lean_arrays`` is the C version (``_leancall.c``, built at install like the region accelerator)
where it was built and ``CUVIL_PGC_PURE_PYTHON`` is unset, else :func:`python_lean_arrays`: between
a runtime's inferences every line of Python runs on cold caches, and in one process, interleaved,
the zoo's tiny BERT (one id input, OpenVINO) paid 17-21 µs of its 0.28 ms call for these checks in
Python, 2-6 µs in C.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

#: in the checks, a position captured as a value (:data:`~.call_binding.CAPTURED_VALUES`): (VALUE, value)
VALUE = object()


def python_lean_arrays(positional: Sequence[Any], checks: Sequence[tuple[Any, Any]], ids: Sequence[tuple[Any, ...]],
                       tensor_type: type, marker: object) -> list[Any] | None:
    """The NumPy arrays of ``positional``'s tensors where the call fits ``checks`` ((shape, dtype)
    per position; (None, None): captured as None; (``marker``, value): captured as that value) and
    every id of ``ids`` ((input among the tensors, unsigned dtype, rows, element-wise limit or None)
    per id input) is in range; else None."""
    if len(positional) != len(checks):
        return None
    arrays = []
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
        if size and type(size[0]) is not int or size != shape or a.dtype is not dtype or not a.is_contiguous():
            return None
        try:                            # refuses a tensor that needs grad or is not in CPU memory
            arrays.append(a.numpy())
        except Exception:
            return None
    for i, unsigned, rows, limit in ids:
        u = arrays[i].view(unsigned)
        if u.item(u.argmax()) >= rows if limit is None else (b := u >= limit).item(b.argmax()):
            return None
    return arrays


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

LeanArrays = Callable[[Sequence[Any], Sequence[tuple[Any, Any]], Sequence[tuple[Any, ...]], type, object],
                      "list[Any] | None"]

lean_arrays: LeanArrays
try:
    if os.environ.get("CUVIL_PGC_PURE_PYTHON"):
        raise ImportError("CUVIL_PGC_PURE_PYTHON is set")
    from cuvil_pgc.recompile._leancall import lean_arrays
    ACCELERATED = True
except ImportError:
    lean_arrays = python_lean_arrays
    ACCELERATED = False
