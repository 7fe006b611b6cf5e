"""How a call of a loaded region compares with the call its build was captured with.

A :class:`~.realized.CompiledRegion` runs its program only for a call with the captured inputs:
:func:`matches` says whether one has them, :func:`spec_misfit` why not (for the region's one
warning), and :func:`bind_call` maps a keyword call (``model(input_ids=ids, attention_mask=mask)``)
onto the captured positional one (``model(ids, mask)``) by the original forward's parameters.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch
from torch import nn

from cuvil_pgc._example_inputs import HF_OUTPUT_FLAGS
from cuvil_pgc.recompile.matching import input_signature

#: the types of a positional input a region's program holds as the value it was captured with (a
#: Hugging Face call's ``use_cache=False``): a call must pass the same value, of the same type
CAPTURED_VALUES = (bool, int, float, str)

#: more Python numbers than this in one argument are a call's data (token ids a service passes as
#: lists), not its configuration (an output size ``[7, 7]``, a detector's image sizes)
CONFIG_NUMBERS = 32
#: a string longer than this is text, as one holding whitespace is (not a flag such as ``"mean"``,
#: a feature map's name ``"0"``)
CONFIG_CHARS = 32


def payload_input(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
    """What in a captured call is a request's data held in Python values, which a program would
    hold as constants and so answer only for the captured request (None where nothing is): text (a
    string holding whitespace or longer than :data:`CONFIG_CHARS`), bytes, or more than
    :data:`CONFIG_NUMBERS` numbers in one argument. A text classifier whose forward tokenized its
    ``list[str]`` argument in Python was built as one ONNX Runtime program holding the captured
    texts' logits, 16.55x eager by the search's figures, and ran its original module for every other
    text a service sent. (Short names and few numbers stay configuration: a Faster R-CNN's feature
    map names and image sizes, checked on 147 models of earlier sessions' unseen sets.)"""
    def text(value: Any) -> str | None:
        if isinstance(value, (bytes, bytearray)):
            return f"{type(value).__name__} ({len(value)})"
        if isinstance(value, str) and (len(value) > CONFIG_CHARS or any(c.isspace() for c in value)):
            return f"text ({value[:40]!r})"
        return next((found for v in _held(value) if (found := text(v)) is not None), None)

    def numbers(value: Any) -> int:
        return 1 if type(value) in (int, float) else sum(numbers(v) for v in _held(value))

    for value in (*args, *kwargs.values()):
        if (found := text(value)) is not None:
            return found
        if (count := numbers(value)) > CONFIG_NUMBERS:
            return f"{count} Python numbers in a {type(value).__name__}"
    return None


def _held(value: Any) -> Any:
    """The values a list, tuple or dict holds (a ``torch.Size`` is a size, not a container); none
    for anything else."""
    if isinstance(value, dict):
        return value.values()
    return value if isinstance(value, (list, tuple)) and not isinstance(value, torch.Size) else ()


#: per positional tensor input: (shape, dtype, device, strides)
Spec = list[tuple[torch.Size, torch.dtype, torch.device, tuple[int, ...]]]


def matches(spec: Spec | None, signature: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether a call has the captured inputs: positional tensors of ``spec``, or (captured with
    other than positional tensors) the captured input ``signature``."""
    if spec is None or kwargs or len(args) != len(spec):
        return input_signature((args, kwargs)) == signature
    for a, (shape, dtype, device, strides) in zip(args, spec, strict=True):
        if not isinstance(a, torch.Tensor) or a.shape != shape or a.dtype != dtype or a.device != device \
                or a.stride() != strides:
            return False
    return True


def in_captured_layout(spec: Spec | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
    """The call's tensors copied into the captured layout where they differ from the captured
    inputs in it alone: a slice or a transpose of the captured shape, channels_last images for a
    build captured with contiguous ones, or the reverse. A program is built for its inputs' strides,
    and a copy costs less than running the original module (which every such call did, the whole
    speedup lost to a warning). None where the call differs otherwise, or the captured layout is
    neither contiguous nor channels_last."""
    if spec is None or kwargs or len(args) != len(spec):
        return None
    laid = []
    for a, (shape, dtype, device, strides) in zip(args, spec, strict=True):
        if type(a) is not torch.Tensor or a.shape != shape or a.dtype != dtype or a.device != device:
            return None
        if a.stride() != strides:
            layout = _memory_format(shape, strides)
            if layout is None:
                return None
            a = a.contiguous(memory_format=layout)
        laid.append(a)
    return tuple(laid)


@functools.lru_cache(maxsize=256)
def _memory_format(shape: torch.Size, strides: tuple[int, ...]) -> torch.memory_format | None:
    """The memory format whose strides ``strides`` are for ``shape`` (contiguous, channels_last), or
    None; cached: a service sends the same few layouts, and the meta tensors it tries took 4.5 µs
    for a channels_last image (0.1 µs cached)."""
    formats = [torch.contiguous_format] + ([torch.channels_last] if len(shape) == 4 else [])
    return next((f for f in formats if torch.empty(shape, device="meta", memory_format=f).stride() == tuple(strides)),
                None)


def spec_misfit(spec: Spec | None, args: tuple[Any, ...], kwargs: dict[str, Any],
                params: list[tuple[str, Any]] | None = None, sizes_refused: str | None = None) -> str:
    """Why a call does not have the captured inputs (the first difference found); ``params``: the
    original forward's (name, default) pairs, which name the keywords past the captured inputs;
    ``sizes_refused``: why a build made for other sizes has no program for them (None: it was not
    made for them)."""
    if spec is None:
        return ("the call's inputs differ from the captured ones (types, shapes, dtypes, keyword arguments, or the "
                "value of a Python number, string or flag, which the program holds as a constant; a number the "
                "forward computes with as with a tensor runs the program at every value where the build is made "
                "and called with it as a 0-d tensor)")
    if kwargs:
        captured = {name for name, _ in (params or [])[:len(spec)]}
        past = sorted(k for k in kwargs if params and k not in captured)
        if past:
            return (f"keyword arguments past the {len(spec)} captured input(s) ({', '.join(past)}), where the build "
                    "computes with their values at capture (their defaults): call it without them, or profile and "
                    "rebuild with them passed")
        return f"keyword arguments it was not captured with ({', '.join(sorted(kwargs))})"
    if len(args) != len(spec):
        return f"{len(args)} positional inputs, built for {len(spec)}"
    for i, (a, (shape, dtype, device, strides)) in enumerate(zip(args, spec, strict=True)):
        if not isinstance(a, torch.Tensor):
            if type(a) in (int, float) and shape == ():
                return (f"input {i} is the Python {type(a).__name__} {a!r}, built for a 0-d tensor: pass "
                        f"torch.tensor({a!r}, dtype={dtype}), which runs the program at any value")
            return f"input {i} is a {type(a).__name__}, built for a tensor"
        if a.dtype != dtype or a.device != device:
            return f"input {i} is {a.dtype} on {a.device}, built for {dtype} on {device}"
        if a.shape != shape:
            why = ("`recompile --dynamic` adds programs for other sizes" if sizes_refused is None else
                   f"it was built with --dynamic, but its program for other sizes was left out: {sizes_refused}")
            return f"input {i} has shape {tuple(a.shape)}, built for {tuple(shape)} (the build is shape-specialized; {why})"
        if a.stride() != strides:
            return (f"input {i} has strides {a.stride()}, built for {strides} (the build copies a call into a "
                    "contiguous or channels_last layout it was captured with, not into this one)")
    return "the inputs differ from the captured ones"


def keyword_count(params: list[tuple[str, Any]], args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
    """How many of the forward's first parameters (``params``) a keyword call binds positionally:
    through the last one it names (at least its positional arguments; see :func:`bind_call`)."""
    return max(max((i + 1 for i, (name, _) in enumerate(params) if name in kwargs), default=0), len(args))


def bind_call(params: list[tuple[str, Any]], original: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
              count: int, fill: bool = True) -> tuple[Any, ...] | None:
    """The call with its first ``count`` parameters (``params``: the original forward's (name,
    default) pairs) positional, those among them it does not pass at their defaults where
    ``fill``; keywords past them may only repeat their defaults, or what ``original``'s Hugging
    Face config sets. None where the call does not bind so."""
    if len(params) < count or len(args) > count:
        return None
    wanted = params[len(args):count]
    if any(name not in kwargs and (not fill or default is inspect.Parameter.empty) for name, default in wanted):
        return None
    taken = {name for name, _ in wanted}
    defaults = dict(params[count:])
    for name, value in kwargs.items():
        if name not in taken and not (name in defaults and _is_default(value, defaults[name])) \
                and not _as_configured(original, name, value):
            return None
    return args + tuple(kwargs.get(name, default) for name, default in wanted)


def _is_default(value: Any, default: Any) -> bool:
    """Whether a keyword argument repeats its parameter's default (None, a flag, a number, a string)."""
    if value is default:
        return True
    return (default is not inspect.Parameter.empty and type(value) is type(default)
            and isinstance(value, (bool, int, float, str)) and value == default)


def _as_configured(module: nn.Module, name: str, value: Any) -> bool:
    """Whether keyword ``name=value`` only repeats what ``module``'s Hugging Face config sets (see
    :data:`~cuvil_pgc._example_inputs.HF_OUTPUT_FLAGS`): a call passing the value the config gives
    returns what the default (None: the config's) returns; services pass ``return_dict=True`` on
    every call."""
    config = getattr(module, "config", None)
    if name not in HF_OUTPUT_FLAGS or type(value) is not bool or config is None:
        return False
    configured = getattr(config, name, None)
    return type(configured) is bool and configured is value
