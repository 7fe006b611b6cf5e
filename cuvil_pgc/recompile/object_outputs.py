"""Objects in a region's output that hold tensors where torch's pytree does not look.

A Hugging Face decoder left at ``use_cache=True`` (its config's default) returns its cache: a
``DynamicCache`` holding a ``DynamicLayer`` per layer, each holding that layer's key and value
tensors. The pytree leaves such an object whole, so an exported graph could not return it, and
every ONNX Runtime, OpenVINO and AOTInductor candidate of the model was rejected.

:func:`output_tensors` lists an output's tensors with those inside such objects (through their
attributes, lists, tuples and dicts) in the order :class:`ObjectLeaf` puts them back: a new
object of the same class, built without its ``__init__``, with the example's other attributes
(flags, devices, configs: the same objects) and the runtime's tensors. Whether those other
attributes stay the same for other input values is checked as for any value in an output
(:func:`~.output_values.check_constant_outputs` with :meth:`ObjectLeaf.same_shape`).

An int attribute that counts what one of the object's tensors holds (:data:`LENGTHS`: a sliding-window
layer's ``cumulative_length``, its keys' length until the window fills) is not a constant: it is
rebuilt from that tensor's size, so that one skeleton describes the cache at every length and an
export sees the count as the size it is.

An object that cannot be opened this way (a cycle, ``__slots__``, tensors deeper than
:data:`MAX_DEPTH`, a tuple subclass holding tensors) is left whole, and rejected as before.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from operator import is_, itemgetter
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

#: bump when the outputs an export can return change: a recorded rejection of an older version's
#: export (a decoder's cache, before this module opened it) is not reused
OUTPUTS_VERSION = 1
#: how deep inside an object tensors are looked for (a cache: object, list of layers, layer)
MAX_DEPTH = 6

#: (class, attribute) -> (tensor attribute, dimension): an int attribute that counts what the tensor
#: holds along that dimension, wherever it equals that size. A Hugging Face sliding-window layer
#: (Mistral's, Phi-3's, Gemma's) counts the tokens it has seen in ``cumulative_length``, which is its
#: keys' length until the window fills; as a constant, no later step's cache matched the built one
LENGTHS = {("transformers.cache_utils.DynamicSlidingWindowLayer", "cumulative_length"): ("keys", -2)}

_TENSOR, _CONSTANT, _SEQUENCE, _MAPPING, _OBJECT, _LENGTH = range(6)
_SYMBOLS = (torch.SymInt, torch.SymFloat, torch.SymBool)


class ObjectLeaf:
    """How to rebuild an object of a region's output around other tensors: its skeleton (the
    structure, constants and tensor slots, walked as :func:`output_tensors` walks it), the shape
    and dtype of each tensor it takes, and where the first of them is among the runtime's outputs."""

    def __init__(self, skeleton: tuple[Any, ...], tensors: list[tuple[tuple[int, ...], torch.dtype]],
                 first: int = 0) -> None:
        self.skeleton = skeleton
        self.tensors = tensors
        self.first = first
        #: outputs -> the object: closures with each tensor's index fixed (an interpreter walking
        #: the skeleton took 3.9 µs for a two-layer DynamicCache, these 2.3 µs, warm)
        self.build: Callable[[list[torch.Tensor]], Any] = _builder(skeleton, [first])

    @classmethod
    def of(cls, value: Any, first: int = 0) -> ObjectLeaf | None:
        """The leaf for the object ``value`` whose tensors are the outputs from ``first`` on, or
        None where it is not an object holding tensors or cannot be opened."""
        tensors: list[torch.Tensor] = []
        skeleton = _walk(value, tensors, 0, set())
        if skeleton is None or skeleton[0] != _OBJECT:
            return None
        return cls(skeleton, [(tuple(t.shape), t.dtype) for t in tensors], first)

    def held(self, value: Any) -> tuple[list[tuple[Any, tuple[Any, ...]]], list[torch.Tensor]] | None:
        """(what holds ``value``'s tensors: each list, dict and object ``__dict__`` on the way with
        the items it holds now, which :func:`unchanged` compares; its tensors in this leaf's
        order), or None where ``value`` is not laid out as this leaf's skeleton. For an object
        this leaf's structure was checked on (an object :func:`opened` described as this leaf's),
        this is what that check and the walk cost again, a few list and identity comparisons."""
        record: list[tuple[Any, tuple[Any, ...]]] = []
        tensors: list[torch.Tensor] = []
        return (record, tensors) if _held(self.skeleton, value, record, tensors) else None

    def same_shape(self, other: ObjectLeaf | None) -> bool:
        """Whether ``other`` has the same structure, the same constants and as many tensors."""
        return other is not None and len(other.tensors) == len(self.tensors) and _same(self.skeleton, other.skeleton)

    def __repr__(self) -> str:
        return f"ObjectLeaf({_type_name(self.skeleton)}, {len(self.tensors)} tensors from output {self.first})"


