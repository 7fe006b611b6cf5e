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
its other values sit, and the cache's structure as text (:func:`~.object_outputs.opened`).
:func:`install` makes ``load_build``'s result: a copy of the user's model (sharing its submodules
and weights) whose ``forward`` is :func:`decoding_forward`, so that ``fast(...)``,
``fast.generate()`` and pipelines all go through it; the model itself is left as it was. A call that binds to the layout, with a cache of the built structure, runs the
step's region and writes the extended cache's attributes back into the caller's cache (the object
eager extends and returns); any other call (the prefill, whose cache is still empty) runs the
model's own forward.
"""

from __future__ import annotations

import inspect
import logging
import sys
import weakref
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from cuvil_pgc.errors import BuildError, RecompileError
from cuvil_pgc.recompile.call_binding import bind_call
from cuvil_pgc.recompile.object_outputs import ObjectLeaf, opened, unchanged

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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Any, path: str) -> StepLayout:
        try:
            layout = cls(count=int(doc["count"]), tensors=tuple(int(i) for i in doc["tensors"]),
                         cache=int(doc["cache"]), constants=tuple(doc["constants"]), skeleton=str(doc["skeleton"]),
                         split=tuple(int(i) for i in doc.get("split", ())),
                         longest=None if doc.get("longest") is None else int(doc["longest"]))
            ok = len(layout.constants) == layout.count and all(
                0 <= i < layout.count for i in (*layout.tensors, layout.cache)) and all(
                isinstance(v, _CONSTANTS) for v in layout.constants) and set(layout.split) <= set(layout.tensors)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise BuildError("the plan's cache_step is not a decoding step's layout", path=path,
                             fix="rebuild the package with `cuvil-pgc recompile`")
        return layout

    def tensors_of(self, bound: tuple[Any, ...], cache: Any, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, ...] | None:
        """The step's inputs for a call bound to the layout (``cache`` and its ``tensors``), or
        None where it holds other values than the built call did."""
        for i, value in enumerate(bound):
            if i in self.tensors:
                if not isinstance(value, torch.Tensor):
                    return None
            elif i != self.cache:
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
        return (*inputs, *tensors)


class CacheStep(nn.Module):
    """``model``'s call with its cache opened: ``forward`` takes the call's tensors, then the
    cache's (the layout's order), and calls the model's class forward with a new cache built around
    them (the instance's ``forward`` is :func:`decoding_forward` once loaded). A profile of the
    model is matched to the step's submodules under ``profiled_path``."""

    profiled_path = "model"

    def __init__(self, model: nn.Module, layout: StepLayout, leaf: ObjectLeaf | None = None) -> None:
        super().__init__()
        self.model = model
        self.training = model.training
        # private: neither a setting nor part of the structure (the plan holds the layout). The
        # cache's rebuild is held in a list that the copies apply_plan makes share: a loaded step
        # takes it from its first call's cache (decoding_forward)
        self._layout = layout
        self._leaf: list[ObjectLeaf | None] = [leaf]
        self._forward = type(model).forward

    def static_dimensions(self, args: tuple[Any, ...]) -> dict[int, set[int]]:
        """The dimensions of the step's inputs an export keeps at their size. The new tokens'
        count where it is one: Hugging Face's attention tests ``q_length > 1`` as a Python bool, and
        the ONNX exporter's free sizes made that a symbol it refused ("is_causal must be bool, not
        SymBool"). The cache's heads and head size (all but the batch and the length, second to
        last, where Hugging Face's layers append): the ONNX exporter left them free, and where one
        was captured equal to the length (a head size of 32 beside 32 cached tokens) the length
        varied with it, failed, and stayed fixed."""
        calls = len(self._layout.tensors) + len(self._layout.split)
        static = {k: {1} for k, a in enumerate(args[:calls])
                  if isinstance(a, torch.Tensor) and a.dim() >= 2 and a.shape[1] == 1}
        static.update({k: set(range(1, a.dim() - 2)) | {a.dim() - 1} for k, a in enumerate(args) if k >= calls
                       and isinstance(a, torch.Tensor) and a.dim() >= 3})
        return static

    def size_ceilings(self, args: tuple[Any, ...]) -> dict[tuple[int, int], int]:
        """The dimensions of the step's inputs whose sizes its program for other sizes is checked
        up to the model's positions (at most :data:`LONGEST_CHECKED`, and at most the longest cache
        a sliding window keeps whole, :attr:`StepLayout.longest`), not the default few times the
        captured size: the cache's length (second to last) and the mask's part over it. A
        program checked up to 16 times a 32-token prompt ran every step after 512 tokens through
        the original module, where it was still 1.65x faster at 900."""
        config = getattr(self.model, "config", None)
        limits = [v for v in (getattr(config, name, None) for name in _POSITIONS) if type(v) is int and v > 0]
        longest = min([LONGEST_CHECKED, *limits, *[n for n in (self._layout.longest,) if n is not None]])
        layout, k, out = self._layout, 0, {}
        for i in layout.tensors:
            if i in layout.split:
                out[(k, 1)] = longest
                k += 2
            else:
                k += 1
        out.update({(j, a.dim() - 2): longest for j, a in enumerate(args) if j >= k
                    and isinstance(a, torch.Tensor) and a.dim() >= 3})
        return out

    def forward(self, *tensors: torch.Tensor) -> Any:
        layout, leaf = self._layout, self._leaf[0]
        if leaf is None:
            raise RuntimeError("CacheStep has no cache to rebuild: it is called only by decoding_forward")
        args, taken = list(layout.constants), iter(tensors)
        for i in layout.tensors:
            args[i] = torch.cat([next(taken), next(taken)], dim=1) if i in layout.split else next(taken)
        args[layout.cache] = leaf.build(list(taken))
        return self._forward(self.model, *args)


def cache_position(inputs: tuple[Any, ...]) -> int | None:
    """The position of the Hugging Face cache among a call's positional inputs, or None."""
    cache = getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)
    if not isinstance(cache, type):
        return None
    found = [i for i, v in enumerate(inputs) if isinstance(v, cache)]
    return found[0] if len(found) == 1 else None


