"""Decoding steps: a model's call that hands it a cache to extend, built as a program of tensors.

A Hugging Face decoder's ``generate()`` calls the model once per new token with the ``DynamicCache``
of the tokens before it, and the model appends the token's keys and values to that cache (each
layer's ``keys`` and ``values`` reassigned to longer tensors) and returns it. No program captured
from one call changes an object it is given, so such a call was refused (:mod:`.stateless`) and
every decoding step, where generation spends its time, ran the original module.

A recompile whose example call passes such a cache builds :class:`CacheStep` instead: the same
call with the cache *opened* (as Optimum's ``past_key_values`` inputs and ``present`` outputs do),
``forward(*tensors)`` taking the call's tensors and then the cache's, and rebuilding the cache as a
new object around them (:class:`~.object_outputs.ObjectLeaf`, the caller's never touched). The
model appends to that one and returns it, which the region's programs return as tensors and rebuild
(:mod:`.object_outputs`). The cache grows by a token every call, so the step's regions get programs
for other sizes (``--dynamic``) whatever was asked. A program's free sizes are named, and sizes of
one name are equal; the attention mask covers the cache's positions and the new tokens', one longer
than the cache, so the step takes it in two parts, the cache's and the new tokens' (each equal to a
size the program has), and joins them before the model's call.

:class:`StepLayout` (in the plan as ``cache_step``) says where the call's tensors, the cache and
its other values sit, and the cache's structure as text (:func:`~.object_outputs.opened`). An
encoder-decoder's step (T5's, BART's) passes the encoder's outputs too, a ModelOutput that the
step opens into its tensors as well (``objects``), and an ``EncoderDecoderCache`` whose
cross-attention half stays as the first decoder call filled it; its attention mask is over the
encoder's tokens, and is passed whole. The prefill (``generate()``'s first call, its cache still
empty) is built the same way (``prefill``): the step takes the call's tensors alone, gives the model
a copy of the empty cache, and its program returns the filled cache's tensors. What a loaded step
runs is :mod:`.decoding_forward`'s; how ``generate()`` calls the model, :mod:`.generate_calls`'s.
"""

from __future__ import annotations

import copy
import logging
import operator
import weakref
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cuvil_pgc.errors import BuildError, RecompileError
from cuvil_pgc.recompile.generate_calls import (
    as_generate_calls,
    cache_length,
    cache_position,
    class_parameters,
)
from cuvil_pgc.recompile.object_outputs import ObjectLeaf, first_difference, opened, structure

log = logging.getLogger(__name__)

#: the values a step's call holds at its other positions, compared by value (``use_cache=True``)
_CONSTANTS = (type(None), bool, int, float, str)
#: the longest cache a step's program for other sizes is checked at (a model's positions, where its
#: config names fewer): a step whose cache is longer runs the original module. Each check holds the
#: cache at that length three times (the probe, eager's output, the program's)
LONGEST_CHECKED = 8192
#: where a Hugging Face config names how many positions its model has
_POSITIONS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "n_ctx")


