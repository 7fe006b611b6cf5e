"""How ``generate()`` calls a model, for the decoding builds (:mod:`.cache_step`, :mod:`.decoding_forward`).

A build of a decoding step or a prefill is made for the call ``generate()`` makes, and runs the calls
it makes after: :func:`generate_step_call` captures one as made (a user's example call; for an
encoder-decoder's encoder, :func:`generate_encoder_call`),
:func:`as_generate_calls` completes an example call as ``generate()`` passes it (position ids
counted along the mask, ``logits_to_keep``), and :func:`as_built` maps a later call onto the built
one where they differ only in what the model reads alike (a mask of all ones left out, an output
flag left to the model's config). :func:`cache_position`, :func:`cache_length` and
:func:`class_parameters` find the cache, its length and the forward's parameters.
"""

from __future__ import annotations

import copy
import inspect
import sys
from typing import Any

import torch
from torch import nn

from cuvil_pgc._example_inputs import HF_OUTPUT_FLAGS, SizesVaryCall
from cuvil_pgc.errors import ConfigError


def cache_position(inputs: tuple[Any, ...]) -> int | None:
    """The position of the Hugging Face cache among a call's positional inputs, or None."""
    cache = getattr(sys.modules.get("transformers.cache_utils"), "Cache", None)
    if not isinstance(cache, type):
        return None
    found = [i for i, v in enumerate(inputs) if isinstance(v, cache)]
    return found[0] if len(found) == 1 else None


def cache_length(cache: Any) -> int:
    """How many tokens a Hugging Face cache holds (0 where it cannot say)."""
    try:
        return int(cache.get_seq_length())
    except Exception:       # not a Hugging Face cache, or one whose method raises: the checks decide
        return 0