def _held(node: tuple[Any, ...], value: Any, record: list[tuple[Any, tuple[Any, ...]]],
          tensors: list[torch.Tensor]) -> bool:
    kind = node[0]
    if kind == _TENSOR:
        tensors.append(value)
        return isinstance(value, torch.Tensor)
    if kind in (_CONSTANT, _LENGTH):     # its identity is its holder's to compare
        return True
    if type(value) is not node[1]:
        return False
    if kind == _SEQUENCE:
        if len(value) != len(node[2]):
            return False
        if type(value) is list:
            record.append((value, tuple(value)))
        return all(_held(child, v, record, tensors) for child, v in zip(node[2], value, strict=True))
    held = value if kind == _MAPPING else vars(value)
    if len(held) != len(node[2]):
        return False
    record.append((held, tuple(held.values())))
    return all(key in held and _held(child, held[key], record, tensors) for key, child in node[2])


def unchanged(record: list[tuple[Any, tuple[Any, ...]]]) -> bool:
    """Whether every list and dict in ``record`` (:meth:`ObjectLeaf.held`) holds the very items it
    held: nothing in the object was rebound or added since (a tensor changed in place is the
    same tensor)."""
    for held, items in record:
        now = held.values() if type(held) is dict else held
        if len(held) != len(items) or not all(map(is_, now, items)):
            return False
    return True


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of ``output`` in the order an exported region returns them: the pytree's
    leaves (:func:`is_output_leaf`), each object leaf opened (see :class:`ObjectLeaf`)."""
    tensors: list[torch.Tensor] = []
    for leaf in pytree.tree_leaves(output, is_leaf=is_output_leaf):
        if isinstance(leaf, torch.Tensor):
            tensors.append(leaf)
        elif openable(leaf):
            found: list[torch.Tensor] = []
            if _walk(leaf, found, 0, set()) is not None:
                tensors.extend(found)
    return tensors


def opened(value: Any) -> tuple[str, list[torch.Tensor]] | None:
    """An object holding tensors (a Hugging Face cache) as (its structure as text, its tensors in
    :class:`ObjectLeaf`'s order), or None where it cannot be opened. The text names each class,
    each attribute and each plain value (flags, sizes, dtypes, devices), and every other value by
    its type, tensors as ``T``: two objects with the same text are rebuilt alike from their tensors."""
    tensors: list[torch.Tensor] = []
    skeleton = _walk(value, tensors, 0, set())
    if skeleton is None or skeleton[0] != _OBJECT:
        return None
    return _describe(skeleton), tensors


def structure(value: Any) -> str | None:
    """The structure of an object as :func:`opened` writes it, where it holds no tensors too (an
    empty cache, before a prefill fills its layers), or None where it cannot be opened."""
    skeleton = _walk(value, [], 0, set(), keep=True)
    return _describe(skeleton) if skeleton is not None and skeleton[0] == _OBJECT else None


def first_difference(built: str, found: str) -> tuple[str, str] | None:
    """The first part (between commas) where two structures :func:`opened` wrote differ, as
    (``built``'s, ``found``'s); None where one only has more parts (another number of layers)."""
    return next(((a, b) for a, b in zip(built.split(", "), found.split(", "), strict=False) if a != b), None)


#: the constants :func:`opened` writes as their values (other objects by their type's name)
_PLAIN = (type(None), bool, int, float, str, torch.dtype, torch.device)


def _describe(node: tuple[Any, ...]) -> str:
    kind = node[0]
    if kind == _TENSOR:
        return "T"
    if kind == _CONSTANT:
        value = node[1]
        return repr(value) if isinstance(value, _PLAIN) else _qualified(type(value))
    if kind == _LENGTH:
        return f"{node[1]}.shape[{node[2]}]"
    if kind == _SEQUENCE:
        return f"{node[1].__name__}[{', '.join(_describe(child) for child in node[2])}]"
    inner = ", ".join(f"{key}={_describe(child)}" for key, child in node[2])
    return f"{{{inner}}}" if kind == _MAPPING else f"{_qualified(node[1])}({inner})"


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def is_output_leaf(value: Any) -> bool:
    """Where an output's pytree walk stops: a ``torch.Size`` (the pytree rebuilds it as a plain
    tuple) and a Hugging Face cache. A cache is a pytree node only in a process where transformers'
    exporter registered it, and its tensors' order must not depend on that: the process that
    exports a region and the one that loads it each open it as :class:`ObjectLeaf` does."""
    if isinstance(value, torch.Size):
        return True
    cache = getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)
    return isinstance(cache, type) and isinstance(value, cache)


def openable(value: Any) -> bool:
    """An instance whose attributes are its state: not a class, a module, a function, a method
    or an ``nn.Module`` (a module in an output is returned as itself, its weights its own)."""
    return hasattr(value, "__dict__") and not isinstance(value, (type, types.ModuleType, nn.Module)) \
        and not callable(value)


def _walk(value: Any, tensors: list[torch.Tensor], depth: int, path: set[int],
          keep: bool = False) -> tuple[Any, ...] | None:
    """The skeleton of ``value``, its tensors appended to ``tensors``; None where a tensor is
    inside something that cannot be rebuilt. ``keep``: objects and containers holding no tensors
    are walked into too (to describe them), not left as the constants they are."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return (_TENSOR,)
    if isinstance(value, _SYMBOLS):          # a count an export traces as a symbol (a LENGTHS one)
        return (_CONSTANT, value)
    kind = type(value)
    if kind in (list, tuple, dict) or openable(value):
        if depth >= MAX_DEPTH or id(value) in path:      # what is below, or a cycle's copy, is not known
            return None
        path.add(id(value))
        try:
            if kind is dict:
                items = list(value.items())
            elif kind in (list, tuple):
                items = list(enumerate(value))
            else:
                items = list(vars(value).items())
            start = len(tensors)
            children = [(key, _walk(v, tensors, depth + 1, path, keep)) for key, v in items]
        finally:
            path.discard(id(value))
        if any(child is None for _, child in children):
            return None
        if len(tensors) == start and not keep:     # nothing to put back: the object itself
            return (_CONSTANT, value)
        if kind is dict:
            return (_MAPPING, dict, children)
        if kind in (list, tuple):
            return (_SEQUENCE, kind, [child for _, child in children])
        return (_OBJECT, kind, _with_lengths(value, children))
    return None if holds_tensors(value) else (_CONSTANT, value)


