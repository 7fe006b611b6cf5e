"""Which inputs of an exported region index a table, and how many rows the table has.

Eager PyTorch raises ``IndexError`` for a token id outside its embedding table (``0 <= id < N``).
The runtimes do not: an exported embedding is an ONNX ``Gather``, for which ONNX Runtime reads a
negative id from the end of the table, and OpenVINO answers any id outside it with numbers
(measured: ids -1 and 12 into a 10-row table; ONNX Runtime raised only for 12). A service fed a
tokenizer's ids for another vocabulary would return wrong answers without an error.

:func:`index_bounds` finds, in a region's ``.onnx``, each graph input that reaches a ``Gather``
from a constant table through ops that only move or reshape its values (``view``, ``unsqueeze``,
``expand``, a slice, an integer cast), and the table's size along the gathered axis. A loaded
region (:class:`~.realized.CompiledRegion`) checks those inputs on every call and hands a call
with an id out of range to the original module, which raises eager's own error. An input that
reaches a table some other way (an offset added to it, say) is not checked, as before; an input
whose slice alone reaches the table is checked whole, which at worst sends a call eager accepts
to the original module.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

#: ops whose output holds only values of their first input (moved, repeated, reshaped or a subset)
_PASS_VALUES = {"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Transpose", "Slice", "Cast"}
_INTEGER_TYPES = {6, 7}     # onnx.TensorProto.INT32, INT64: the index types of Gather
#: the unsigned view of each index dtype: a negative id reads as a huge one, so one max() checks both ends
_UNSIGNED = {np.dtype(np.int64): np.uint64, np.dtype(np.int32): np.uint32}
_INDEX_DTYPES = (torch.int64, torch.int32)


def index_bounds(onnx_path: str | Path) -> dict[int, int]:
    """input position (among the graph's inputs that are not initializers, the order of the
    region's tensor leaves) -> the number of rows of the smallest table it indexes."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    tables = {i.name: list(i.dims) for i in graph.initializer}
    producer = {}
    for node in graph.node:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                tables[node.output[0]] = list(value.dims)
        for out in node.output:
            producer[out] = node
    positions = {i.name: n for n, i in enumerate(x for x in graph.input if x.name not in tables)}
    integer = {i.name for i in graph.input if i.type.tensor_type.elem_type in _INTEGER_TYPES}
    bounds: dict[int, int] = {}
    for node in graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[0] not in tables:
            continue
        dims = tables[node.input[0]]
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if not dims or not -len(dims) <= axis < len(dims):
            continue
        source = _source(node.input[1], producer)
        if source in positions and source in integer:
            rows = int(dims[axis])
            bounds[positions[source]] = min(rows, bounds.get(positions[source], rows))
    return bounds


def _source(name: str, producer: dict[str, Any]) -> str:
    """The tensor ``name`` takes its values from, through ops that only move them."""
    for _ in range(64):
        node = producer.get(name)
        if node is None or node.op_type not in _PASS_VALUES or not node.input:
            return name
        if node.op_type == "Cast" and next((a.i for a in node.attribute if a.name == "to"), 0) not in _INTEGER_TYPES:
            return name
        name = node.input[0]
    return name


def array_checks(spec: list[tuple[Any, ...]], bounds: dict[int, int]) -> tuple[tuple[int, Any, int], ...]:
    """(input position, the unsigned NumPy dtype to view it as, rows) of each id input among a
    region's captured positional tensors (``spec``: (shape, dtype, ...) per input): what the lean
    call of :class:`~.realized.CompiledRegion` checks on the NumPy arrays it hands the runtime, in
    three C calls (``view``, ``argmax``, ``item``). Between a runtime's inferences every Python-level
    call runs on cold caches: on the decoder's 32 ids :func:`out_of_range` through the region's
    method cost 3-4% of its 0.55 ms OpenVINO call, measured in one process, interleaved."""
    return tuple((i, _UNSIGNED[np.dtype(torch.empty((), dtype=spec[i][1]).numpy().dtype)], rows)
                 for i, rows in sorted(bounds.items())
                 if i < len(spec) and spec[i][1] in _INDEX_DTYPES and math.prod(spec[i][0]) > 0)


def out_of_range(t: torch.Tensor, rows: int) -> bool:
    """Whether ``t`` holds an id outside ``0 <= id < rows``. A CPU tensor: the largest entry of its
    unsigned view, found with ``argmax`` (a C method; ``max()`` goes through the ufunc machinery,
    which cost 3x more per call between a runtime's inferences, measured on the decoder's 32 ids:
    +9 µs over no check, against +28 µs for ``np.maximum.reduce`` and +53 µs for ``max()``)."""
    if t.dtype not in _INDEX_DTYPES or t.numel() == 0:
        return False
    if t.is_cpu and not t.requires_grad:
        a = t.numpy()
        u = a.view(_UNSIGNED[a.dtype])
        return u.item(u.argmax()) >= rows
    lo, hi = torch.aminmax(t)
    return bool(lo < 0 or hi >= rows)