def class_parameters(model: nn.Module) -> list[tuple[str, Any]]:
    """(name, default) of the parameters of ``model``'s class forward a call may pass by position."""
    params = list(inspect.signature(type(model).forward).parameters.values())[1:]
    return [(p.name, p.default) for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def generate_step_call(model: nn.Module, *args: Any, step: int = 3, **generate_kwargs: Any) -> dict[str, Any]:
    """The keyword arguments of the call ``model.generate(*args, **generate_kwargs)`` makes for its
    ``step``-th new token (1: the first decoding step; 0: the prefill, the prompt's call with the
    empty cache), copied as passed (the model extends the cache after), less ``return_dict`` (a
    flag the model reads from its config): a decoding step's example call for ``recompile``, made
    as the service's ``generate()`` will call the build. Greedy, exactly ``step + 1`` new tokens,
    unless ``generate_kwargs`` say otherwise."""
    if step < 0:
        raise ConfigError(f"step={step}: generate()'s calls are counted from 0 (the prefill)",
                          fix="pass step=0 for the prefill, 1 or later for a decoding step")
    calls = _calls_made(model, model, args, {"max_new_tokens": step + 1, "min_new_tokens": step + 1,
                                             "do_sample": False, **generate_kwargs})
    if len(calls) <= step:
        raise ConfigError(f"generate() made {len(calls)} call(s) of the model, none for step {step}",
                          fix="ask for more new tokens, or an earlier step")
    return {k: v for k, v in calls[step][1].items() if k != "return_dict"}


def generate_encoder_call(model: nn.Module, *args: Any, **generate_kwargs: Any) -> SizesVaryCall:
    """The keyword arguments of the call ``model.generate(*args, **generate_kwargs)`` makes of an
    encoder-decoder's encoder (``model.get_encoder()``, once per ``generate()``: the source's call),
    less the output flags it passes (the encoder's build reads them from the config, and calls
    passing them run it): the example call for ``recompile(model.get_encoder(), call)``, whose
    build ``load_build`` loads onto the model (see :mod:`.encoder_build`). A source's length varies
    from one ``generate()`` to the next: the call is marked so (:class:`~cuvil_pgc._example_inputs.SizesVary`),
    and ``recompile`` gives its regions programs for other sizes (as ``dynamic=True``) and builds
    none that runs its captured sizes only, as for a decoding call."""
    encoder = encoder_module(model)
    if encoder is None:
        raise ConfigError(f"a {type(model).__name__} is not an encoder-decoder: generate() calls no encoder of its own",
                          fix="pass a model whose config says is_encoder_decoder (T5, BART, Whisper ...)")
    calls = _calls_made(model, encoder, args, {"max_new_tokens": 1, "do_sample": False, **generate_kwargs})
    if len(calls) != 1 or calls[0][0]:
        raise ConfigError(f"generate() called the encoder {len(calls)} time(s), "
                          f"{'by position' if calls and calls[0][0] else 'not once by keyword'}, where this captures "
                          "one call by keyword", fix="give recompile the encoder's example call yourself")
    return SizesVaryCall((k, v) for k, v in calls[0][1].items() if k not in HF_OUTPUT_FLAGS)


def encoder_module(model: Any) -> nn.Module | None:
    """The encoder ``generate()`` runs on the source (``model.get_encoder()``) where ``model`` is an
    encoder-decoder, else None."""
    if not getattr(getattr(model, "config", None), "is_encoder_decoder", False):
        return None
    try:
        encoder = model.get_encoder()
    except Exception:       # a model whose lookup raises has no encoder of its own to run
        return None
    return encoder if isinstance(encoder, nn.Module) and encoder is not model else None


def _calls_made(model: nn.Module, callee: nn.Module, args: tuple[Any, ...],
                generate_kwargs: dict[str, Any]) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """The calls (positional arguments, keyword arguments copied as passed) that
    ``model.generate(*args, **generate_kwargs)`` makes of ``callee`` (the model, or its encoder)."""
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    own = vars(callee).get("forward")          # a forward the instance already has (a loaded build's) stays

    def spy(*a: Any, **kw: Any) -> Any:
        calls.append((a, copy.deepcopy(kw)))
        return forward(*a, **kw)
    forward = callee.forward
    spy.__signature__ = inspect.signature(forward)     # type: ignore[attr-defined]  # generate() reads it
    callee.forward = spy
    try:
        with torch.no_grad():
            model.generate(*args, **generate_kwargs)
    finally:
        if own is None:
            del callee.forward
        else:
            callee.forward = own
    return calls


def as_generate_calls(model: nn.Module, inputs: tuple[Any, ...]) -> tuple[Any, ...]:
    """A decoding step's positional ``inputs`` completed as ``generate()`` passes them where the
    model's forward takes them and the call leaves them out: ``position_ids`` counted along the
    attention mask (a padded position counts none), the new tokens' last ones, and
    ``logits_to_keep=1``. A step built without them matched none of ``generate()``'s calls, once its
    forward showed the model's parameters (it must: ``generate()`` reads them to decide what to pass,
    and without position ids a left-padded GPT-2 batch answered otherwise than eager's)."""
    params = class_parameters(model)
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


def as_built(bound: tuple[Any, ...], names: list[str], layout: Any, config: Any = None,
             flags: tuple[int, ...] | None = None) -> tuple[Any, ...] | None:
    """A call ``bound`` to the positions of ``layout`` (a :class:`~.cache_step.StepLayout`) with
    what it leaves out and the built call holds filled in as the model reads it left out: no
    attention mask is one over every position (``generate()`` drops an all-ones mask, and a mask of
    all ones is left out where the build was made without one: a prefill's, as ``generate()``
    calls it for unpadded prompts), and the ``position_ids`` of a call that pads nothing
    count on from the cache's length (a padded row counts along its mask, which ``generate()``
    does and passes); ``logits_to_keep`` as built where both keep every new token's logits; a
    Hugging Face output flag left None on one side and set to the model's ``config`` value on the
    other as built (``generate()`` passes ``return_dict=True``, which Bloom's, GPT-Neo's and
    Falcon's forwards name: a step built without it ran none of their steps). None where a call
    leaves the position ids out over padding (the model's own forward answers it). ``flags``: the
    positions of the output flags among ``names`` (:func:`flag_positions`, once per model: a step's
    hot path)."""
    built = names[:layout.count]
    out = list(bound)
    for at in flag_positions(names, layout) if flags is None else flags:
        if out[at] is not layout.constants[at] and None in (out[at], layout.constants[at]):
            given = layout.constants[at] if out[at] is None else out[at]
            if type(given) is bool and given == _config_flag(config, built[at]):
                out[at] = layout.constants[at]
    ids = out[layout.tensors[0]] if layout.tensors else None
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
        return tuple(out)
    batch, new = ids.shape
    past = cache_length(out[layout.cache])
    at = built.index("attention_mask") if "attention_mask" in built else -1
    if at in layout.tensors and out[at] is None:
        out[at] = torch.ones(batch, past + new, dtype=torch.long, device=ids.device)
    elif at >= 0 and at not in layout.tensors and layout.constants[at] is None and isinstance(out[at], torch.Tensor) \
            and out[at].shape == (batch, past + new) and bool(out[at].all()):
        out[at] = None      # built without one (generate() leaves an all-ones mask out): the same call
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


def flag_positions(names: list[str], layout: Any) -> tuple[int, ...]:
    """Where the layout's call holds Hugging Face output flags (``return_dict``, ...)."""
    return tuple(at for at, name in enumerate(names[:layout.count]) if name in HF_OUTPUT_FLAGS)


def _config_flag(config: Any, name: str) -> Any:
    """What a Hugging Face model reads for the output flag ``name`` left None: its config's."""
    if name == "return_dict":
        return getattr(config, "use_return_dict", getattr(config, "return_dict", None))
    return getattr(config, name, None)