def _with_lengths(obj: Any, children: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """An object's ``children`` with each :data:`LENGTHS` attribute that equals its tensor's size
    a length node (a count that differs, a window that filled, stays the constant it is)."""
    name = _qualified(type(obj))
    out = []
    for key, child in children:
        of = LENGTHS.get((name, key))
        if of is not None and child[0] == _CONSTANT and type(child[1]) is int:
            tensor = vars(obj).get(of[0])
            if isinstance(tensor, torch.Tensor) and tensor.dim() >= abs(of[1]) and tensor.shape[of[1]] == child[1]:
                child = (_LENGTH, *of)
        out.append((key, child))
    return out


def holds_tensors(value: Any) -> bool:
    """Whether a value left as it is holds tensors one level down (an object's attributes or
    slots, a container's items): returning the example's would return stale tensors."""
    if isinstance(value, nn.Module) or isinstance(value, (str, bytes)):
        return False
    if isinstance(value, dict):
        inner = value.values()
    elif isinstance(value, (list, tuple)):
        inner = value
    else:
        inner = list(getattr(value, "__dict__", {}).values()) + \
            [getattr(value, s, None) for s in getattr(type(value), "__slots__", ())]
    return any(isinstance(v, torch.Tensor) for v in inner)


def _builder(node: tuple[Any, ...], position: list[int]) -> Callable[[list[torch.Tensor]], Any]:
    """The builder of ``node`` from the runtime's outputs, its tensors taken from ``position[0]``
    on (advanced past them)."""
    kind = node[0]
    if kind == _TENSOR:
        position[0] += 1
        return itemgetter(position[0] - 1)
    if kind == _CONSTANT:
        value = node[1]
        return lambda outputs: value
    if kind == _SEQUENCE:
        make, items = node[1], [_builder(child, position) for child in node[2]]
        return lambda outputs: make([item(outputs) for item in items])
    if kind == _LENGTH:                 # set by its object's builder, once the tensor is
        return lambda outputs: 0
    fields = [(key, _builder(child, position)) for key, child in node[2]]
    if kind == _MAPPING:
        return lambda outputs: {key: item(outputs) for key, item in fields}
    cls = node[1]
    new = cls.__new__
    lengths = [(key, child[1], child[2]) for key, child in node[2] if child[0] == _LENGTH]

    def build(outputs: list[torch.Tensor]) -> Any:
        obj = new(cls)
        # one by one: Dynamo, tracing a torch.compile candidate of a decoding step, lost what
        # __dict__.update gave a new object ("'DynamicCache' object has no attribute 'layers'"),
        # and the candidate failed; as fast here (3.7 µs for four layers either way)
        for key, item in fields:
            object.__setattr__(obj, key, item(outputs))
        for key, tensor, dim in lengths:    # (a symbol in an export: the count is the size it is; in place)
            object.__setattr__(obj, key, getattr(obj, tensor).shape[dim])
        return obj
    return build


def _same(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == _TENSOR:
        return True
    if a[0] == _CONSTANT:
        return same_value(a[1], b[1])
    if a[0] == _LENGTH:
        return a[1:] == b[1:]
    if a[1] is not b[1] or len(a[2]) != len(b[2]):
        return False
    if a[0] == _SEQUENCE:
        return all(_same(x, y) for x, y in zip(a[2], b[2], strict=True))
    return all(k == j and _same(x, y) for (k, x), (j, y) in zip(a[2], b[2], strict=True))


def same_value(a: Any, b: Any) -> bool:
    """Whether two values an output holds besides tensors are the same: one object, or equal and
    of one type."""
    try:
        return a is b or type(a) is type(b) and bool(a == b)
    except Exception:       # an __eq__ that raises or does not return a bool
        return False


def _type_name(node: tuple[Any, ...]) -> str:
    return node[1].__name__ if node[0] in (_SEQUENCE, _MAPPING, _OBJECT) else "value"