@dataclass(frozen=True)
class StepLayout:
    """Where a decoding step's call holds what: ``count`` positional arguments, tensors at
    ``tensors``, the cache at ``cache``, ``constants`` at every position (None at the tensors'
    and the cache's), the cache's structure as text (``skeleton``), and the tensors taken in two
    parts, the cache's positions and the new tokens' (``split``: attention masks)."""

    count: int
    tensors: tuple[int, ...]
    cache: int
    constants: tuple[Any, ...]
    skeleton: str
    split: tuple[int, ...] = ()
    #: the longest cache whose step keeps every token (None: any length). A sliding-window layer
    #: keeps its window's last tokens but one: a step at a longer cache drops the oldest, and its
    #: count of the tokens seen parts from its keys' length, which a built step counts them by
    #: (:data:`~.object_outputs.LENGTHS`); such steps run the model's own forward
    longest: int | None = None
    #: positions holding an object that opens into tensors (torch's pytree: an encoder-decoder's
    #: ``encoder_outputs``, a ModelOutput), each (position, its structure as text, how many tensors);
    #: the step takes its tensors after the call's and before the cache's
    objects: tuple[tuple[int, str, int], ...] = ()
    #: the prefill: the call generate() makes first, whose cache is still empty (``skeleton`` is
    #: its structure, :func:`~.object_outputs.structure`). The step takes no cache tensors and
    #: gives the model a copy of that empty cache; the program returns the filled one's tensors
    prefill: bool = False

    @property
    def call_tensors(self) -> int:
        """How many of the step's inputs come from the call's values (the cache's follow)."""
        return len(self.tensors) + len(self.split) + sum(n for _, _, n in self.objects)

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        if not self.prefill:            # a decoding step's plan reads as before (format 8 at most)
            del doc["prefill"]
        return doc

    @classmethod
    def from_json(cls, doc: Any, path: str) -> StepLayout:
        try:
            layout = cls(count=int(doc["count"]), tensors=tuple(int(i) for i in doc["tensors"]),
                         cache=int(doc["cache"]), constants=tuple(doc["constants"]), skeleton=str(doc["skeleton"]),
                         split=tuple(int(i) for i in doc.get("split", ())),
                         longest=None if doc.get("longest") is None else int(doc["longest"]),
                         objects=tuple((int(i), str(text), int(n)) for i, text, n in doc.get("objects", ())),
                         prefill=doc.get("prefill", False) is True)
            at = [i for i, _, _ in layout.objects]
            ok = len(layout.constants) == layout.count and all(
                0 <= i < layout.count for i in (*layout.tensors, layout.cache, *at)) and all(
                n > 0 for _, _, n in layout.objects) and len({*at, *layout.tensors, layout.cache}) == len(
                at) + len(layout.tensors) + 1 and all(
                isinstance(v, _CONSTANTS) for v in layout.constants) and set(layout.split) <= set(layout.tensors) and not (
                layout.prefill and layout.split)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise BuildError("the plan's cache_step is not a decoding step's layout", path=path,
                             fix="rebuild the package with `cuvil-pgc recompile`")
        return layout

    def tensors_of(self, bound: tuple[Any, ...], cache: Any, tensors: list[torch.Tensor],
                   memo: list[Any] | None = None) -> tuple[torch.Tensor, ...] | None:
        """The step's inputs for a call bound to the layout (``cache`` and its ``tensors``), or
        None where it holds other values than the built call did. ``memo`` (one entry per object)
        keeps each object opened last: ``generate()`` passes the same ``encoder_outputs`` every
        step, whose pytree walk took 8.5 µs (a Hugging Face ModelOutput's), its check 0.5."""
        at = [i for i, _, _ in self.objects]
        for i, value in enumerate(bound):
            if i in self.tensors:
                if not isinstance(value, torch.Tensor):
                    return None
            elif i != self.cache and i not in at:
                want = self.constants[i]
                if type(value) is not type(want) or value != want:
                    return None
        inputs: list[torch.Tensor] = []
        for i in self.tensors:
            if i not in self.split:
                inputs.append(bound[i])
            elif (parts := _parts(bound[i], cache)) is None:
                return None
            else:
                inputs.extend(parts)
        for k, (i, text, n) in enumerate(self.objects):
            entry = memo[k] if memo is not None else None
            if entry is not None and entry[0]() is bound[i] and _same_items(bound[i], entry[1]):
                inputs.extend(entry[2])
                continue
            found = opened_input(bound[i])
            if found is None or len(found[0]) != n or str(found[1]) != text:
                return None
            if memo is not None:
                _remember_object(memo, k, bound[i], found[0])
            inputs.extend(found[0])
        return (*inputs, *tensors)


def _same_items(value: Any, items: tuple[Any, ...]) -> bool:
    """Whether the mapping ``value`` holds the very ``items`` (a ModelOutput rebound since holds others)."""
    now = value.values()
    return len(now) == len(items) and all(map(operator.is_, now, items))


