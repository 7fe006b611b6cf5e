"""Index checks inside an ONNX region's graph, for the indices no check before the call bounds.

:mod:`.index_bounds` bounds the inputs whose ids reach an index as they are (moved, or shifted by a
constant of the model's), and the region checks those inputs before each call. An index the
inputs reach through other arithmetic is out of its reach. LayoutLM embeds each box's height and
width, ``bbox[..., 3] - bbox[..., 1]``: for a box with x1 < x0 eager raises ``IndexError``, while
ONNX Runtime reads the table from its end and OpenVINO answers with numbers.

:func:`add_index_checks` adds to the graph, for each such index, eager's own test of it (the
indices a ``Gather``, ``GatherElements``, ``GatherND``, ``ScatterElements`` or ``ScatterND`` takes
are below the size of what they index along its axis, and not negative; for ``x[idx]``, which eager
reads from the end, not below minus that size), and sums them into one more graph output,
:data:`CHECK_OUTPUT`: the number of indices out of range, an int64 scalar. The check costs a
comparison per index element inside the runtime's own call, and it holds at any input size (the
sizes are the graph's own ``Shape``). A runner whose graph has that output
(:class:`~.runtime_region.RuntimeRunner`) raises :class:`IndexCheckFailed` where it is not 0, and
:class:`~.realized.CompiledRegion` then runs the original module, which raises eager's error.

Which indices: those whose values follow the values of an integer input of the region (through
any op but ``Shape`` and ``Size``, which read its shape only; through a gather's data, not its
indices), and that no check before the call bounds. Indices made from sizes (positions from a
``Range``) or from floats (an ``ArgMax``) are always in range and are left as they are.
"""

from __future__ import annotations

import re
from typing import Any

from cuvil_pgc.recompile.index_bounds import INTEGER_TYPES, all_graphs, all_nodes, subgraphs, value_dims

#: the graph output holding how many indices were out of range (0: none)
CHECK_OUTPUT = "cuvil_index_out_of_range"

#: ops whose output holds values of their data (input 0) picked by their indices (input 1): their
#: output follows an input's values only where their data does
_GATHERS = {"Gather", "GatherElements", "GatherND"}
#: ATen ops that read a negative index from the end, as ``x[idx]`` does (torch.onnx names the op
#: each node comes from in the node's metadata)
_WRAPPING_OPS = ("aten.index.", "aten.index_put", "aten._unsafe_index")
_FX_NODE = "pkg.torch.onnx.fx_node"


#: why a region whose program found an index out of range ran its original module
OUT_OF_RANGE = ("an index it computes from its inputs (a box's width, ids - 1) is outside what it indexes: the "
                "original module raises eager's error")


class UncheckableIndex(Exception):
    """The program computes an index from its inputs where no check can be added to it (inside
    control flow): the candidate is refused, with this as its reason."""


class IndexCheckFailed(IndexError):
    """A region's program found an index out of range (or its runtime failed on one): the region
    runs the original module for the call, which raises eager's error."""


def add_index_checks(model: Any, unbounded: list[Any]) -> int:
    """Add to ``model`` (an ``onnx.ModelProto`` with its shapes inferred, changed in place) the
    checks of the indices of ``unbounded`` (its indexing nodes no check before the call bounds: see
    :func:`~.index_bounds.onnx_index_bounds`) that follow the values of its integer inputs, and of
    its embedding bags' offsets (:func:`_bags`), summed into the output :data:`CHECK_OUTPUT`; how
    many it checks."""
    from onnx import TensorProto, helper

    graph = model.graph
    if any(o.name == CHECK_OUTPUT for o in graph.output):
        return 0
    graphs = all_graphs(graph)
    values = [v for g in graphs for v in (*g.input, *g.value_info, *g.output)]
    types = {v.name: v.type.tensor_type.elem_type for v in values}
    tables = {i.name for g in graphs for i in g.initializer}
    # sizes known when the program is made (a table's, or any value's in a program for fixed sizes)
    dims = {v.name: d for v in values if (d := value_dims(v)) is not None and all(type(n) is int for n in d)}
    dims.update({i.name: list(i.dims) for g in graphs for i in g.initializer})
    valued, ranges = _input_valued(graph), value_ranges(graph, dims)
    checked = [node for node in unbounded if node.input[1] in valued
               and not _in_range(ranges.get(node.input[1]), node, dims, _reads_from_end(node, tables))]
    bags = _bags(graph, valued)
    outside = {o for node in graph.node for o in node.output}
    if inside := [node for node in checked if node.output[0] not in outside]:
        raise UncheckableIndex(f"a {inside[0].op_type} inside a control-flow branch or loop body (ONNX If, Loop, "
                               "Scan) takes indices that follow an integer input's values through arithmetic; "
                               "cuvil-pgc checks such indices only outside control flow")
    nodes, counts = [], []
    for k, node in enumerate(checked):
        counts.append(f"cuvil_check_{k}_count")
        nodes += _check(node, f"cuvil_check_{k}_", _reads_from_end(node, tables), dims, types.get(node.input[1]),
                        counts[-1], helper)
    for k, (offsets, indices) in enumerate(bags):
        counts.append(f"cuvil_bag_{k}_count")
        nodes += _bag_check(offsets, indices, f"cuvil_bag_{k}_", counts[-1], helper)
    if not counts:
        return 0
    total = counts[0]
    for k, count in enumerate(counts[1:], 1):        # the last sum is the output
        nodes.append(helper.make_node("Add", [total, count], [f"cuvil_total_{k}"]))
        total = f"cuvil_total_{k}"
    nodes[-1].output[0] = CHECK_OUTPUT
    graph.node.extend(nodes)
    graph.output.append(helper.make_tensor_value_info(CHECK_OUTPUT, TensorProto.INT64, []))
    return len(counts)


