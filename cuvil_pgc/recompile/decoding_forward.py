"""What a loaded decoding step's model runs (see :mod:`.cache_step`, which builds the step).

:func:`install` makes ``load_build``'s result for a decoding step: a copy of the user's model
(sharing its submodules and weights) whose ``forward`` is :func:`decoding_forward`, so that
``fast(...)``, ``fast.generate()`` and pipelines all go through it; the model itself is left as it
was. A call that binds to the step's layout, with a cache of the built structure, runs the step's
region and writes the extended cache's attributes back into the caller's cache (the object eager
extends and returns); a step at a batch or cache length the build does not run, and any other call,
run the model's own forward. A prefill's build (the call with the cache still empty) is loaded the
same way and fills the caller's empty cache; loaded onto a decoding step's model (or the reverse),
each runs its own kind of call, the other build the rest.
"""

from __future__ import annotations

import inspect
import logging
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from cuvil_pgc.recompile.cache_step import CacheStep, StepLayout, new_tokens
from cuvil_pgc.recompile.call_binding import bind_call
from cuvil_pgc.recompile.generate_calls import (
    as_built,
    cache_length,
    cache_position,
    class_parameters,
    flag_positions,
)
from cuvil_pgc.recompile.object_outputs import first_difference, opened, structure, unchanged

log = logging.getLogger(__name__)

#: the key, in the ``__dict__`` of a copy that a loaded build returned, of the model it was made from
#: (see :func:`own_model`): not an attribute nn.Module would take for a submodule of the copy
MODEL = "cuvil_model"


def install(model: nn.Module, step: CacheStep, region: nn.Module, other: Any = None) -> nn.Module:
    """A copy of ``model`` (the model ``step`` is of, or a copy of it a build returned: sharing its
    submodules, weights and config, as :func:`~.apply.apply_plan`'s) whose ``forward`` is
    :func:`decoding_forward` over ``region`` (the loaded build of ``step``); ``model`` itself runs
    as it did. Calls that are not ``step``'s run ``other`` (:func:`other_kind`: the loaded forward
    of the other kind of call, a prefill's build where ``step`` is a decoding step's, or the
    reverse) where one is given."""
    out = without_forward(model)
    out.__dict__[MODEL] = step.model
    if other is not None:       # anew, its own counters: not chained to a build of step's kind it ran beside
        other = decoding_forward(out, other.step, other.region)
    out.forward = decoding_forward(out, step, region, other)    # a function: nn.Module keeps it as an attribute
    return out


def without_forward(model: nn.Module) -> nn.Module:
    """A copy of ``model`` without a loaded forward of its own (the class's runs), sharing its
    submodules (a submodule set on the copy is the copy's, as :func:`~.apply.apply_plan`'s)."""
    import copy

    out = copy.copy(model)
    out._modules = dict(model._modules)
    out.__dict__.pop("forward", None)
    return out


def other_kind(given: Any, prefill: bool) -> Callable[..., Any] | None:
    """The loaded forward in ``given`` (a model :func:`install` made, or any) that runs the other
    kind of call than ``prefill`` says, or None."""
    forward = getattr(given, "__dict__", {}).get("forward")
    while forward is not None and isinstance(getattr(forward, "step", None), CacheStep):
        if forward.step.layout.prefill != prefill:
            return forward
        forward = forward.otherwise
    return None


def own_model(model: Any) -> Any:
    """The model a copy that ``load_build`` returned (:func:`install`'s, or
    :func:`~.encoder_build.with_encoder`'s) was made from, or ``model`` where it is no such copy: a
    build loaded onto such a copy is checked against, and built onto, the model itself."""
    return getattr(model, "__dict__", {}).get(MODEL, model)