def _remember_object(memo: list[Any], k: int, value: Any, tensors: list[torch.Tensor]) -> None:
    """Keep in ``memo[k]`` what :meth:`StepLayout.tensors_of` opened ``value`` into, for as long as
    ``value`` lives (a finished generation's encoder outputs are not kept alive by it): a weak
    reference, its items, its tensors. Nothing where it is no mapping whose items are its tensors
    (it is opened every call) or takes no weak reference."""
    memo[k] = None
    if not isinstance(value, Mapping) or len(value) != len(tensors) \
            or not all(map(operator.is_, value.values(), tensors)):
        return

    def forget(ref: Any) -> None:
        if memo[k] is not None and memo[k][0] is ref:
            memo[k] = None
    try:
        memo[k] = (weakref.ref(value, forget), tuple(value.values()), tensors)
    except TypeError:
        pass


def opened_input(value: Any) -> tuple[list[torch.Tensor], Any] | None:
    """(the tensors, the pytree structure) of a call's value that torch's pytree opens into tensors
    alone (a ModelOutput, a tuple or dict of tensors), or None."""
    if isinstance(value, (torch.Tensor, *_CONSTANTS)):
        return None
    leaves, spec = pytree.tree_flatten(value)
    return (leaves, spec) if leaves and all(isinstance(t, torch.Tensor) for t in leaves) else None