#: an embedding bag's call as torch.onnx records it: its table, indices and offsets
_BAG = re.compile(r"target=torch\.ops\.aten\._?embedding_bag\.\w+\]\(args = \(%\w+, %(\w+), %(\w+)")


def _bags(graph: Any, valued: set[str]) -> list[tuple[str, str]]:
    """(offsets, indices) of each embedding bag whose offsets follow an integer input's values: eager
    refuses offsets that do not start at 0, go down, or pass the indices' end, and the exported
    program (a loop over slices of the indices) answers them with numbers (ONNX Runtime, for
    offsets 0, 3, 12 of 10 indices). Found by the ATen op torch.onnx records for its nodes."""
    names = {i.name for i in graph.input} | {o for n in graph.node for o in n.output}
    found: dict[tuple[str, str], None] = {}
    for node in all_nodes(graph):
        origin = next((p.value for p in node.metadata_props if p.key == _FX_NODE), "")
        if (match := _BAG.search(origin)) and match[2] in valued:
            if not {match[1], match[2]} <= names:
                raise UncheckableIndex("an embedding bag inside a control-flow branch or loop body (ONNX If, Loop, "
                                       "Scan) takes offsets that follow an integer input's values; cuvil-pgc checks "
                                       "them only outside control flow")
            found[match[2], match[1]] = None
    return list(found)


def _bag_check(offsets: str, indices: str, prefix: str, count: str, helper: Any) -> list[Any]:
    """The nodes counting into ``count`` eager's refusals of an embedding bag's offsets: a first one
    that is not 0, one below the one before it, a last one past the indices' end."""
    nodes: list[Any] = []

    def add(op: str, inputs: list[str], **kwargs: Any) -> str:
        out = f"{prefix}{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [out], **kwargs))
        return out

    def ints(*values: int) -> str:
        return add("Constant", [], value=helper.make_tensor(f"{prefix}c{len(nodes)}", 7, [len(values)], values))

    zero, one, minus_one, end = ints(0), ints(1), ints(-1), ints(2 ** 62)
    first, last = add("Slice", [offsets, zero, one]), add("Slice", [offsets, minus_one, end])
    bad = [add("Not", [add("Equal", [first, add("CastLike", [zero, offsets])])]),
           add("Less", [add("Slice", [offsets, one, end]), add("Slice", [offsets, zero, minus_one])]),
           add("Greater", [last, add("CastLike", [add("Size", [indices]), offsets])])]
    nodes.append(helper.make_node("ReduceSum", [add("Cast", [add("Concat", bad, axis=0)], to=7)], [count], keepdims=0))
    return nodes


def _input_valued(graph: Any) -> set[str]:
    """The values of ``graph`` (topologically ordered, as ONNX requires) that follow an integer graph
    input's values."""
    tables = {i.name for i in graph.initializer}
    valued = {i.name for i in graph.input if i.name not in tables and i.type.tensor_type.elem_type in INTEGER_TYPES}
    _follow(graph, valued)
    return valued