def around_cache(model: nn.Module, inputs: tuple[Any, ...]) -> tuple[nn.Module, tuple[Any, ...], StepLayout | None]:
    """``model`` and its positional ``inputs``, as the :class:`CacheStep` and its tensors where
    the call passes a Hugging Face cache that holds keys already (a decoding step); as they are
    otherwise (an empty cache, or other values than tensors and flags beside it, are left to
    :mod:`.stateless`, which refuses a call that changes an object it is given)."""
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
    found = opened(inputs[where])
    leaf = ObjectLeaf.of(inputs[where])
    others = [i for i in range(len(inputs)) if i != where]
    if found is None or leaf is None or not found[1] or any(
            not isinstance(inputs[i], (torch.Tensor, *_CONSTANTS)) for i in others):
        return model, inputs, None
    skeleton, cache = found
    tensors = tuple(i for i in others if isinstance(inputs[i], torch.Tensor))
    names = [name for name, _ in _parameters(model)]
    split = tuple(i for i in tensors if i < len(names) and names[i].endswith("attention_mask")
                  and _parts(inputs[i], inputs[where]) is not None)
    layout = StepLayout(count=len(inputs), tensors=tensors, cache=where,
                        constants=tuple(None if i in tensors or i == where else inputs[i] for i in range(len(inputs))),
                        skeleton=skeleton, split=split, longest=_longest_kept(inputs[where]))
    step_inputs = layout.tensors_of(inputs, inputs[where], cache)
    if step_inputs is None:
        return model, inputs, None
    step = CacheStep(model, layout, leaf)
    _check_structure_kept(step, step_inputs, inputs[where], skeleton)
    log.info("cuvil-pgc: the example call passes a %s holding %d tensors: building the decoding step, the cache "
             "opened into its tensors", type(inputs[where]).__name__, len(cache))
    return step, step_inputs, layout


def _longest_kept(cache: Any) -> int | None:
    """The longest cache whose next step keeps every token (see :attr:`StepLayout.longest`): two
    short of the narrowest sliding window among ``cache``'s layers, which keep its last tokens but
    one; None where no layer slides."""
    windows = [layer.sliding_window for layer in getattr(cache, "layers", ())
               if getattr(layer, "is_sliding", False) and type(getattr(layer, "sliding_window", None)) is int]
    return min(windows) - 2 if windows else None