class CacheStep(nn.Module):
    """``model``'s call with its cache opened: ``forward`` takes the call's tensors, then the
    cache's (the layout's order), and calls the model's class forward with a new cache built around
    them (the instance's ``forward`` is :func:`decoding_forward` once loaded). A profile of the
    model is matched to the step's submodules under ``profiled_path``."""

    profiled_path = "model"

    def __init__(self, model: nn.Module, layout: StepLayout, leaf: ObjectLeaf | None = None,
                 specs: list[Any] | None = None) -> None:
        super().__init__()
        self.model = model
        self.training = model.training
        # private: neither a setting nor part of the structure (the plan holds the layout). The
        # cache's rebuild is held in a list that the copies apply_plan makes share: a loaded step
        # takes it from its first call's cache (decoding_forward)
        self._layout = layout
        self._leaf: list[ObjectLeaf | None] = [leaf]
        #: the pytree structures of the layout's objects, as _leaf (a loaded step's from its first call)
        self._specs: list[list[Any] | None] = [specs]
        #: a prefill's empty cache and the tensors it holds, copied for each call but its tensors (a
        #: loaded step's from its first call, as _leaf)
        self._empty: list[tuple[Any, list[torch.Tensor]] | None] = [None]
        self._forward = type(model).forward

    @property
    def layout(self) -> StepLayout:
        return self._layout

    def learn(self, cache: Any, bound: tuple[Any, ...]) -> ObjectLeaf | None:
        """The cache's rebuild, taken with the objects' structures from ``cache`` and the call
        ``bound`` where the step has none yet (a loaded step's first call: the same structure
        rebuilds alike whichever call it is taken from). A prefill's: a copy of its empty cache."""
        if self._layout.prefill:
            if self._empty[0] is None:
                empty = copy.deepcopy(cache)
                found = opened(empty)       # a sliding-window layer's window as a tensor, in an empty cache too
                self._empty[0] = (empty, found[1] if found is not None else [])
                self._specs[0] = [pytree.tree_flatten(bound[i])[1] for i, _, _ in self._layout.objects]
            return None
        if self._leaf[0] is None:
            self._leaf[0] = ObjectLeaf.of(cache)
            self._specs[0] = [pytree.tree_flatten(bound[i])[1] for i, _, _ in self._layout.objects]
        return self._leaf[0]

    def static_dimensions(self, args: tuple[Any, ...]) -> dict[int, set[int]]:
        """The dimensions of the step's inputs an export keeps at their size. The new tokens'
        count where it is one: Hugging Face's attention tests ``q_length > 1`` as a Python bool, and
        the ONNX exporter's free sizes made that a symbol it refused ("is_causal must be bool, not
        SymBool"). The cache's heads and head size (all but the batch and the length, second to
        last, where Hugging Face's layers append): the ONNX exporter left them free, and where one
        was captured equal to the length (a head size of 32 beside 32 cached tokens) the length
        varied with it, failed, and stayed fixed."""
        calls = self._layout.call_tensors
        static = {k: {1} for k, a in enumerate(args[:calls])
                  if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[1] == 1}
        static.update({k: set(range(1, a.dim() - 2)) | {a.dim() - 1} for k, a in enumerate(args) if k >= calls
                       and isinstance(a, torch.Tensor) and a.dim() >= 3})
        return static

    def named_inputs(self, args: tuple[Any, ...]) -> dict[str, Any]:
        """The call's values among the step's inputs ``args``, by the model's parameter names (an
        attention mask taken in two parts, joined): where :func:`~.padding.padding_of` finds the
        masks, whose padded positions the guard does not compare (a prefill's keys there, past the
        first layer, are what each runtime makes of a query with every key masked)."""
        names = [name for name, _ in class_parameters(self.model)]
        out, taken = {}, iter(args)
        for i in self._layout.tensors:
            value = torch.cat([next(taken), next(taken)], dim=1) if i in self._layout.split else next(taken)
            if i < len(names):
                out[names[i]] = value
        return out

    def size_ceilings(self, args: tuple[Any, ...]) -> dict[tuple[int, int], int]:
        """The dimensions of the step's inputs whose sizes its program for other sizes is checked
        up to the model's positions (at most :data:`LONGEST_CHECKED`, and at most the longest cache
        a sliding window keeps whole, :attr:`StepLayout.longest`), not the default few times the
        captured size: the cache's length (second to last) and the mask's part over it (a
        prefill's: the prompt's length, its call's tensors' second dimension). A program checked up
        to 16 times a 32-token prompt ran every step after 512 tokens through
        the original module, where it was still 1.65x faster at 900."""
        config = getattr(self.model, "config", None)
        limits = [v for v in (getattr(config, name, None) for name in _POSITIONS) if type(v) is int and v > 0]
        longest = min([LONGEST_CHECKED, *limits, *[n for n in (self._layout.longest,) if n is not None]])
        layout, k, out = self._layout, 0, {}
        if layout.prefill:
            return {(j, 1): longest for j, a in enumerate(args[:layout.call_tensors])
                    if isinstance(a, torch.Tensor) and a.dim() >= 2}
        for i in layout.tensors:
            if i in layout.split:
                out[(k, 1)] = longest
                k += 2
            else:
                k += 1
        k = layout.call_tensors
        out.update({(j, a.dim() - 2): longest for j, a in enumerate(args) if j >= k
                    and isinstance(a, torch.Tensor) and a.dim() >= 3})
        return out

    def forward(self, *tensors: torch.Tensor) -> Any:
        layout, leaf, empty = self._layout, self._leaf[0], self._empty[0]
        if (empty if layout.prefill else leaf) is None:
            raise RuntimeError("CacheStep has no cache to rebuild: it is called only by decoding_forward")
        args, taken = list(layout.constants), iter(tensors)
        for i in layout.tensors:
            args[i] = torch.cat([next(taken), next(taken)], dim=1) if i in layout.split else next(taken)
        for (i, _, n), spec in zip(layout.objects, self._specs[0] or (), strict=True):
            args[i] = pytree.tree_unflatten([next(taken) for _ in range(n)], spec)
        args[layout.cache] = _filled_copy(empty) if layout.prefill else leaf.build(list(taken))
        return self._forward(self.model, *args)


