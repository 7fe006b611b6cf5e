"""Refuse, before searching, a model whose call changes state that outlives the call.

A build runs a program captured from one call: ONNX Runtime, OpenVINO and AOTInductor programs
return outputs and change nothing else, and the accuracy guard compares each candidate's outputs
with eager's on the same inputs. A forward that changes one of its buffers in place (a running
sum, a step counter, a cache written into a buffer) or one of its inputs breaks both: the search's
hundreds of calls advanced the user's buffer and example inputs (an input doubled in place each
call reached inf), every candidate then failed the guard against references computed in an
earlier state, and the user read "fails the accuracy guard ... off by up to nan".

:func:`check_stateless` calls the model twice, puts back what the calls changed, and raises a
:class:`~cuvil_pgc.errors.RecompileError` naming the buffer or input and the fix. Parameters are
not snapshotted: copying a large model's weights would double its memory, and a forward that
rewrites its own weights is rare enough to be left to the guard.

So are the entries of a dict or list among the inputs: sentence-transformers' modules add their
embeddings to the features dict they are given. The search's calls grew the example dict, the build
was made for a dict holding the embeddings, and no call of the user's matched it, so every call ran
the original module. Such a forward is refused, with the wrapper that hands it a copy, and the dict
is put back as it was.

So is an object among the inputs that the call changes: a decoding step appends to the Hugging
Face cache it is given. Its outputs moved with the cache, and the check blamed random numbers,
leaving the user's cache with the keys of its calls; such a call is refused naming the object,
which is put back (:func:`object_state` tells the change, its attributes deep-copied beforehand).

The random generator is such state too. A forward that draws from it (noise added at inference,
a sampled latent, ``torch.multinomial``) returns other outputs on every call, and no program
draws what eager drew: ONNX Runtime, OpenVINO and Inductor have random generators of their own.
The search then measured every candidate and rejected each for "values off by up to 0.01", and
shipped eager, without saying why. The two calls' outputs are compared with the search's own
accuracy guard, so that such a model is refused up front, with the cause.

A model whose forward changes only its own buffers (a streaming normalizer's running mean, a call
counter) or the numbers its modules hold as Python attributes (``self.calls += 1``:
:func:`python_attributes`) is not refused where it has submodules whose calls leave the state
alone: no program can run the model, but those submodules can have programs, and the model's own
forward stays eager around them, updating its state as it does today. :func:`check_stateless` then returns a
:class:`HeldState`: the buffers with their values, and the modules whose calls change them (found
by a call with a hook on every module), which recompile keeps eager; while it searches,
:func:`holding` puts the buffers back before and after each of its calls of the model, so that
every call computes from the state the user's model had (the accuracy guard compares calls made
alike), and once more at the end, so the user's model is left as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NoReturn

import torch
from torch.utils import _pytree as pytree

from cuvil_pgc._buffers import restore_buffer
from cuvil_pgc._structure import strided_parts
from cuvil_pgc.errors import RecompileError
from cuvil_pgc.recompile.object_outputs import openable
from cuvil_pgc.recompile.random_draws import (
    GeneratorState,
    drawing_modules,
    generator_state,
    put_back_generators,
)

if TYPE_CHECKING:
    from cuvil_pgc.recompile.accuracy import AccuracyResult

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldState:
    """The buffers a model's forward changes on every call, each as ``(name, the buffer, its value
    before recompile's calls)``, the modules whose calls change them (qualified names, ``""``
    the model), which recompile keeps eager (see the module's docstring), and the modules' Python
    attributes those calls change (a call counter), each as ``(name, its value before)``."""

    buffers: tuple[tuple[str, torch.Tensor, torch.Tensor], ...]
    modules: frozenset[str]
    attributes: tuple[tuple[str, Any], ...] = ()
    #: the random generators' state, where the modules kept eager draw random numbers
    generators: GeneratorState | None = None

    def put_back(self, model: torch.nn.Module) -> None:
        """Give each buffer its value from before recompile's calls (the same tensor, reattached
        where the forward assigned another), each attribute, and the generators their state."""
        _put_back(model, {f"buffer {name}": t for name, t, _ in self.buffers},
                  {f"buffer {name}": value for name, _, value in self.buffers})
        _put_back_attributes(model, dict(self.attributes))
        if self.generators is not None:
            put_back_generators(self.generators)


@contextmanager
def holding(model: torch.nn.Module, held: HeldState | None) -> Iterator[None]:
    """While in the block, put ``held``'s buffers back before and after each call of ``model`` (a
    copy of the model taken between calls, as the float32 reference of a bf16 model is, starts from
    them too), and once more on leaving it (nothing without ``held``)."""
    if held is None:
        yield
        return
    handles = [model.register_forward_pre_hook(lambda *_: held.put_back(model)),
               model.register_forward_hook(lambda *_: held.put_back(model), always_call=True)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        held.put_back(model)


def check_stateless(model: torch.nn.Module, inputs: tuple[Any, ...], *, rtol: float | None = None,
                    atol: float | None = None) -> HeldState | None:
    """Call ``model`` twice on ``inputs`` (no autograd): if the second call changes a buffer, a
    number a module holds (:func:`python_attributes`) or an input tensor (the first may build a
    cache lazily, as eager's first call does), put back what both calls changed and raise
    :class:`RecompileError` naming them, unless only buffers and such numbers changed and
    submodules whose calls leave them alone remain to be searched: then return the
    :class:`HeldState`. If instead its outputs differ beyond the accuracy guard
    (``rtol``/``atol``, see :mod:`.accuracy`), and differ again on a third call (a first call may
    warm something up), raise :class:`RecompileError`: the forward draws random numbers."""
    containers = _containers(inputs, "input")
    original = _tracked(model, inputs)
    at_start = _values(original)
    attributes_at_start = python_attributes(model)
    objects = _saved_objects(inputs)
    versions = _weight_versions(model)
    first = _call(model, inputs)
    _warn_rewritten_weights(versions, _weight_versions(model), _renormed_embeddings(model))
    _check_containers(containers)
    settled = _values(_tracked(model, inputs))
    settled_objects = object_state(inputs, {})
    settled_attributes = python_attributes(model)
    second = _call(model, inputs)
    now = _tracked(model, inputs)
    changed = [key for key, t in now.items() if key not in settled or not _same(t, settled[key])]
    counters = _changed_attributes(model, settled_attributes)
    changed += [f"attribute {key}" for key in counters]
    now_objects = object_state(inputs, {})
    changed += [name for name, state in settled_objects.items() if now_objects.get(name) != state]
    if not changed:
        check = _repeat_check(model, inputs, first, second, rtol, atol)
        return None if check.ok else _held_draws(model, inputs, check, rtol, atol)
    buffers = [key.removeprefix("buffer ") for key in changed if key.startswith("buffer ")]
    stateful = _changing_modules(model, inputs, buffers, counters) \
        if len(buffers) + len(counters) == len(changed) else frozenset()
    _put_back(model, original, at_start)       # the user's buffers and example inputs as they were
    _put_back_attributes(model, {key: attributes_at_start.get(key, _ABSENT)
                                 for key in _changed_attributes(model, attributes_at_start)})
    for obj, attributes in objects:
        vars(obj).clear()
        vars(obj).update(attributes)
    if set(changed) & set(settled_objects):
        raise RecompileError(
            f"the model's forward changes {', '.join(changed[:4])} on every call (a decoding step adding to the "
            "cache it is given); a build runs a program captured from one call, which changes nothing but its "
            "outputs (recompile put back what its two calls to check this changed)",
            fix="recompile the model's call without the object (a Hugging Face model's first call, which makes "
                "its cache), or with a Hugging Face cache that holds the keys of earlier tokens: such a decoding "
                "step is built with the cache opened into tensors, and generate() runs it once loaded")
    named = f"{', '.join(changed[:4])}{' and more' if len(changed) > 4 else ''}"
    if stateful and _searchable(model, stateful):
        held = HeldState(tuple((name, original[f"buffer {name}"], at_start[f"buffer {name}"]) for name in buffers),
                         stateful, tuple((key, attributes_at_start.get(key, _ABSENT)) for key in counters))
        with holding(model, held):
            check = _repeat_check(model, inputs, _call(model, inputs), _call(model, inputs), rtol, atol)
        if not check.ok:
            _random_error(check)
        log.warning("cuvil-pgc: the model's forward changes %s on every call: it stays eager%s, and recompile "
                    "searches the submodules whose calls leave that state alone (putting it back after each of "
                    "its calls)", named, "" if stateful == {""} else
                    f", with {', '.join(sorted(q for q in stateful if q)[:4])}")
        return held
    raise RecompileError(
        f"the model's forward changes {named} on every call; a build runs a program captured from one call, which "
        "changes nothing but its outputs, so it cannot reproduce that state, and no submodule with weights leaves "
        "it alone (recompile put back what its two calls to check this changed)",
        fix="recompile a submodule whose forward leaves its buffers and inputs as it found them, or move the "
            "state out of the forward (clone an input before changing it; keep counters and caches outside the "
            "model)")


def _put_back(model: torch.nn.Module, tensors: dict[str, torch.Tensor], values: dict[str, torch.Tensor]) -> None:
    """Copy ``values`` into ``tensors`` (keyed as :func:`_tracked` keys them); each buffer as
    :func:`~cuvil_pgc._buffers.restore_buffer` does (reattached where a forward assigned a new one,
    replaced where it resized it in place)."""
    for key, t in tensors.items():
        if key.startswith("buffer "):
            restore_buffer(*_owner(model, key.removeprefix("buffer ")), t, values[key])
        else:
            with torch.no_grad(), torch.inference_mode(t.is_inference()):
                t.copy_(values[key])


def _changing_modules(model: torch.nn.Module, inputs: tuple[Any, ...], buffers: list[str],
                      attributes: Sequence[str] = ()) -> frozenset[str]:
    """The qualified names of the modules whose calls change one of ``buffers`` (in place, or by
    assigning another tensor) or of the Python ``attributes`` (:func:`python_attributes`): one
    more call, with a hook before and after each module's."""
    owners = [_owner(model, key) for key in attributes]

    def marks() -> list[Any]:
        out = [(0, vars(owner).get(attr, _ABSENT)) for owner, attr in owners]
        for name in buffers:
            b = getattr(*_owner(model, name), None)
            if not isinstance(b, torch.Tensor):
                out.append((id(b), None))
            else:                            # an inference tensor has no version counter: its values
                out.append((id(b), b.detach().clone() if b.is_inference() else b._version))
        return out

    def same(a: list[Any], b: list[Any]) -> bool:
        return all(x[0] == y[0] and (_same(x[1], y[1]) if isinstance(x[1], torch.Tensor) else _same_value(x[1], y[1]))
                   for x, y in zip(a, b, strict=True))

    before: dict[str, list[list[Any]]] = {}
    changing: set[str] = set()
    handles = []
    for qualname, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(
            lambda *_, q=qualname: before.setdefault(q, []).append(marks())))
        handles.append(module.register_forward_hook(
            lambda *_, q=qualname: None if same(before[q].pop(), marks()) else changing.add(q)))
    try:
        _call(model, inputs)
    finally:
        for handle in handles:
            handle.remove()
    return frozenset(changing)