def _follow(graph: Any, valued: set[str]) -> None:
    """Add to ``valued`` the values of ``graph`` made from values in it. A control-flow node's
    outputs follow its inputs and what its subgraphs return; a loop body's inputs (its iterations'
    values) follow the node's inputs."""
    for node in graph.node:
        if node.op_type in ("Shape", "Size"):
            continue
        reads = node.input[:1] if node.op_type in _GATHERS else node.input
        taken = any(name in valued for name in reads)
        for sub in subgraphs(node):
            if taken:
                valued.update(i.name for i in sub.input)
            _follow(sub, valued)
            taken = taken or any(o.name in valued for o in sub.output)
        if taken:
            valued.update(node.output)


#: a value's smallest and largest element, where the program's constants and sizes alone bound them
Range = tuple[int, int]
_LARGEST = 2 ** 62           # past this, int64 arithmetic may wrap: no range
#: ops whose output holds only values of their inputs (all of them: Concat, Where's branches)
_MOVES = {"Reshape", "Unsqueeze", "Squeeze", "Flatten", "Identity", "Expand", "Transpose", "Slice", "Tile",
          "Gather", "GatherElements", "GatherND", "Concat", "Max", "Min"}
#: ONNX element types a Cast keeps a whole number below this size exactly in: int32, int64, float,
#: double, float16, bfloat16
_EXACT = {6: 2 ** 31, 7: _LARGEST, 1: 2 ** 24, 11: 2 ** 53, 10: 2 ** 11, 16: 2 ** 8}
_BOOLEANS = {"Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual", "Not", "And", "Or", "Xor", "IsNaN", "IsInf"}


def value_ranges(graph: Any, dims: dict[str, list[int]]) -> dict[str, Range]:
    """The :data:`Range` of each integer or boolean value of ``graph`` that its constants and
    static sizes bound (``dims``: the values' static dimensions), by interval arithmetic through
    the ops positions and hashes are made of: a RoBERTa's positions, ``cumsum(ids != pad) * mask
    + pad``, lie within the length plus the pad (at a fixed length: a number); a CANINE's hashed
    ids, ``(ids + 1) * prime % buckets``, within the buckets. An integer input has none."""
    from onnx import numpy_helper

    ranges: dict[str, Range] = {}
    constants: dict[str, Any] = {i.name: numpy_helper.to_array(i) for g in all_graphs(graph) for i in g.initializer}
    nodes = all_nodes(graph)
    for node in nodes:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    for name, value in constants.items():
        if value.dtype.kind in "iub" and value.size:
            ranges[name] = (int(value.min()), int(value.max()))
    for value in graph.input:            # an input's values are the caller's, a boolean's 0 or 1
        if value.type.tensor_type.elem_type == 9:
            ranges[value.name] = (0, 1)
    for node in nodes:
        found = _range_of(node, ranges, constants, dims)
        if found is not None and all(abs(v) < _LARGEST for v in found):
            ranges[node.output[0]] = found
    return ranges


def _range_of(node: Any, ranges: dict[str, Range], constants: dict[str, Any], dims: dict[str, list[int]]) -> Range | None:
    """The range of ``node``'s first output from its inputs', or None."""
    op, inputs = node.op_type, [ranges.get(name) for name in node.input if name]
    if op in _BOOLEANS:
        return 0, 1
    if op in ("Shape", "Size"):
        shape = dims.get(node.input[0])
        return None if not shape else (0, max(shape)) if op == "Shape" else (0, _product(shape))
    if op == "Range" and len(inputs) == 3 and all(inputs) and inputs[2][0] > 0:
        return inputs[0][0], inputs[1][1] - 1
    if op == "Mod" and len(inputs) == 2 and inputs[1] is not None and inputs[1][0] > 0 \
            and not any(a.name == "fmod" and a.i for a in node.attribute):
        return 0, inputs[1][1] - 1          # an integer Mod takes the divisor's sign
    data = inputs[:1] if op in ("Gather", "GatherElements", "GatherND", "Reshape", "Expand", "Tile", "Slice",
                                "Unsqueeze", "Squeeze") else inputs[1:] if op == "Where" else inputs
    if not data or any(r is None for r in data):
        return None
    if op == "Cast":
        to = next((a.i for a in node.attribute if a.name == "to"), 0)
        if to == 9:                          # to bool
            return 0, 1
        lo, hi = data[0]
        exact = _EXACT.get(to)               # past it a value would wrap (int32) or round (a float)
        return (lo, hi) if exact is not None and -exact <= lo and hi < exact else None
    if op in _MOVES or op == "Where":
        return min(r[0] for r in data), max(r[1] for r in data)
    if op in ("Add", "Sub", "Mul") and len(data) == 2:
        (a, b), (c, d) = data
        if op == "Add":
            return a + c, b + d
        if op == "Sub":
            return a - d, b - c
        products = (a * c, a * d, b * c, b * d)
        return min(products), max(products)
    if op == "Neg":
        return -data[0][1], -data[0][0]
    if op == "CumSum" and node.input[1] in constants:
        shape = dims.get(node.input[0])
        axis = int(constants[node.input[1]].reshape(-1)[0])
        if not shape or not -len(shape) <= axis < len(shape):
            return None
        n, (lo, hi) = shape[axis], data[0]
        return min(lo, n * lo, 0), max(hi, n * hi, 0)      # 0: an exclusive sum starts there
    return None