def _filled_copy(empty: tuple[Any, list[torch.Tensor]]) -> Any:
    """A copy of a prefill's empty cache for the model to fill (the model's own forward fills the
    one it is given), sharing the tensors it holds: an export's trace cannot copy a tensor
    ("argument of type UntypedStorage"), and nothing fills them in place."""
    cache, tensors = empty
    return copy.deepcopy(cache, {id(t): t for t in tensors})


def around_cache(model: nn.Module, inputs: tuple[Any, ...]) -> tuple[nn.Module, tuple[Any, ...], StepLayout | None]:
    """``model`` and its positional ``inputs``, as the :class:`CacheStep` and its tensors where
    the call passes a Hugging Face cache: one that holds keys already (a decoding step) or an empty
    one (the prefill); as they are otherwise (other values than tensors and flags beside it are left
    to :mod:`.stateless`, which refuses a call that changes an object it is given)."""
    where = cache_position(inputs)
    if where is None:
        return model, inputs, None
    if getattr(inputs[where], "is_compileable", False) is True:
        raise RecompileError(
            f"the example call passes a {type(inputs[where]).__name__}, whose tensors of the cache's full length each "
            "step writes in place at the new tokens' positions: a build runs programs that change nothing but their "
            "outputs, and copying the whole cache back every step would cost more than the step",
            fix="capture the decoding step with the DynamicCache generate() uses by default (no "
                "cache_implementation='static'); the build runs generate()'s steps with that cache")
    inputs = as_generate_calls(model, inputs)
    prefill = cache_length(inputs[where]) == 0
    found = (structure(inputs[where]), []) if prefill else opened(inputs[where])
    leaf = None if prefill else ObjectLeaf.of(inputs[where])
    others = [i for i in range(len(inputs)) if i != where]
    if found is None or found[0] is None or (leaf is None or not found[1]) and not prefill or any(
            not isinstance(inputs[i], (torch.Tensor, *_CONSTANTS)) and opened_input(inputs[i]) is None for i in others):
        return model, inputs, None
    skeleton, cache = found
    tensors = tuple(i for i in others if isinstance(inputs[i], torch.Tensor))
    objects = {i: opened_input(inputs[i]) for i in others if opened_input(inputs[i]) is not None}
    names = [name for name, _ in class_parameters(model)]
    split = tuple(i for i in tensors if _over_cache_and_new(inputs, names, i, cache_length(inputs[where])))
    layout = StepLayout(count=len(inputs), tensors=tensors, cache=where,
                        constants=tuple(None if i in tensors or i in objects or i == where else inputs[i]
                                        for i in range(len(inputs))),
                        skeleton=skeleton, split=split, longest=_longest_kept(inputs[where]),
                        objects=tuple((i, str(spec), len(leaves)) for i, (leaves, spec) in objects.items()),
                        prefill=prefill)
    step_inputs = layout.tensors_of(inputs, inputs[where], cache)
    if step_inputs is None:
        return model, inputs, None
    step = CacheStep(model, layout, leaf, [spec for _, spec in objects.values()])
    if prefill:
        _check_prompt_kept(layout, inputs)
        step.learn(inputs[where], inputs)
        log.info("cuvil-pgc: the example call passes an empty %s: building the prefill, the filled cache returned "
                 "as its tensors", type(inputs[where]).__name__)
        return step, step_inputs, layout
    _check_structure_kept(step, step_inputs, inputs[where], skeleton)
    log.info("cuvil-pgc: the example call passes a %s holding %d tensors: building the decoding step, the cache "
             "opened into its tensors", type(inputs[where]).__name__, len(cache))
    return step, step_inputs, layout


def new_tokens(layout: StepLayout, bound: tuple[Any, ...]) -> int:
    """How many tokens a call ``bound`` to ``layout`` passes (its first tensor's second size; 0 where
    it has none)."""
    ids = bound[layout.tensors[0]] if layout.tensors else None
    return ids.shape[1] if isinstance(ids, torch.Tensor) and ids.dim() >= 2 else 0