#: a module's Python attributes whose changes are state (:func:`python_attributes`)
_SCALARS = (type(None), bool, int, float, complex, str)
#: an attribute the module did not have
_ABSENT = object()


def python_attributes(model: torch.nn.Module) -> dict[str, Any]:
    """The numbers, strings and Nones the modules of ``model`` hold as Python attributes, by
    qualified name (``calls``, ``head.seen``; ``training`` left out). A forward that counts its calls
    (``self.calls += 1``) changes one every call: no program does (torch.export holds the count as
    a constant), and a loaded build's counter stood still, silently, while the service read it."""
    return {f"{qualname}.{key}" if qualname else key: value for qualname, module in model.named_modules()
            for key, value in vars(module).items() if type(value) in _SCALARS and key != "training"}


def _changed_attributes(model: torch.nn.Module, before: dict[str, Any]) -> list[str]:
    """The keys of :func:`python_attributes` whose values differ from ``before`` (or are new)."""
    return [key for key, value in python_attributes(model).items()
            if key not in before or not _same_value(value, before[key])]


def _same_value(a: Any, b: Any) -> bool:
    return a == b or a != a and b != b      # NaN where NaN was


def _owner(model: torch.nn.Module, key: str) -> tuple[torch.nn.Module, str]:
    """The module holding the attribute or buffer ``key`` (a qualified name), and its own name."""
    owner, _, attr = key.rpartition(".")
    return model.get_submodule(owner), attr


