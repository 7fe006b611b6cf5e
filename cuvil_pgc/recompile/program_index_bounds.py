"""The :class:`~.index_bounds.IndexBounds` of a ``torch.export`` program (an AOTInductor
package's, a torch.compile region's, a program for other sizes): the inputs that reach the indices
of ``embedding``, ``index``, ``index_select``, ``index_add``, ``index_put``, ``gather``,
``scatter`` and their kin through ops that only move their values, or shifted by a constant of
the program's, with the size of what they index (see :mod:`.index_bounds`, which does the same in
an ``.onnx`` and checks the calls); and the inputs that reach an index through arithmetic no bound
follows, for which no Inductor program is built (:func:`unchecked_reason`).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from cuvil_pgc.recompile.index_bounds import (
    INDEX_DTYPES,
    IndexBounds,
    Limit,
    add_shift,
    bound_by,
    largest_shift,
    less_shift,
)


def program_index_bounds(exported: Any) -> IndexBounds:
    """The :class:`~.index_bounds.IndexBounds` of a ``torch.export`` program (see the module's docstring)."""
    from torch.export.graph_signature import InputKind, TensorArgument

    kinds = {spec.arg.name: spec.kind for spec in exported.graph_signature.input_specs
             if isinstance(spec.arg, TensorArgument)}
    user = [name for name, kind in kinds.items() if kind == InputKind.USER_INPUT]
    positions = {name: i for i, name in enumerate(user)}
    constants = _program_constants(exported)
    rows: dict[int, Limit] = {}
    sized: set[int] = set()
    unchecked: set[int] = set()
    named: dict[int, set[str]] = {}
    nodes, outer = _program_nodes(exported.graph_module)
    for node in nodes:
        for data, dim, index in _fx_indexing(node):
            source, shift = _fx_source(index, constants, outer)
            if source is None or source.name not in positions or source.meta.get("val") is None \
                    or source.meta["val"].dtype not in INDEX_DTYPES:
                unchecked.update(positions[p.name] for p in _fx_ids_reaching(index, positions, outer))
                continue
            value = data.meta.get("val") if isinstance(data, torch.fx.Node) else None
            if value is None or not -value.dim() <= dim < value.dim():
                continue
            size, position = value.shape[dim], positions[source.name]
            if isinstance(size, torch.SymInt):           # a program for other sizes
                named.setdefault(position, set()).add(less_shift(str(size), shift))
                sized.add(position)
                continue
            data = _outer(data, outer)
            table = isinstance(data, torch.fx.Node) and (
                data.op == "get_attr" or kinds.get(data.name) not in (None, InputKind.USER_INPUT))
            if bound_by(rows, position, size, shift) and not table:
                sized.add(position)
    return IndexBounds(rows, frozenset(sized), frozenset(unchecked), {p: frozenset(n) for p, n in named.items()})


#: a subgraph placeholder -> the node it stands for (a ``cond``'s operand), or the operands of a
#: loop whose iterations reach it (no bound follows them)
Outer = dict[Any, Any]


def _program_nodes(module: Any) -> tuple[list[Any], Outer]:
    """Every node of a program, those of its higher-order ops' subgraphs (``torch.cond``'s branches, a
    ``while_loop``'s or ``scan``'s body) included, and what each subgraph placeholder stands for: a
    cond's branches take its operands in order; a loop body's placeholders take values its iterations
    make, so they stand for all of the loop's operands (a tuple), which no bound follows."""
    from torch._ops import HigherOrderOperator

    nodes: list[Any] = []
    outer: Outer = {}

    def visit(gm: Any) -> None:
        for node in gm.graph.nodes:
            nodes.append(node)
            if node.op != "call_function" or not isinstance(node.target, HigherOrderOperator):
                continue
            operands: list[Any] = []
            torch.fx.node.map_arg((node.args, node.kwargs), operands.append)
            subs = [getattr(gm, a.target) for a in operands
                    if a.op == "get_attr" and isinstance(getattr(gm, a.target, None), torch.fx.GraphModule)]
            values = tuple(a for a in operands if a.op != "get_attr")
            taken = node.args[3] if node.target is torch.ops.higher_order.cond and len(node.args) == 4 else None
            for sub in subs:
                for k, p in enumerate(n for n in sub.graph.nodes if n.op == "placeholder"):
                    outer[p] = taken[k] if isinstance(taken, (list, tuple)) and k < len(taken) else values
                visit(sub)

    visit(module)
    return nodes, outer


def _outer(node: Any, outer: Outer) -> Any:
    """What a subgraph placeholder stands for in the program's own graph (a tuple: no one node)."""
    for _ in range(64):
        if not isinstance(node, torch.fx.Node) or node not in outer:
            return node
        node = outer[node]
    return None


def unchecked_reason(bounds: IndexBounds) -> str | None:
    """Why an AOTInductor or torch.compile program of a region with these bounds must not be
    built, or None. Worded as an ExportError's (its exporter first): every program torch.export
    makes of the region has the same indices."""
    if not bounds.unchecked:
        return None
    names = ", ".join(map(str, sorted(bounds.unchecked)))
    return (f"torch.export failed to bound the region's indices: input {names} reaches an index through "
            "arithmetic that no check before the call follows, and an out-of-range value would abort the "
            "process in Inductor's kernels (their index check throws inside OpenMP's threads) where eager "
            "raises IndexError")


def _fx_indexing(node: Any) -> list[tuple[Any, int, Any]]:
    """(indexed tensor, dim, index node) of each index an ATen op of ``node`` takes."""
    if node.op != "call_function" or not hasattr(node.target, "_schema"):
        return []
    name = node.target._schema.name.removeprefix("aten::")
    args = node.args
    if name == "embedding":
        return [(args[0], 0, args[1])]
    if name in ("index", "index_put", "index_put_", "_unsafe_index", "_unsafe_index_put"):
        return [(args[0], k, idx) for k, idx in enumerate(args[1]) if idx is not None]
    if name in _FX_DIM_INDEX and len(args) > 2:
        return [(args[0], args[1], args[2])] if isinstance(args[1], int) else []
    return []


#: ATen ops called as ``op(self, dim, index, ...)``
_FX_DIM_INDEX = {"index_select", "index_add", "index_add_", "index_copy", "index_copy_", "index_fill",
                 "index_fill_", "index_reduce", "index_reduce_", "gather", "scatter", "scatter_",
                 "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_"}
#: ATen ops whose output holds only values of their first argument
_FX_PASS_VALUES = {"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "select", "slice", "expand",
                   "permute", "transpose", "t", "clone", "contiguous", "alias", "flatten", "narrow", "detach",
                   "_to_copy", "to", "lift_fresh_copy"}


#: ATen ops whose output's values follow their inputs' arithmetically (an index made of ids by them
#: is out of range wherever they take the ids; comparisons, ``cumsum`` of a mask, ``argmax`` and
#: ``remainder`` by a size make values that do not follow an id's range this way)
_FX_ARITHMETIC = {"add", "sub", "rsub", "mul", "neg", "floor_divide", "div", "cat", "stack", "where",
                  "masked_fill", "abs", "bitwise_and", "bitwise_or", "bitwise_xor"}


_FX_FOLLOWED = _FX_ARITHMETIC | _FX_PASS_VALUES


def _fx_ids_reaching(node: Any, positions: dict[str, int], outer: Outer) -> list[Any]:
    """The integer user inputs whose values reach ``node`` through arithmetic and moves (and from a
    subgraph's placeholders, through what they stand for)."""
    import operator

    found, seen, todo = [], set(), [node]
    while todo and len(seen) < 512:
        node = todo.pop()
        if not isinstance(node, torch.fx.Node) or node in seen:
            continue
        seen.add(node)
        if node in outer:
            mapped = outer[node]
            todo += list(mapped) if isinstance(mapped, tuple) else [mapped]
            continue
        value = node.meta.get("val")
        if not isinstance(value, (list, tuple)) and getattr(value, "dtype", None) not in INDEX_DTYPES:
            continue                 # a float or a mask: not an id's values (a list: split's parts)
        if node.op == "placeholder":
            found += [node] if node.name in positions else []
            continue
        if node.op != "call_function":
            continue
        if node.target is operator.getitem:
            todo.append(node.args[0] if isinstance(node.args[0], torch.fx.Node) else None)
            continue
        schema = getattr(node.target, "_schema", None)
        if schema is not None and schema.name.removeprefix("aten::") in _FX_FOLLOWED:
            todo += [a for a in (*node.args, *node.kwargs.values()) if isinstance(a, torch.fx.Node)]
            todo += [a for arg in node.args if isinstance(arg, (list, tuple)) for a in arg]
    return found


def _program_constants(exported: Any) -> dict[str, torch.Tensor]:
    """Placeholder name -> value of each lifted buffer, parameter and constant of a program."""
    from torch.export.graph_signature import TensorArgument

    values = {**exported.state_dict, **exported.constants}
    return {spec.arg.name: values[spec.target] for spec in exported.graph_signature.input_specs
            if isinstance(spec.arg, TensorArgument) and spec.target in values}


#: ATen ops on the way from an input to its index that keep each element where it was (a shift found
#: past any other is its largest element, for every element)
_FX_IN_PLACE = {"clone", "contiguous", "alias", "detach", "_to_copy", "to", "lift_fresh_copy"}


def _fx_source(node: Any, constants: dict[str, torch.Tensor], outer: Outer) -> tuple[Any, np.ndarray]:
    """The placeholder of the program's own graph ``node`` takes its values from through ops that
    only move them (or None), and the constants added to them on the way (``add``s of a number or of
    a constant tensor of the program's with no negative value, see :func:`_bound`)."""
    import operator

    shift = np.zeros((), np.int64)
    for _ in range(64):
        node = _outer(node, outer)
        if not isinstance(node, torch.fx.Node):
            return None, shift
        if node.op == "placeholder":
            return node, shift
        if node.op != "call_function" or not node.args:
            return None, shift
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node) \
                and getattr(node.args[0].target, "_schema", None) is not None \
                and node.args[0].target._schema.name.removeprefix("aten::") in ("unbind", "split", "split_with_sizes",
                                                                                "chunk"):
            node, shift = node.args[0].args[0], largest_shift(shift)
            continue
        schema = getattr(node.target, "_schema", None)
        name = schema.name.removeprefix("aten::") if schema is not None else None
        value = node.meta.get("val")
        if value is not None and getattr(value, "dtype", None) not in INDEX_DTYPES:
            return None, shift                  # cast to a float: its values are not ids any more
        if name == "add" and len(node.args) == 2 and node.kwargs.get("alpha", 1) == 1:
            added = _fx_shift(node.args, constants)
            if added is None:
                return None, shift
            shift, node = add_shift(shift, added[0]), added[1]
            continue
        if name not in _FX_PASS_VALUES:
            return None, shift
        node, shift = node.args[0], shift if name in _FX_IN_PLACE else largest_shift(shift)
    return None, shift


def _fx_shift(operands: Any, constants: dict[str, torch.Tensor]) -> tuple[np.ndarray, Any] | None:
    """(the values, the other operand) of an ``add`` of an integer number or constant with no
    negative value, or None."""
    for k in (0, 1):
        const, other = operands[k], operands[1 - k]
        if not isinstance(other, torch.fx.Node):
            continue
        if isinstance(const, int) and not isinstance(const, bool):
            values = torch.tensor(const)
        elif isinstance(const, torch.fx.Node) and const.name in constants:
            values = constants[const.name]
        else:
            continue
        if values.dtype in INDEX_DTYPES and values.numel() and int(values.min()) >= 0:
            return values.detach().cpu().numpy().astype(np.int64), other
    return None
