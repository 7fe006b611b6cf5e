"""Which inputs of an exported region index a tensor, and how many rows it has along that axis.

Eager PyTorch raises ``IndexError`` for an index outside the tensor it indexes: a token id outside
its embedding table, a node id outside a graph's nodes in ``x[src]`` or ``index_add_``. The
programs do not: an exported embedding is an ONNX ``Gather``, for which ONNX Runtime reads a
negative id from the end of the table, and OpenVINO answers any id outside it with numbers
(measured: ids -1 and 12 into a 10-row table; ONNX Runtime raised only for 12). A service fed a
tokenizer's ids for another vocabulary would return wrong answers without an error. A graph
network's edge list with a node id past its nodes got numbers from OpenVINO, and from an
AOTInductor package an abort of the whole process (its index check throws inside OpenMP's
threads: ``terminate called after throwing an instance of 'c10::Error'``).

:func:`index_bounds` finds, in a region's ``.onnx``, each graph input that reaches the indices of
a ``Gather``, ``GatherElements``, ``GatherND``, ``ScatterElements`` or ``ScatterND`` through ops
that only move or reshape its values (``view``, ``unsqueeze``, ``expand``, a slice, a row picked
with a constant index, an integer cast), and the size of the indexed tensor along the indexed
axis; :func:`~.program_index_bounds.program_index_bounds` does the same in a ``torch.export`` program (an AOTInductor
package's), for ``embedding``, ``index``, ``index_select``, ``index_add``, ``index_put``,
``gather``, ``scatter`` and their kin. A loaded region (:class:`~.realized.CompiledRegion`)
checks those inputs on every call and hands a call with an index out of range to the original
module, which raises eager's own error. An input shifted by a constant of the model's on the way
(``emb(ids + field_offsets)``, as DLRM-style recommenders index one table for all their fields) is
bounded by the rows less the shift, element by element where the shift is a tensor the input's
shape broadcasts with (each field's ids by its own rows; where a reshape lies between the input
and the shift, by the rows less the largest shift). An input that reaches the indices some other way (a
product, another input added) is not checked, as before; an input whose slice alone reaches them
is checked whole, which at worst sends a call eager accepts to the original module.

A bound is *sized* where the indexed tensor is not one of the model's own (a table) but computed
from the inputs (``x[src]``): it holds for the captured sizes only. The same analysis of the
region's program for other sizes names the input size it follows there (``x``'s rows), and that
program checks it against the call's own (:mod:`.other_shapes`); a region where it follows no
input's size gets no such program.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

#: ops whose output holds only values of their first input (moved, repeated, reshaped or a subset)
_PASS_VALUES = {"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Transpose", "Slice", "Cast"}
INTEGER_TYPES = {6, 7}     # onnx.TensorProto.INT32, INT64: the index types of Gather
#: the unsigned view of each index dtype: a negative id reads as a huge one, so one max() checks both ends
_UNSIGNED = {np.dtype(np.int64): np.uint64, np.dtype(np.int32): np.uint32}
INDEX_DTYPES = (torch.int64, torch.int32)


#: an input's bound: its ids must be >= 0 and below it; a number, or an integer array the input
#: broadcasts with, element by element (each field of a DLRM's ids has its own rows)
Limit = int | np.ndarray


class IndexBounds(NamedTuple):
    """input position (among the region's tensor inputs, the order of its tensor leaves) -> the
    :data:`Limit` of its ids (the rows of the smallest tensor it indexes); the positions whose bound is sized (see above); and
    the positions whose values reach an index through arithmetic no bound follows (``ids * 2``,
    ``ids - 1``, another input added), found in ``torch.export`` programs only: an AOTInductor or
    torch.compile program of such a region aborts the process on a value out of range, so
    :func:`~.apply.realize` refuses to build one (:func:`~.program_index_bounds.unchecked_reason`). Not recorded: a
    build holds no such region."""

    rows: dict[int, Limit]
    sized: frozenset[int] = frozenset()
    unchecked: frozenset[int] = frozenset()
    #: in a program for other sizes: position -> the sizes (an ONNX ``dim_param``, a torch.export
    #: symbol or expression, less a shift) of the tensors it indexes along the indexed axis, where
    #: they are not numbers; checkable where each is the name of an input's dimension (see
    #: :func:`~.other_shapes.build_other_shapes`)
    named: dict[int, frozenset[str]] = {}

    def to_record(self) -> dict[str, Any]:
        """The JSON record of these bounds (plan.json's choice, a cached package's): nothing
        when there are none."""
        if not self.rows:
            return {}
        record: dict[str, Any] = {"index_bounds": {str(i): n if isinstance(n, int) else n.tolist()
                                                   for i, n in sorted(self.rows.items())}}
        if self.sized:
            record["sized_index_inputs"] = sorted(self.sized)
        return record

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> IndexBounds | None:
        """The bounds :meth:`to_record` wrote, None for its empty record; ValueError for a record
        that is not such (positions and sizes that are not whole numbers, a sized position
        without a bound)."""
        doc, sized = record.get("index_bounds"), record.get("sized_index_inputs", [])
        if doc is None:
            return None
        try:
            rows = {int(i): n if isinstance(n, int) and not isinstance(n, bool) else _array(n) for i, n in doc.items()}
            positions = frozenset(int(i) for i in sized)
        except (AttributeError, TypeError, ValueError):
            rows, positions = {}, frozenset()
        if not rows or any(i < 0 or np.min(n) < 1 for i, n in rows.items()) or not positions <= set(rows):
            raise ValueError(f"index_bounds {doc!r} (sized: {sized!r}) is not a map of input positions to the "
                             "sizes they index")
        return cls(rows, positions)


def _array(values: Any) -> np.ndarray:
    """A recorded element-wise limit: a nested list of whole numbers, at least one dimension."""
    if not isinstance(values, list):
        raise ValueError(values)
    array = np.asarray(values)
    if array.ndim < 1 or array.size == 0 or array.dtype.kind != "i":
        raise ValueError(values)
    return array.astype(np.int64)


def describe(limit: Limit) -> str:
    """A limit as the error message names it."""
    return f"0-{limit - 1}" if isinstance(limit, int) else f"0 and one less than {limit.tolist()}, element by element"


#: ONNX ops whose second input indexes their first: op -> its default axis (None: the leading axes
#: of the data, as many as the indices' last dimension: GatherND, ScatterND)
_ONNX_INDEXING = {"Gather": 0, "GatherElements": 0, "ScatterElements": 0, "GatherND": None, "ScatterND": None}


def index_bounds(onnx_path: str | Path) -> IndexBounds:
    """The :class:`IndexBounds` of the region exported to ``onnx_path``."""
    import onnx

    return onnx_index_bounds(with_shapes(onnx.load(str(onnx_path), load_external_data=False)))[0]


def with_shapes(model: Any) -> Any:
    """``model`` with the shapes and types of its intermediate values inferred, where ONNX can."""
    import onnx

    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception:             # shapes of intermediates unknown: inputs' and tables' only
        return model


def onnx_index_bounds(model: Any) -> tuple[IndexBounds, list[Any]]:
    """The :class:`IndexBounds` of an ONNX region (its intermediate shapes inferred: :func:`with_shapes`),
    and its indexing nodes whose indices they do not bound (computed from the inputs by other
    arithmetic, or from no input at all: see :mod:`.onnx_index_checks`)."""
    graph = model.graph
    graphs = all_graphs(graph)
    nodes = all_nodes(graph)
    tables = {i.name: list(i.dims) for g in graphs for i in g.initializer}
    constant_values = {i.name: i for g in graphs for i in g.initializer}
    producer = {}
    for node in nodes:
        if node.op_type == "Constant":
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                tables[node.output[0]] = list(value.dims)
                constant_values[node.output[0]] = value
        for out in node.output:
            producer[out] = node
    positions = {i.name: n for n, i in enumerate(x for x in graph.input if x.name not in tables)}
    integer = {i.name for i in graph.input if i.type.tensor_type.elem_type in INTEGER_TYPES}
    shapes = {v.name: value_dims(v) for g in graphs for v in [*g.input, *g.value_info]}
    rows: dict[int, Limit] = {}
    sized: set[int] = set()
    named: dict[int, set[str]] = {}
    unbounded = []
    for node in nodes:
        if node.op_type not in _ONNX_INDEXING or len(node.input) < 2:
            continue
        data = node.input[0]
        dims = tables.get(data) or shapes.get(data)
        if not dims:
            unbounded.append(node)
            continue
        if _ONNX_INDEXING[node.op_type] is None:          # ND: the indices' last dimension names the axes
            leading = (shapes.get(node.input[1]) or [0])[-1]
            if not isinstance(leading, int) or not 0 < leading <= len(dims):
                unbounded.append(node)
                continue
            axes = set(dims[:leading])
            # one bound for every axis: at worst eager answers a good call
            size = min(axes) if all(isinstance(d, int) for d in axes) else next(iter(axes)) if len(axes) == 1 else None
        else:
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            size = dims[axis] if -len(dims) <= axis < len(dims) else None
        source, shift = _source(node.input[1], producer, constant_values)
        if size is None or source not in positions or source not in integer:
            unbounded.append(node)
        elif isinstance(size, str):            # a size of a program for other sizes
            named.setdefault(positions[source], set()).add(less_shift(size, shift))
            sized.add(positions[source])
        elif not bound_by(rows, positions[source], int(size), shift):
            unbounded.append(node)
        elif data not in tables:
            sized.add(positions[source])
    return IndexBounds(rows, frozenset(sized), named={p: frozenset(n) for p, n in named.items()}), unbounded


def subgraphs(node: Any) -> list[Any]:
    """The graphs a control-flow node runs (an ``If``'s branches, a ``Loop``'s or ``Scan``'s body)."""
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def all_graphs(graph: Any) -> list[Any]:
    """``graph`` and the subgraphs of its control-flow nodes, recursively."""
    return [graph, *(g for node in graph.node for sub in subgraphs(node) for g in all_graphs(sub))]


def all_nodes(graph: Any) -> list[Any]:
    """The nodes of ``graph``, each control-flow node after the nodes of its subgraphs (recursively):
    an order in which every value a node reads is made before it. An ``If``'s branches read the
    values around them by name (ONNX names each value once in a model), so an index inside a branch
    is bounded, or left unbounded, like one outside; a ``Loop``'s or ``Scan``'s body reads its
    iterations' values as its own inputs, which no input's bound follows."""
    return [n for node in graph.node for n in (*(m for sub in subgraphs(node) for m in all_nodes(sub)), node)]


def less_shift(size: str, shift: np.ndarray) -> str:
    """The name of a named size less a shift (one no input's dimension has)."""
    return f"{size} - {shift.tolist()}" if shift.any() else size


def value_dims(value: Any) -> list[int | str] | None:
    """A value's dims, each a number or the name of a size (``dim_param``); None where any is
    unknown."""
    dims = value.type.tensor_type.shape.dim if value.type.HasField("tensor_type") else []
    if not dims or any(not d.HasField("dim_value") and not d.dim_param for d in dims):
        return None
    return [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]


def bound_by(rows: dict[int, Limit], position: int, size: int, shift: np.ndarray) -> bool:
    """Bound ``position`` by ``size`` less ``shift`` (and by what bounds it already); False where
    some element of that limit is below 1 (no id there is valid: left unchecked)."""
    limit = size - shift
    if limit.min() < 1:
        return False
    new: Limit = int(limit.max()) if limit.min() == limit.max() else limit
    old = rows.get(position)
    if old is None:
        rows[position] = new
    elif isinstance(old, int) and isinstance(new, int):
        rows[position] = min(old, new)
    else:
        try:
            rows[position] = np.minimum(old, new)
        except ValueError:            # shapes that do not broadcast together: the smallest bounds all
            rows[position] = int(min(np.min(old), np.min(new)))
    return True


#: ops on the way from an input to its index that keep each element where it was (a shift of
#: elements found past any other stays element by element; past one of these, it is its largest)
_ONNX_IN_PLACE = {"Identity", "Cast"}


def _source(name: str, producer: dict[str, Any], constants: dict[str, Any]) -> tuple[str, np.ndarray]:
    """The tensor ``name`` takes its values from, through ops that only move them (a ``Gather``
    with constant indices picks some of its data's values: ``edge_index[0]``), and the constants
    added to them on the way (``Add``s of constants with no negative value, see :func:`_bound`)."""
    shift = np.zeros((), np.int64)
    for _ in range(64):
        node = producer.get(name)
        if node is None or not node.input:
            return name, shift
        if node.op_type == "Add" and len(node.input) == 2:
            added = _onnx_shift(node.input, constants)
            if added is None:
                return name, shift
            shift, name = add_shift(shift, added[0]), added[1]
            continue
        if node.op_type == "Gather" and len(node.input) > 1 and node.input[1] in constants:
            name, shift = node.input[0], largest_shift(shift)
            continue
        if node.op_type not in _PASS_VALUES:
            return name, shift
        if node.op_type == "Cast" and next((a.i for a in node.attribute if a.name == "to"), 0) not in INTEGER_TYPES:
            return name, shift
        name, shift = node.input[0], shift if node.op_type in _ONNX_IN_PLACE else largest_shift(shift)
    return name, shift


def add_shift(shift: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A shift and the values added to it on the way (their largest sum where they do not broadcast)."""
    try:
        return shift + values
    except ValueError:
        return np.asarray(shift.max() + values.max())


def largest_shift(shift: np.ndarray) -> np.ndarray:
    """A shift past an op that moves elements: its largest element, for every element."""
    return shift if shift.ndim == 0 else np.asarray(shift.max())


def _onnx_shift(operands: Any, constants: dict[str, Any]) -> tuple[np.ndarray, str] | None:
    """(the values, the other operand) of an ``Add`` of an integer constant with no negative
    value, or None."""
    from onnx import numpy_helper

    for k in (0, 1):
        const, other = operands[k], operands[1 - k]
        if const in constants and other not in constants and constants[const].data_type in INTEGER_TYPES:
            values = numpy_helper.to_array(constants[const]).astype(np.int64)
            if values.size and values.min() >= 0:
                return values, other
    return None


def array_checks(spec: list[tuple[Any, ...]],
                 bounds: dict[int, Limit]) -> tuple[tuple[int, Any, int, np.ndarray | None], ...] | None:
    """(input position, the unsigned NumPy dtype to view it as, rows, the element-wise limit in
    that dtype or None) of each id input among a region's captured positional tensors (``spec``:
    (shape, dtype, ...) per input; a shape may be free, a list: :func:`~.lean_call.python_lean_arrays`): what the lean and direct calls of
    :class:`~.realized.CompiledRegion` check on the NumPy arrays, in three C calls (``view``,
    ``argmax``, ``item``; an element-wise limit: ``view``, ``>=``, ``argmax``, ``item``). Between a runtime's
    inferences every Python-level call runs on cold caches: on the decoder's 32 ids
    :func:`out_of_range` through the region's method cost 3-4% of its 0.55 ms OpenVINO call,
    measured in one process, interleaved. None where an element-wise limit does not broadcast to
    its input's captured shape (those calls always run the original module)."""
    checks = []
    for i, rows in sorted(bounds.items()):
        if i >= len(spec) or spec[i][1] not in INDEX_DTYPES \
                or math.prod(d for d in spec[i][0] if type(d) is int) == 0:     # a free size is 1 or more
            continue
        unsigned = _UNSIGNED[np.dtype(torch.empty((), dtype=spec[i][1]).numpy().dtype)]
        if isinstance(rows, int):
            checks.append((i, unsigned, rows, None))
            continue
        if type(spec[i][0]) is list:         # a free shape: an element-wise limit holds at the captured one only
            return None
        shape = tuple(spec[i][0])
        try:
            if np.broadcast_shapes(shape, rows.shape) != shape:
                return None
        except ValueError:
            return None
        # at the input's own shape: a comparison without broadcasting (4.3 against 6 µs a call,
        # measured after a DLRM's AOTInductor run, where the scalar check took 3.4)
        checks.append((i, unsigned, 0, np.ascontiguousarray(np.broadcast_to(rows, shape)).astype(unsigned)))
    return tuple(checks)


def out_of_range(t: torch.Tensor, rows: Limit) -> bool:
    """Whether ``t`` holds an id outside ``0 <= id < rows``. A CPU tensor: the largest entry of its
    unsigned view, found with ``argmax`` (a C method; ``max()`` goes through the ufunc machinery,
    which cost 3x more per call between a runtime's inferences, measured on the decoder's 32 ids:
    +9 µs over no check, against +28 µs for ``np.maximum.reduce`` and +53 µs for ``max()``)."""
    if t.dtype not in INDEX_DTYPES or t.numel() == 0:
        return False
    if t.is_cpu and not t.requires_grad:
        a = t.numpy()
        u = a.view(_UNSIGNED[a.dtype])
        if isinstance(rows, int):
            return u.item(u.argmax()) >= rows
        try:                                 # element by element (a shape it does not broadcast with: out)
            return bool((u >= rows.astype(u.dtype)).any())
        except ValueError:
            return True
    if not isinstance(rows, int):
        try:
            return bool((t < 0).any() or (t >= torch.as_tensor(rows, device=t.device)).any())
        except RuntimeError:
            return True
    lo, hi = torch.aminmax(t)
    return bool(lo < 0 or hi >= rows)
