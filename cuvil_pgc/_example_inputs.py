"""The positional call a model's example inputs stand for, in one place for the CLI and the API.

``recompile``, ``compare`` and a ``MODULE:FACTORY`` reference take a model's example inputs as a
tuple of positional arguments. Users also hand over what they call their model with: one tensor
(as ``torch.jit.trace`` and ``torch.onnx.export`` take it), or a tokenizer's output, a mapping of
the forward's parameter names (``{"input_ids": ..., "attention_mask": ...}``). One tensor used to be
iterated as if it were the tuple, so a (1, 32) input became one (32,) argument and the build was
made for an input without its batch dimension; a mapping became its keys, and the model raised
on a string. :func:`positional_inputs` turns each into the positional call it means; a loaded
build still takes the inputs by keyword (it binds keyword calls to the captured positions).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any

from cuvil_pgc.errors import ConfigError

_MULTIPLE_VALUES = re.compile(r"got multiple values for argument '(\w+)'")
#: Hugging Face's output flags: a model reads each from its config where a call leaves it at None
HF_OUTPUT_FLAGS = ("return_dict", "output_attentions", "output_hidden_states", "use_cache")


class SizesVary:
    """Marks example inputs whose sizes vary from call to call where nothing in them says so (an
    encoder-decoder's source, see :func:`~cuvil_pgc.recompile.generate_calls.generate_encoder_call`):
    ``recompile`` gives such a call's regions programs for other sizes. :func:`positional_inputs`
    keeps the mark (the command line passes a factory's inputs on as positional ones)."""


class SizesVaryCall(SizesVary, dict):  # type: ignore[type-arg]
    """A keyword call whose sizes vary (see :class:`SizesVary`)."""


class SizesVaryInputs(SizesVary, tuple):  # type: ignore[type-arg]
    """Positional inputs whose sizes vary (see :class:`SizesVary`)."""


def positional_inputs(model: Any, given: Any) -> tuple[Any, ...]:
    """The positional arguments ``model`` is called with for ``given``: a tuple as it is; a mapping
    whose keys all name parameters of ``model.forward`` in the forward's order, the parameters
    it skips before its last one at their defaults; anything else (one tensor, a list, a mapping
    the forward takes whole) as the one argument. Inputs marked :class:`SizesVary` stay marked."""
    inputs = _positional(model, given)
    return SizesVaryInputs(inputs) if isinstance(given, SizesVary) and not isinstance(inputs, SizesVary) else inputs


def _positional(model: Any, given: Any) -> tuple[Any, ...]:
    if isinstance(given, tuple):
        return given
    if isinstance(given, Mapping) and given and all(isinstance(k, str) for k in given):
        params = _parameters(model)
        if params is not None and set(given) <= set(params):
            return _bind(given, params)
    return (given,)


def inputs_hint(given: Any, model: Any = None, error: BaseException | None = None) -> str:
    """The fix to suggest where ``model`` raised on its example inputs (``error``): a list or a
    mapping that was passed as one argument may have been meant as the call's arguments; a mapping
    bound to the forward's positions may name a parameter the forward's decorators pass by keyword."""
    if isinstance(given, list):
        return (f"example_inputs is a {type(given).__name__}, so it was passed as one argument: give a tuple of the "
                "positional inputs (tuple(inputs))")
    if isinstance(given, Mapping):
        params = _parameters(model) if model is not None else None
        twice = _MULTIPLE_VALUES.search(str(error)) if isinstance(error, TypeError) else None
        if twice and params is not None and set(given) <= set(params) and twice[1] in given:
            name = twice[1]
            config = getattr(model, "config", None)
            where = (f"set model.config.{name} = {given[name]!r} and leave {name!r} out of the example inputs"
                     if config is not None and hasattr(config, name) else
                     f"leave {name!r} out of the example inputs, or wrap the model in a module that passes it by "
                     f"keyword (def forward(self, ...): return self.model(..., {name}={given[name]!r}))")
            return (f"the example inputs were passed by position, in the forward's order, and a decorator on the "
                    f"forward passes {name!r} by keyword as well (Hugging Face's merge_with_config_defaults does for "
                    f"use_cache where it cannot find its position): {where}")
        keyword_only = [k for k in given if k in _keyword_only(model)] if model is not None else []
        if keyword_only:
            positional = [k for k in given if params is not None and k in params]      # passed before them
            names = ", ".join(positional + keyword_only[:4])
            passed = ", ".join(positional + [f"{k}={k}" for k in keyword_only[:4]])
            return (f"{', '.join(map(repr, keyword_only[:4]))} {'is a keyword-only parameter' if len(keyword_only) == 1 else 'are keyword-only parameters'} "
                    f"of the forward (after a *), and a build is made for the inputs a call passes by position: wrap "
                    f"the model in a module whose forward takes them by position (def forward(self, {names}): "
                    f"return self.model({passed}))")
        extra = [k for k in given if params is not None and k not in params]
        others = [repr(k) for k in extra]
        configured = _config_flags(model, extra, given)
        if others and params and configured:
            one, names = len(configured) == 1, ", ".join(repr(k) for k in configured)
            sets = "; ".join(f"model.config.{k} = {given[k]!r}" for k in configured)
            return (f"{names} {'goes' if one else 'go'} to the forward's **kwargs, which a build's example inputs cannot "
                    f"carry; a Hugging Face model reads {'it' if one else 'them'} from its config: set {sets} (in the "
                    f"process that loads the build too: a build checks the config it was made with), leave "
                    f"{'it' if one else 'them'} out of the example inputs, and calls passing "
                    f"{', '.join(f'{k}={given[k]!r}' for k in configured)} run the build")
        if others and params == {} and model is not None and _takes_var_keywords(model) \
                and all(k.isidentifier() for k in given):
            keys = list(given)
            return (f"the forward takes its inputs as **kwargs ({', '.join(map(repr, keys[:4]))}), and a build is "
                    "made for the inputs a call passes by position: wrap the model in a module that names them "
                    f"(def forward(self, {', '.join(keys)}): return self.model({', '.join(f'{k}={k}' for k in keys)})) "
                    "and build, load and call that module")
        if others and params and model is not None and _takes_var_keywords(model):
            named = [k for k in given if k in params]
            flags = ", ".join(f"{k}={given[k]!r}" if _is_flag(given[k]) else f"{k}=..." for k in given if k not in params)
            one = len(others) == 1
            return (f"{', '.join(others[:4])} {'is' if one else 'are'} not among the forward's named parameters but "
                    f"{'goes' if one else 'go'} to its **kwargs, and a build is made for the inputs a call passes by "
                    f"position: leave {'it' if one else 'them'} out of the example inputs, or wrap the model in a "
                    f"module that passes {'it' if one else 'them'} "
                    f"(def forward(self, {', '.join(named) or 'inputs'}): return self.model("
                    f"{', '.join(f'{k}={k}' for k in named)}{', ' if named else ''}{flags})) and build, load and "
                    "call that module")
        which = f" ({', '.join(others[:4])} not among them)" if others else ""
        return (f"example_inputs is a {type(given).__name__} whose keys are not all parameters of the forward{which}, "
                "so it was passed as one argument: keep only the forward's parameters (e.g. input_ids, "
                "attention_mask) or give a tuple of the inputs in the forward's order")
    return "fix the model or its example inputs"


def forward_parameters(model: Any) -> list[tuple[str, Any]] | None:
    """(name, default) of each parameter of ``model.forward`` that a call may pass by position or
    keyword, in order (the default ``inspect.Parameter.empty`` where there is none); None where
    the signature cannot be read or starts with a positional-only or ``*args`` parameter. What a
    mapping of example inputs binds to here, and what a loaded build binds keyword calls to
    (:class:`~cuvil_pgc.recompile.realized.CompiledRegion`)."""
    params = _signature(model)
    if params is None:
        return None
    out = []
    for p in params:
        if p.kind is not inspect.Parameter.POSITIONAL_OR_KEYWORD:
            if p.kind is inspect.Parameter.POSITIONAL_ONLY or (p.kind is inspect.Parameter.VAR_POSITIONAL and not out):
                return None
            break
        out.append((p.name, p.default))
    return out


def number_inputs(model: Any, inputs: tuple[Any, ...]) -> list[tuple[str, int | float]]:
    """(name, value) of each positional input that is a Python number (an int or a float, not a
    bool) other than its parameter's default (``input N`` where the forward does not name it). A
    build's programs hold such a number as the constant it was captured with, so calls passing
    another value run the original module; one left at its default is what calls that omit it pass."""
    params = forward_parameters(model) or []
    out = []
    for i, value in enumerate(inputs):
        if type(value) not in (int, float):
            continue
        name, default = params[i] if i < len(params) else (f"input {i}", inspect.Parameter.empty)
        if default is inspect.Parameter.empty or type(default) is not type(value) or default != value:
            out.append((name, value))
    return out


def _keyword_only(model: Any) -> set[str]:
    """The names of ``model.forward``'s keyword-only parameters (after a ``*``)."""
    return {p.name for p in _signature(model) or () if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _takes_var_keywords(model: Any) -> bool:
    """Whether ``model.forward`` takes ``**kwargs`` (Hugging Face models in transformers 5 take their
    ``output_hidden_states``, ``return_dict`` and other flags there)."""
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in _signature(model) or ())


def _signature(model: Any) -> list[inspect.Parameter] | None:
    """The parameters of ``model.forward`` (of ``model`` where it has none), or None where the
    signature cannot be read."""
    try:
        return list(inspect.signature(getattr(model, "forward", model)).parameters.values())
    except (TypeError, ValueError):
        return None


def _config_flags(model: Any, names: list[str], given: Mapping[str, Any]) -> list[str]:
    """``names`` where every one is a Hugging Face output flag (:data:`HF_OUTPUT_FLAGS`) given as a
    bool that ``model``'s config holds, so the config can set it; else none."""
    config = getattr(model, "config", None)
    if not names or config is None or not _takes_var_keywords(model):
        return []
    if all(k in HF_OUTPUT_FLAGS and type(given[k]) is bool and hasattr(config, k) for k in names):
        return names
    return []


def _is_flag(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, float, str))


def _parameters(model: Any) -> dict[str, Any] | None:
    params = forward_parameters(model)
    return None if params is None else dict(params)


def _bind(given: Mapping[str, Any], params: dict[str, Any]) -> tuple[Any, ...]:
    names = list(params)
    last = max(names.index(k) for k in given)
    args = []
    for name in names[:last + 1]:
        if name in given:
            args.append(given[name])
        elif params[name] is inspect.Parameter.empty:
            raise ConfigError(f"the example inputs name {', '.join(given)} but not {name!r}, which the model's "
                              "forward takes before them and has no default",
                              fix=f"add {name!r} to the example inputs, or give them as a tuple of positional inputs")
        else:
            args.append(params[name])
    return tuple(args)


def input_objects_kept(inputs: tuple[Any, ...]) -> Any:
    """A function that puts the objects among ``inputs`` (a Hugging Face cache and the layers it
    holds: instances with attributes, reached through attributes and lists) back to the attributes
    they have now, and the lists and dicts among them to the items they hold now. A decoding
    step's call extends the cache it is given, by assigning each layer longer tensors: repeated on
    one example (a factory's check call, a profile's iterations) the cache grew a token per call,
    and each recorded step was another length than the example's. A prefill's fills an empty cache
    in place too: a ``DynamicCache()`` appends its layers to its list, and T5's
    ``EncoderDecoderCache`` marks each layer's cross-attention done in a dict (kept, the next call
    read cross-attention keys that had been put back to none, and raised). Shallow: attributes and
    items are rebound, tensors never copied (one changed in place stays changed)."""
    saved: list[tuple[Any, dict[str, Any]]] = []
    items: list[tuple[Any, Any]] = []       # (a list or dict, a copy of what it holds)
    seen: set[int] = set()

    def walk(value: Any, depth: int) -> None:
        if depth > 4 or id(value) in seen:
            return
        seen.add(id(value))
        if isinstance(value, list) or type(value) is dict:     # (a ModelOutput, a dict with attributes: below)
            items.append((value, value.copy()))
            for item in (value if isinstance(value, list) else value.values()):
                walk(item, depth + 1)
        elif hasattr(value, "__dict__") and not isinstance(value, type) and not callable(value) \
                and not any(c.__module__.split(".")[0] == "torch" for c in type(value).__mro__):   # tensors, modules
            attributes = vars(value)
            saved.append((value, dict(attributes)))
            for item in attributes.values():
                walk(item, depth + 1)

    for value in inputs:
        walk(value, 0)

    def restore() -> None:
        for obj, attributes in saved:
            vars(obj).clear()
            vars(obj).update(attributes)
        for held, copy in items:
            if isinstance(held, list):
                held[:] = copy
            else:
                held.clear()
                held.update(copy)
    return restore