def _check_prompt_kept(layout: StepLayout, inputs: tuple[Any, ...]) -> None:
    """Raise :class:`RecompileError` where a prefill's prompt is longer than a sliding window keeps
    whole (:attr:`StepLayout.longest`): its cache's count of the tokens seen parts from its keys'
    length, and the step's programs for other lengths would not answer alike."""
    if layout.longest is not None and new_tokens(layout, inputs) > layout.longest:
        raise RecompileError(
            f"the example prefill passes {new_tokens(layout, inputs)} tokens, more than the model's sliding window "
            f"keeps whole ({layout.longest}): a build is made for prompts its window keeps",
            fix=f"recompile the prefill of a prompt of at most {layout.longest} tokens; longer ones run the model's "
                "own forward")


def _longest_kept(cache: Any) -> int | None:
    """The longest cache whose next step keeps every token (see :attr:`StepLayout.longest`): two
    short of the narrowest sliding window among ``cache``'s layers, which keep its last tokens but
    one; None where no layer slides."""
    windows = [layer.sliding_window for layer in getattr(cache, "layers", ())
               if getattr(layer, "is_sliding", False) and type(getattr(layer, "sliding_window", None)) is int]
    return min(windows) - 2 if windows else None


def _check_structure_kept(step: CacheStep, inputs: tuple[torch.Tensor, ...], cache: Any, skeleton: str) -> None:
    """Raise :class:`RecompileError` where the step returns its cache with another structure than
    it was given, besides its tensors: the next step's cache would never be the built one's, and
    every step would run the original module, each after the build's checks. A sliding-window
    layer (Mistral's, Phi-3's, Gemma's) counts the tokens it has seen in a plain int, which is its
    keys' length (:data:`~.object_outputs.LENGTHS`) only until its window is full."""
    with torch.no_grad():
        output = step(*inputs)
    values = output.values() if isinstance(output, dict) else output if type(output) is tuple else ()
    returned = next((v for v in values if type(v) is type(cache)), None)
    found = opened(returned) if returned is not None else None
    if found is None or found[0] == skeleton:
        return
    parts = first_difference(skeleton, found[0])
    change = f"{parts[0]} became {parts[1]}" if parts else "its layers changed"
    window = _longest_kept(cache)
    full = window is not None and cache_length(cache) > window
    raise RecompileError(
        f"the model's decoding step returns its {type(cache).__name__} changed besides its tensors ({change}): a "
        "build is made for the cache's structure, and no later step's would match it"
        + (f" (its sliding window is full: a layer keeps {window + 1} tokens and counts the rest apart)"
           if full else ""),
        fix=(f"recompile a decoding step whose cache holds at most {window} tokens" if full else
             "recompile the model's first call, without a cache (use_cache=False), for the prefill; its decoding "
             "steps run the original module"))


def _over_cache_and_new(inputs: tuple[Any, ...], names: list[str], at: int, past: int) -> bool:
    """Whether ``inputs[at]`` is an attention mask over the cache's positions and the new tokens':
    named ``*attention_mask``, as long as the cache and its ``*input_ids`` (an encoder-decoder's
    ``attention_mask`` is over the encoder's tokens: its ``input_ids`` are not in a step's call)."""
    if at >= len(names) or not names[at].endswith("attention_mask"):
        return False
    ids_name = names[at].removesuffix("attention_mask") + "input_ids"
    ids = inputs[names.index(ids_name)] if ids_name in names[:len(inputs)] else None
    mask = inputs[at]
    return isinstance(ids, torch.Tensor) and ids.dim() == 2 and mask.dim() == 2 \
        and 0 < past and mask.shape[1] == past + ids.shape[1]


def _parts(mask: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A 2-D attention ``mask`` over the cache's positions and the new tokens' as those two parts
    (contiguous), or None where it is not one longer than the cache."""
    past = cache_length(cache)
    if mask.dim() != 2 or not 0 < past < mask.shape[1]:
        return None
    return mask[:, :past].contiguous(), mask[:, past:].contiguous()