def as_generate_calls(model: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """A decoding step's positional ``inputs`` completed as ``generate()`` passes them where the
    model's forward takes them and the call leaves them out: ``position_ids`` counted along the
    attention mask (a padded position counts none), the new tokens' last ones, and
    ``logits_to_keep=1``. A step built without them matched none of ``generate()``'s calls, once its
    forward showed the model's parameters (it must: ``generate()`` reads them to decide what to pass,
    and without position ids a left-padded GPT-2 batch answered otherwise than eager's)."""
    params = _parameters(model)
    names = [name for name, _ in params]
    filled = list(inputs)

    def put(name: str, value: Any) -> None:
        at = names.index(name)
        filled.extend(default for _, default in params[len(filled):at + 1])
        filled[at] = value
    mask = filled[names.index("attention_mask")] if "attention_mask" in names[:len(filled)] else None
    ids = filled[0] if filled and isinstance(filled[0], torch.Tensor) and filled[0].dim() == 2 else None
    if "position_ids" in names and (len(filled) <= names.index("position_ids") or
                                    filled[names.index("position_ids")] is None) \
            and isinstance(mask, torch.Tensor) and mask.dim() == 2 and ids is not None:
        counted = (mask.long().cumsum(-1) - 1).masked_fill(mask == 0, 0)
        put("position_ids", counted[:, -ids.shape[1]:].contiguous())
    at = names.index("logits_to_keep") if "logits_to_keep" in names else -1
    if at >= 0 and (len(filled) <= at or type(filled[at]) is int and filled[at] == params[at][1]):
        put("logits_to_keep", 1)         # (a tensor of positions to keep is left as the call has it)
    return tuple(filled)


def as_built(bound: tuple[Any, ...], names: list[str], layout: StepLayout) -> tuple[Any, ...] | None:
    """A call ``bound`` to the layout's positions with what it leaves out and the built call holds
    filled in as the model reads it left out: no attention mask is one over every position
    (``generate()`` drops an all-ones mask), and the ``position_ids`` of a call that pads nothing
    count on from the cache's length (a padded row counts along its mask, which ``generate()``
    does and passes); ``logits_to_keep`` as built where both keep every new token's logits. None
    where a call leaves the position ids out over padding (the model's own forward answers it)."""
    ids = bound[layout.tensors[0]] if layout.tensors else None
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return bound
    built = names[:layout.count]
    out, (batch, new) = list(bound), ids.shape
    past = _length(out[layout.cache])
    at = built.index("attention_mask") if "attention_mask" in built else -1
    if at in layout.tensors and out[at] is None:
        out[at] = torch.ones(batch, past + new, dtype=torch.long, device=ids.device)
    at = built.index("position_ids") if "position_ids" in built else -1
    if at in layout.tensors and out[at] is None:
        mask = out[built.index("attention_mask")] if "attention_mask" in built else None
        if isinstance(mask, torch.Tensor) and not bool(mask.all()):
            return None
        out[at] = torch.arange(past, past + new, device=ids.device).expand(batch, new).contiguous()
    at = built.index("logits_to_keep") if "logits_to_keep" in built else -1
    want = layout.constants[at] if at >= 0 else None
    if type(want) is int and type(out[at]) is int and out[at] != want \
            and all(k == 0 or k >= new for k in (want, out[at])):       # both: every new token's logits
        out[at] = want
    return tuple(out)


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
    before, after = skeleton.split(", "), found[0].split(", ")
    change = next((f"{a} became {b}" for a, b in zip(before, after, strict=False) if a != b), "its layers changed")
    window = _longest_kept(cache)
    full = window is not None and _length(cache) > window
    raise RecompileError(
        f"the model's decoding step returns its {type(cache).__name__} changed besides its tensors ({change}): a "
        "build is made for the cache's structure, and no later step's would match it"
        + (f" (its sliding window is full: a layer keeps {window + 1} tokens and counts the rest apart)"
           if full else ""),
        fix=(f"recompile a decoding step whose cache holds at most {window} tokens" if full else
             "recompile the model's first call, without a cache (use_cache=False), for the prefill; its decoding "
             "steps run the original module"))


def _parameters(model: nn.Module) -> list[tuple[str, Any]]:
    """(name, default) of the parameters of ``model``'s class forward a call may pass by position."""
    params = list(inspect.signature(type(model).forward).parameters.values())[1:]
    return [(p.name, p.default) for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def _parts(mask: torch.Tensor, cache: Any) -> tuple[torch.Tensor, torch.Tensor] | None:
    """A 2-D attention ``mask`` over the cache's positions and the new tokens' as those two parts
    (contiguous), or None where it is not one longer than the cache."""
    past = _length(cache)
    if mask.dim() != 2 or not 0 < past < mask.shape[1]:
        return None
    return mask[:, :past].contiguous(), mask[:, past:].contiguous()


def install(model: nn.Module, step: CacheStep, region: nn.Module) -> nn.Module:
    """A copy of ``model`` (sharing its submodules, weights and config, as
    :func:`~.apply.apply_plan`'s) whose ``forward`` is :func:`decoding_forward` over ``region``
    (the loaded build of ``step``); ``model`` itself runs as it did."""
    import copy

    out = copy.copy(model)
    out._modules = dict(model._modules)        # as apply_plan's: a submodule set on the copy is the copy's
    out.forward = decoding_forward(out, step, region)      # a function: nn.Module keeps it as an attribute
    return out


def own_model(model: Any) -> Any:
    """The model :func:`install` copied ``model`` from, or ``model`` where it is no such copy: a
    build loaded onto what ``load_build`` returned applies to the model, not to the copy's forward."""
    step = getattr(getattr(model, "__dict__", {}).get("forward"), "step", None)
    return step.model if isinstance(step, CacheStep) else model


def decoding_forward(model: nn.Module, step: CacheStep, region: nn.Module) -> Any:
    """The forward a loaded decoding step's model runs: the step's ``region`` for a call that binds
    to its layout, with a cache of the built structure, written back into that cache; the model's
    class forward for any other call."""
    layout = step._layout
    original = type(model).forward
    params = _parameters(model)
    names = [name for name, _ in params]
    runs, longest = _sizes_run(region, layout), layout.longest
    last: list[Any] = [None]     # (a weak reference to the cache written back last, what holds its tensors, they)

    def forward(*args: Any, **kwargs: Any) -> Any:
        bound = bind_call(params, model, args, kwargs, layout.count)
        if bound is not None:
            bound = as_built(bound, names, layout)
        if bound is None:
            return original(model, *args, **kwargs)
        cache, ids = bound[layout.cache], bound[layout.tensors[0]]
        past = _length(cache)
        batch = ids.shape[0] if isinstance(ids, torch.Tensor) and ids.dim() else None
        if past and (longest is not None and past > longest
                     or runs is not None and batch is not None and not _within(runs, batch, past)):
            # a step the build does not run: the region would run the original module, after opening
            # the cache and its checks (6% slower than eager at 900 tokens of a 4-layer Llama)
            forward.outside_calls += 1          # type: ignore[attr-defined]
            if forward.outside_calls == 1:      # type: ignore[attr-defined]
                log.warning("cuvil-pgc: a decoding step at batch %s with a cache of %d tokens runs the model's own "
                            "forward: its build runs %s (further such steps are counted in forward.outside_calls)",
                            batch, past, _runs_text(runs, longest))
            return original(model, *args, **kwargs)
        entry = last[0]                  # read once: another thread's step may replace it
        if entry is not None and entry[0]() is cache and unchanged(entry[1]):     # written back last step, as left
            tensors = entry[2]
        else:
            found = opened(cache)
            tensors = found[1] if found is not None and found[0] == layout.skeleton else None
        inputs = layout.tensors_of(bound, cache, tensors) if tensors is not None else None
        if inputs is None:
            return original(model, *args, **kwargs)
        if step._leaf[0] is None:      # the same structure rebuilds alike whichever cache it is taken from
            step._leaf[0] = ObjectLeaf.of(cache)
        out = _written_back(region(*inputs), cache)
        # the next step's call passes this cache again: telling that nothing in it was rebound costs a
        # few identity comparisons, where opening it and writing its structure took 10 µs a layer
        _remember(last, cache, step._leaf[0].held(cache))
        return out

    # generate() reads the forward's parameters to decide what it passes (position ids, logits_to_keep)
    signature = inspect.signature(original)
    forward.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])  # type: ignore[attr-defined]
    forward.region = region      # type: ignore[attr-defined]  # its counters: fast.forward.region.fallback_calls
    forward.step = step          # type: ignore[attr-defined]
    forward.outside_calls = 0    # type: ignore[attr-defined]  # steps at a batch or cache length the build does not run
    return forward