def _product(values: list[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def _in_range(found: Range | None, node: Any, dims: dict[str, list[int]], from_end: bool) -> bool:
    """Whether an index whose values lie in ``found`` is always within what ``node`` indexes."""
    shape = dims.get(node.input[0])
    if found is None or not shape:
        return False
    if node.op_type in ("GatherND", "ScatterND"):
        batch = next((a.i for a in node.attribute if a.name == "batch_dims"), 0)
        axes = shape[batch:] or [0]
        size = min(axes)
    else:
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        if not -len(shape) <= axis < len(shape):
            return False
        size = shape[axis]
    return (-size if from_end else 0) <= found[0] and found[1] < size


def _reads_from_end(node: Any, tables: set[str]) -> bool:
    """Whether eager reads a negative index of ``node`` from the end (``x[idx]``) rather than raise
    (``embedding``, ``index_select``, ``gather``, ``scatter``): from the ATen op torch.onnx recorded
    for it; without that record (the TorchScript exporter), where it indexes a value of the graph
    rather than a table of the model's."""
    origin = next((p.value for p in node.metadata_props if p.key == _FX_NODE), None)
    if origin is not None:
        return any(op in origin for op in _WRAPPING_OPS)
    return node.op_type in ("Gather", "GatherND") and node.input[0] not in tables


def _check(node: Any, prefix: str, from_end: bool, dims: dict[str, list[int]], index_type: int | None, count: str,
           helper: Any) -> list[Any]:
    """The nodes computing into ``count`` (int64) how many indices of ``node`` are out of range
    (``from_end``: where eager reads a negative index from the end): the sizes along the indexed
    axes as constants of the index's type where ``dims`` knows them, else from the graph's ``Shape``."""
    data, index = node.input[0], node.input[1]
    attrs = {a.name: a.i for a in node.attribute if a.name in ("axis", "batch_dims")}
    nodes: list[Any] = []

    def add(op: str, inputs: list[str], **kwargs: Any) -> str:
        out = f"{prefix}{len(nodes)}"
        nodes.append(helper.make_node(op, inputs, [out], **kwargs))
        return out

    def constant(values: list[int], shape: list[int]) -> str:
        typed = index_type if index_type in INTEGER_TYPES else 7
        value = add("Constant", [], value=helper.make_tensor(f"{prefix}c{len(nodes)}", typed, shape, values))
        return value if typed == index_type else add("CastLike", [value, index])

    shape, index_shape = dims.get(data), dims.get(index)
    if node.op_type in ("GatherND", "ScatterND"):
        # the index's last dimension holds one index per data axis, from the batch dimensions on
        first = attrs.get("batch_dims", 0)
        if shape is not None and index_shape:
            known = shape[first:first + index_shape[-1]]
            sizes = constant(known, [len(known)])
        else:
            known = None
            start = add("Constant", [], value=helper.make_tensor(f"{prefix}first", 7, [1], [first]))
            sizes = add("Slice", [add("Shape", [data]), start, add("Add", [start, add("Shape", [index], start=-1)])])
            sizes = add("CastLike", [sizes, index])
    else:
        axis = attrs.get("axis", 0)
        known = [shape[axis]] if shape is not None and -len(shape) <= axis < len(shape) else None
        if known is not None:
            sizes = constant(known, [])
        else:
            sizes = add("CastLike", [add("Shape", [data], start=axis, end=axis + 1 if axis != -1 else 2 ** 62), index])
    if not from_end:
        low = constant([0], [])
    elif known is not None:
        low = constant([-n for n in known], [len(known)] if node.op_type in ("GatherND", "ScatterND") else [])
    else:
        low = add("Neg", [sizes])
    bad = add("Or", [add("Less", [index, low]), add("GreaterOrEqual", [index, sizes])])
    nodes.append(helper.make_node("ReduceSum", [add("Cast", [bad], to=7)], [count], keepdims=0))
    return nodes