def decoding_forward(model: nn.Module, step: CacheStep, region: nn.Module,
                     otherwise: Callable[..., Any] | None = None) -> Any:
    """The forward a loaded decoding step's model runs: the step's ``region`` for a call that binds
    to its layout, with a cache of the built structure, written back into that cache; ``otherwise``
    (the other kind of call's build, see :func:`install`) or the model's class forward for any
    other call."""
    layout = step.layout
    original = type(model).forward

    def fallback(*args: Any, **kwargs: Any) -> Any:
        return original(model, *args, **kwargs) if otherwise is None else otherwise(*args, **kwargs)
    params = class_parameters(model)
    names = [name for name, _ in params]
    runs, longest = _sizes_run(region, layout), layout.longest
    config, flags = getattr(model, "config", None), flag_positions(names, layout)
    last: list[Any] = [None]     # (a weak reference to the cache written back last, what holds its tensors, they)
    memo: list[Any] = [None] * len(layout.objects)     # the objects opened last (StepLayout.tensors_of)

    def counted(counter: str, message: Callable[[], str]) -> None:
        """Count a decoding step that runs the model's own forward in ``forward.<counter>``, and say
        ``message()`` for the first."""
        setattr(forward, counter, getattr(forward, counter) + 1)
        if getattr(forward, counter) == 1:
            log.warning("cuvil-pgc: %s (further such calls are counted in forward.%s)", message(), counter)

    def unmatched(past: int, why: Callable[[], str]) -> None:
        """A decoding step (a prefill where ``past`` is 0) the build was not made for."""
        what, kind = (f"a decoding step with a cache of {past} tokens", "step") if past else ("a prefill", "prefill")
        counted("unmatched_calls", lambda: f"{what} runs the model's own forward: {why()}; recompile a {kind} "
                                           "called this way")

    def prefill(bound: tuple[Any, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        cache = bound[layout.cache]
        if cache_length(cache):                 # a decoding step
            return fallback(*args, **kwargs)
        tokens, ids = new_tokens(layout, bound), bound[layout.tensors[0]]
        batch = ids.shape[0] if isinstance(ids, torch.Tensor) and ids.dim() else None
        if longest is not None and tokens > longest or runs is not None and batch is not None \
                and not _within(runs, batch, tokens):
            # a prompt the build does not run: the region would run the original module after its checks
            counted("outside_calls", lambda: f"a prefill at batch {batch} of {tokens} tokens runs the model's own "
                                             f"forward: its build runs {_runs_text(runs, longest, 'prompts')}")
            return fallback(*args, **kwargs)
        inputs = layout.tensors_of(bound, cache, [], memo) if structure(cache) == layout.skeleton else None
        if inputs is None:
            unmatched(0, lambda: unmatched_reason(layout, names, bound, cache))
            return fallback(*args, **kwargs)
        step.learn(cache, bound)
        return _written_back(region(*inputs), cache)

    def forward(*args: Any, **kwargs: Any) -> Any:
        bound = bind_call(params, model, args, kwargs, layout.count)
        built = as_built(bound, names, layout, config, flags) if bound is not None else None
        if built is None:
            values = (*args, *kwargs.values())
            where = cache_position(values)
            past = cache_length(values[where]) if where is not None else 0
            if where is not None and (past == 0) == layout.prefill:     # the kind of call the build is for
                unmatched(past, lambda: _unbound_reason(names, layout, args, kwargs) if bound is None else
                          "it leaves position_ids out over a padded attention mask (the model counts them from the "
                          "cache's length, generate() along the mask): pass them")
            return fallback(*args, **kwargs)
        if layout.prefill:
            return prefill(built, args, kwargs)
        bound = built
        cache, ids = bound[layout.cache], bound[layout.tensors[0]]
        past = cache_length(cache)
        batch = ids.shape[0] if isinstance(ids, torch.Tensor) and ids.dim() else None
        if past and (longest is not None and past > longest
                     or runs is not None and batch is not None and not _within(runs, batch, past)):
            # a step the build does not run: the region would run the original module, after opening
            # the cache and its checks (6% slower than eager at 900 tokens of a 4-layer Llama)
            counted("outside_calls", lambda: f"a decoding step at batch {batch} with a cache of {past} tokens runs "
                                             f"the model's own forward: its build runs "
                                             f"{_runs_text(runs, longest, 'caches')}")
            return fallback(*args, **kwargs)
        entry = last[0]                  # read once: another thread's step may replace it
        if entry is not None and entry[0]() is cache and unchanged(entry[1]):     # written back last step, as left
            tensors = entry[2]
        else:
            found = opened(cache)
            tensors = found[1] if found is not None and found[0] == layout.skeleton else None
        inputs = layout.tensors_of(bound, cache, tensors, memo) if tensors is not None else None
        if inputs is None:
            if past:                   # a decoding step the build was not made for: say why, once
                unmatched(past, lambda: unmatched_reason(layout, names, bound, cache))
            return fallback(*args, **kwargs)
        leaf = step.learn(cache, bound)
        out = _written_back(region(*inputs), cache)
        # the next step's call passes this cache again: telling that nothing in it was rebound costs a
        # few identity comparisons, where opening it and writing its structure took 10 µs a layer
        _remember(last, cache, leaf.held(cache) if leaf is not None else None)
        return out

    # generate() reads the forward's parameters to decide what it passes (position ids, logits_to_keep)
    signature = inspect.signature(original)
    forward.__signature__ = signature.replace(parameters=list(signature.parameters.values())[1:])  # type: ignore[attr-defined]
    forward.region = region      # type: ignore[attr-defined]  # its counters: fast.forward.region.fallback_calls
    forward.step = step          # type: ignore[attr-defined]
    forward.otherwise = otherwise    # type: ignore[attr-defined]  # the other kind of call's loaded forward
    forward.outside_calls = 0    # type: ignore[attr-defined]  # calls at a batch or length the build does not run
    forward.unmatched_calls = 0  # type: ignore[attr-defined]  # calls of its kind made otherwise than the build's
    return forward


def _unbound_reason(names: list[str], layout: StepLayout, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """Why a call does not bind to the layout's positions: the arguments past them."""
    if len(args) > layout.count:
        return f"it passes {len(args)} arguments by position where the build's call takes {layout.count}"
    extra = [k for k in kwargs if k not in names[:layout.count]]
    return (f"it passes {', '.join(f'{k}={kwargs[k]!r}' for k in extra[:3])} beyond the built call's arguments"
            if extra else "its arguments do not bind to the built call's")


def unmatched_reason(layout: StepLayout, names: list[str], bound: tuple[Any, ...], cache: Any) -> str:
    """Why a decoding step's call ``bound`` (with a cache holding tokens; a prefill's, with its empty
    cache) is not the built one's: the first difference a user can act on (a flag passed otherwise,
    the cache's structure)."""
    found = (structure(cache), []) if layout.prefill else opened(cache)
    if found is None or found[0] is None:
        return f"its {type(cache).__name__} cannot be opened into tensors"
    if found[0] != layout.skeleton:
        parts = first_difference(layout.skeleton, found[0])
        change = f"{parts[1]} where the build's has {parts[0]}" if parts else "another number of layers"
        return f"its cache's structure is not the built one's ({change})"
    objects = {i: n for i, _, n in layout.objects}
    for i, value in enumerate(bound):
        name = names[i] if i < len(names) else f"argument {i}"
        if i in layout.tensors and not isinstance(value, torch.Tensor):
            return f"it passes {name}={value!r} where the build was made for a tensor"
        if i in objects and value is not None and not isinstance(value, torch.Tensor):
            continue
        if i not in layout.tensors and i != layout.cache and i not in objects:
            want = layout.constants[i]
            if type(value) is not type(want) or value != want:
                return f"it passes {name}={value!r} where the build was made for {want!r}"
    if layout.split:
        return "its attention mask is not over the cache's tokens and the new ones, as the built call's was"
    return "its " + " or ".join(names[i] for i in objects) + " is not laid out as the built call's" if objects \
        else "its inputs are not laid out as the built call's"


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
    """The batches and cache lengths (a prefill's: prompt lengths) ``region`` (a whole step's
    program) runs, each (smallest, largest): the ranges its program for other sizes was checked and
    timed at (see :mod:`.size_speed`; a size that stays fixed, that size alone); None where the
    region is no such program."""
    other = getattr(region, "other_shapes", None)
    calls = layout.call_tensors
    if other is None or len(other.inputs) < calls + (0 if layout.prefill else 1):
        return None
    first = other.inputs[0]
    if layout.prefill:          # the prompt's length: its tokens' second size
        length = first[1][1] if isinstance(first, tuple) and len(first[1]) >= 2 else None
    else:                       # the cache's: its first tensor's second to last
        cache = other.inputs[calls]
        length = cache[1][-2] if isinstance(cache, tuple) and len(cache[1]) >= 2 else None
    if not (isinstance(first, tuple) and first[1] and length is not None):
        return None

    def span(size: Any) -> tuple[int, int]:
        return (size, size) if type(size) is int else tuple(other.ranges.get(size, (0, 1 << 62)))
    return span(first[1][0]), span(length)


def _runs_text(runs: tuple[tuple[int, int], tuple[int, int]] | None, longest: int | None, what: str) -> str:
    """What steps (``what``: "caches") or prefills ("prompts") a build runs, for the warning of one
    it does not."""
    if runs is not None:
        top = runs[1][1] if longest is None else min(runs[1][1], longest)
        return f"batches {runs[0][0]}-{runs[0][1]} and {what} of {runs[1][0]}-{top} tokens"
    return f"{what} of up to {longest} tokens (its sliding window's, less the new token's place)"


def _within(runs: tuple[tuple[int, int], tuple[int, int]], batch: int, past: int) -> bool:
    """Whether a step's ``batch`` (its first tensor's) and cache length ``past`` (a prefill's prompt
    length) are among those ``runs``."""
    (b_lo, b_hi), (l_lo, l_hi) = runs
    return b_lo <= batch <= b_hi and l_lo <= past <= l_hi


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