def _remember(last: list[Any], cache: Any, held: tuple[list[Any], list[torch.Tensor]] | None) -> None:
    """Keep ``held`` (:meth:`~.object_outputs.ObjectLeaf.held` of ``cache``) in ``last`` for the next
    step's call, for only as long as ``cache`` lives: a finished generation's cache, and the tensors
    it holds, are not kept alive by it."""
    entry = last[0]
    if held is None:
        last[0] = None
        return
    if entry is not None and entry[0]() is cache:
        last[0] = (entry[0], *held)
        return

    def forget(ref: Any) -> None:
        if last[0] is not None and last[0][0] is ref:
            last[0] = None
    try:
        last[0] = (weakref.ref(cache, forget), *held)
    except TypeError:                  # a cache that takes no weak references is opened every step
        last[0] = None


def _sizes_run(region: nn.Module, layout: StepLayout) -> tuple[tuple[int, int], tuple[int, int]] | None:
    """The batches and cache lengths ``region`` (a whole step's program) runs, each (smallest,
    largest): the ranges its program for other sizes was checked and timed at (see
    :mod:`.size_speed`; a size that stays fixed, that size alone); None where the region is no such
    program."""
    other = getattr(region, "other_shapes", None)
    calls = len(layout.tensors) + len(layout.split)
    if other is None or len(other.inputs) <= calls:
        return None
    first, cache = other.inputs[0], other.inputs[calls]
    if not (isinstance(first, tuple) and isinstance(cache, tuple) and first[1] and len(cache[1]) >= 2):
        return None

    def span(size: Any) -> tuple[int, int]:
        return (size, size) if type(size) is int else tuple(other.ranges.get(size, (0, 1 << 62)))
    return span(first[1][0]), span(cache[1][-2])