def _put_back_attributes(model: torch.nn.Module, values: dict[str, Any]) -> None:
    """Set each attribute (qualified name) to its value in ``values``, removing one it did not have."""
    for key, value in values.items():
        module, attr = _owner(model, key)
        if value is _ABSENT:
            vars(module).pop(attr, None)
        else:
            setattr(module, attr, value)


#: what an input object holds that its call cannot change in place
_VALUES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device, torch.Size)


def _saved_objects(inputs: tuple[Any, ...]) -> list[tuple[Any, dict[str, Any]]]:
    """Each input object's attributes (see :func:`object_state`), deep-copied to be put back: a
    Hugging Face cache among the inputs of a decoding step grows on every call."""
    import copy

    saved = []
    for v in pytree.tree_leaves(inputs):
        if _is_object(v):
            try:
                saved.append((v, copy.deepcopy(vars(v))))
            except Exception:            # what cannot be copied is not put back
                continue
    return saved


def _is_object(v: Any) -> bool:
    return not isinstance(v, torch.Tensor) and openable(v)


def object_state(args: tuple[Any, ...], kwargs: dict[str, Any], depth: int = 4) -> dict[str, Any]:
    """Per input that is an object rather than tensors and values (a Hugging Face cache), what a
    call could change in it: the tensors it reaches through its attributes, lists and dicts
    (identity, shape, version counter), their lengths and the plain values among them, ``depth``
    levels deep. Compared before and after a submodule's call, it tells a submodule that changes
    an object it is given (a decoder layer appending its keys and values to the cache), which no
    program captured from one call reproduces, and whose captured call cannot be replayed: the
    replay appends again (Mistral's sliding-window attention then met a mask of the wrong length)."""
    named = [(f"input {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    return {f"{name} (a {type(v).__name__})": _reach(v, depth, set())
            for name, value in named for v in pytree.tree_leaves(value) if _is_object(v)}


def tensor_versions(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, int]:
    """Per tensor among a call's arguments (``input 0``, a keyword's name; ``input 1[2]`` inside a
    list or dict), its version counter, which a change in place bumps (an activation with
    ``inplace=True`` applied to its input). An inference tensor has none and is left out."""
    out = {}
    named = [(f"input {i}", a) for i, a in enumerate(args)] + list(kwargs.items())
    for name, value in named:
        leaves = [value] if isinstance(value, torch.Tensor) else pytree.tree_leaves(value)
        for j, leaf in enumerate(leaves):
            if isinstance(leaf, torch.Tensor) and not leaf.is_inference():
                out[name if leaf is value else f"{name}[{j}]"] = leaf._version
    return out


def _reach(v: Any, depth: int, seen: set[int]) -> Any:
    if isinstance(v, torch.Tensor):
        return id(v), tuple(v.shape), v._version
    if isinstance(v, _VALUES):
        return repr(v) if isinstance(v, float) else v        # (a NaN equals no NaN)
    if depth == 0 or id(v) in seen:
        return id(v)
    seen.add(id(v))
    if isinstance(v, (list, tuple)):
        return type(v).__name__, tuple(_reach(x, depth - 1, seen) for x in v)
    if isinstance(v, dict):
        return "dict", tuple((str(k), _reach(x, depth - 1, seen)) for k, x in v.items())
    if not openable(v):                  # a module, a function, a class: itself
        return id(v)
    return type(v).__name__, tuple((k, _reach(x, depth - 1, seen)) for k, x in sorted(vars(v).items()))


def _containers(value: Any, where: str) -> list[tuple[str, Any, Any]]:
    """Each dict and list among the inputs: (where, the container, a shallow copy of it)."""
    if type(value) is dict:
        return [(where, value, dict(value))] + [c for k, v in value.items() for c in _containers(v, f"{where}[{k!r}]")]
    if type(value) in (list, tuple):
        inner = [c for i, v in enumerate(value) for c in _containers(v, f"{where}[{i}]")]
        return ([(where, value, list(value))] if type(value) is list else []) + inner
    return []


def _check_containers(containers: list[tuple[str, Any, Any]]) -> None:
    """Raise RecompileError, once every container is put back, where the call added, removed or
    replaced an entry of a dict or list among the inputs (sentence-transformers' modules add their
    embeddings to the features dict they are given). The search's calls would grow the example
    inputs, the build would be made for those, and no call of the user's would match it: every
    one ran the original module."""
    changed = [(where, now, before) for where, now, before in containers if _changed(now, before)]
    if not changed:
        return
    where, now, before = changed[0]
    keys = sorted(set(now) ^ set(before), key=str) if type(now) is dict else []
    kind = type(now).__name__
    for _, now, before in containers:
        if type(now) is dict:
            now.clear()
            now.update(before)
        else:
            now[:] = before
    added = f" ({', '.join(map(repr, keys[:4]))})" if keys else ""
    raise RecompileError(
        f"the model's forward changes the entries of the {kind} {where}{added} on every call; a "
        "build is made for the inputs a call passes, and recompile's calls would have changed them (recompile "
        "put them back)",
        fix="recompile a module whose forward gets a copy: class Copying(nn.Module): def __init__(self, model): "
            "super().__init__(); self.model = model; def forward(self, features): return self.model(dict(features)) "
            "(sentence-transformers' modules add their outputs to the features dict they are given), and load and "
            "call that module")


def _changed(now: Any, before: Any) -> bool:
    if type(now) is dict:
        return now.keys() != before.keys() or any(now[k] is not v for k, v in before.items())
    return len(now) != len(before) or any(a is not b for a, b in zip(now, before, strict=True))


def _tracked(model: torch.nn.Module, inputs: tuple[Any, ...]) -> dict[str, torch.Tensor]:
    """The tensors a call could change for the next one, keyed ``buffer NAME`` and ``input I``."""
    out = {f"buffer {name}": b for name, b in model.named_buffers()}
    out.update({f"input {i}": t for i, t in enumerate(pytree.tree_leaves(inputs)) if isinstance(t, torch.Tensor)})
    return out


def _weight_versions(model: torch.nn.Module) -> dict[str, int]:
    """Each parameter's version counter, which an in-place change moves (no copy of the weights);
    a lazy module's weights not made yet are left out (their first call makes them, and rewrites
    nothing)."""
    return {name: p._version for name, p in model.named_parameters()
            if not isinstance(p, torch.nn.parameter.UninitializedParameter)}


def _renormed_embeddings(model: torch.nn.Module) -> list[str]:
    """The names of the embeddings with ``max_norm``, which renormalize the rows a call looks up,
    in place: each call with other ids changes the weights again."""
    return [name for name, m in model.named_modules() if isinstance(m, torch.nn.Embedding) and m.max_norm is not None]


def _warn_rewritten_weights(before: dict[str, int], after: dict[str, int], renormed: list[str]) -> None:
    """Say where a call rewrote weights in place (RWKV rescales its layers on its first call in eval
    mode): the build holds the weights as the call left them, and load_build applies it only to a
    model whose weights match, so a service's fresh model ran eagerly ("weights changed"). An
    embedding with ``max_norm`` (``renormed``) rewrites the rows of every call's ids, so no model
    called with other ids matches: its fix is to renormalize the whole table once."""
    names = [name for name, v in after.items() if name in before and before[name] != v]
    renormed = [name for name in renormed if f"{name}.weight" in names]
    if renormed:
        log.warning("cuvil-pgc: %s renormalizes the rows each call looks up in place (max_norm), so the weights "
                    "change with every call's ids and load_build finds them changed since the build (it runs the "
                    "model eagerly): renormalize every row once and drop max_norm, which gives its outputs (to "
                    "rounding) (with torch.no_grad(): emb.weight.copy_(torch.renorm(emb.weight, 2, 0, emb.max_norm)); "
                    "emb.max_norm = None), in the model you recompile and in the one you load the build onto",
                    ", ".join(renormed[:3]))
        return
    if names:
        log.warning("cuvil-pgc: the model's first call changed its weights in place (%s%s): the build holds them "
                    "as that call left them, and load_build applies it to a model whose weights match: call the "
                    "model once before load_build", ", ".join(names[:3]), " and more" if len(names) > 3 else "")


def _values(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {key: t.detach().clone() for key, t in tensors.items()}


def _repeat_check(model: torch.nn.Module, inputs: tuple[Any, ...], first: Any, second: Any, rtol: float | None,
                  atol: float | None) -> AccuracyResult:
    """The accuracy guard's verdict on two calls' outputs, or, where they differ, on the second's
    and a third's (a first call may warm something up)."""
    from cuvil_pgc.recompile.accuracy import check_outputs

    check = check_outputs(first, second, rtol=rtol, atol=atol)
    return check if check.ok else check_outputs(second, _call(model, inputs), rtol=rtol, atol=atol)


def _searchable(model: torch.nn.Module, kept: frozenset[str]) -> bool:
    """Whether a submodule with weights remains to be searched besides the modules ``kept`` eager."""
    return any(q and q not in kept and next(m.parameters(), None) is not None for q, m in model.named_modules())


def _held_draws(model: torch.nn.Module, inputs: tuple[Any, ...], check: AccuracyResult, rtol: float | None,
                atol: float | None) -> HeldState:
    """The state to hold for a forward whose outputs differ from call to call (``check``, the
    guard's verdict): the modules that draw random numbers (:mod:`.random_draws`) stay eager and the
    generators' state is held, where submodules with weights that draw none remain to be searched
    and the outputs then repeat; else raise :class:`RecompileError` (see :func:`_random_error`)."""
    try:
        drawing = drawing_modules(model, lambda: model(*inputs))
    except Exception:             # the user's model under a dispatch mode: refused as before
        drawing = frozenset()
    if drawing and _searchable(model, drawing):
        held = HeldState((), drawing, (), generator_state())
        with holding(model, held):
            check = _repeat_check(model, inputs, _call(model, inputs), _call(model, inputs), rtol, atol)
        if check.ok:
            log.warning("cuvil-pgc: the model's forward draws random numbers%s: %s eager, drawing as %s, and "
                        "recompile searches the submodules that draw none (starting each of its calls from the "
                        "same random state, so that eager's draws repeat)",
                        f" (in {', '.join(sorted(q for q in drawing if q)[:4])})" if drawing - {""} else "",
                        "they stay" if drawing - {""} else "it stays", "they do" if drawing - {""} else "it does")
            return held
    _random_error(check)


def _random_error(check: AccuracyResult) -> NoReturn:
    """Refuse a forward whose outputs differ between calls (``check``, the guard's verdict)."""
    raise RecompileError(
        f"the model's outputs differ between calls on the same inputs ({check.reason}): its forward draws "
        "random numbers (noise, a sampled latent, torch.multinomial, dropout that eval() does not switch off), "
        "and no build draws the numbers eager draws, so every candidate would fail the accuracy guard; no "
        "submodule with weights draws none from torch's own generators",
        fix="draw the random numbers outside the model and pass them in as an input, or draw them in a module "
            "apart from the ones that compute (as a VAE samples its latent between encoder and decoder), from "
            "torch's generator rather than one the model holds; widen rtol/atol only if differences this large "
            "are acceptable")


def _call(model: torch.nn.Module, inputs: tuple[Any, ...]) -> Any:
    with torch.no_grad():
        return model(*inputs)


def _same(now: torch.Tensor, before: torch.Tensor) -> bool:
    """Bit-for-bit the same values (NaN where NaN was: an untouched buffer of NaNs is unchanged); a
    sparse tensor's, part by part (:func:`~cuvil_pgc._structure.strided_parts`)."""
    if now.shape != before.shape or now.dtype != before.dtype or now.layout != before.layout:
        return False
    if now.layout is not torch.strided:
        parts, were = strided_parts(now), strided_parts(before)
        return len(parts) == len(were) and all(_same(a, b) for a, b in zip(parts, were, strict=True))
    if torch.equal(now, before):
        return True
    if now.is_floating_point() or now.is_complex():
        return bool(((now == before) | (now.isnan() & before.isnan())).all())
    return False