def _runs_text(runs: tuple[tuple[int, int], tuple[int, int]] | None, longest: int | None) -> str:
    """What steps a build runs, for the warning of one it does not."""
    if runs is not None:
        top = runs[1][1] if longest is None else min(runs[1][1], longest)
        return f"batches {runs[0][0]}-{runs[0][1]} and caches of {runs[1][0]}-{top} tokens"
    return f"caches of up to {longest} tokens (its sliding window's, less the new token's place)"


def _within(runs: tuple[tuple[int, int], tuple[int, int]], batch: int, past: int) -> bool:
    """Whether a step's ``batch`` (its first tensor's) and cache length ``past`` are among those ``runs``."""
    (b_lo, b_hi), (l_lo, l_hi) = runs
    return b_lo <= batch <= b_hi and l_lo <= past <= l_hi


def _length(cache: Any) -> int:
    """How many tokens a Hugging Face cache holds (0 where it cannot say)."""
    try:
        return int(cache.get_seq_length())
    except Exception:       # not a Hugging Face cache, or one whose method raises: the checks decide
        return 0


def _written_back(output: Any, cache: Any) -> Any:
    """``output`` with its cache (a new object of ``cache``'s class) replaced by ``cache`` holding
    what it holds: eager extends the cache it is given and returns it."""
    kind = type(cache)
    if isinstance(output, dict):        # a ModelOutput (an OrderedDict) or a dict
        keys = [k for k, v in output.items() if type(v) is kind]
        for k in keys:
            output[k] = _refill(cache, output[k])
        return output
    if type(output) is tuple:            # return_dict=False
        return tuple(_refill(cache, v) if type(v) is kind else v for v in output)
    return output


def _refill(cache: Any, new: Any) -> Any:
    """``cache``, holding what ``new`` holds."""
    if new is not cache:
        vars(cache).clear()
        vars(cache).update(vars(new))
    return cache
