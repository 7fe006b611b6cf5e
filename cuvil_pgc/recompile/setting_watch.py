"""A loaded region runs its original module while a setting inside it differs from the one it was built with.

A program holds what its module's attributes were when it was built: a calibration temperature
(``logits / self.temperature``), a flag, peft's active adapter (``_active_adapter``,
``_disable_adapters``), a parameter the service assigns anew. The load checks them once
(``settings_digest``); a service that sets one afterwards (``model.temperature = 2.5`` once it has
calibrated, ``with model.disable_adapter():``) got the build's old answers, silently, off by 0.06 on
a softmax. :func:`watch_region` watches each module inside a loaded region: setting an attribute to
another value than it had at load makes the region run its original module (which reads the new
value) until the value is set back, with one warning naming it.

The watch is on the modules' classes, as Dynamo's ``mutation_guard`` is: each class's
``__setattr__`` is wrapped once, to look the module up among the watched ones (a dict lookup on
every attribute set of that class; none on a call). Not watched: ``training`` (the region follows
``train()``/``eval()`` itself), the attributes the module's own forward writes (a cache, a call's
scratch values: the build's ``settings_skip``), what the original module writes while the region
runs it, and values no program holds (a configuration object, a method bound anew). A weight
changed in place (``param.data.copy_``) is no attribute set; a checkpoint loaded with
``load_state_dict`` is seen by :mod:`.region_state`.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

log = logging.getLogger("cuvil_pgc.recompile.apply")      # where the regions' other warnings go

_MISSING = object()
#: id(module) -> (a weak reference to it, the watches it is in)
_WATCHED: dict[int, tuple[weakref.ref[nn.Module], list[Watch]]] = {}


class Watch:
    """One region's watch: the values its modules' attributes had at load, for those set since to
    another (``changed``), and whether the region is running its original module (``running``)."""

    def __init__(self, region: Any, names: dict[int, str], skip: frozenset[str]) -> None:
        self.region = weakref.ref(region)
        self.names, self.skip = names, skip
        self.loaded: dict[tuple[int, str], Any] = {}
        self.changed: set[tuple[int, str]] = set()
        self.running = 0

    def set(self, module: nn.Module, key: str, before: Any, value: Any) -> None:
        """``module.key`` was set from ``before`` to ``value``."""
        name = self.names.get(id(module), "")
        path = f"{name}.{key}" if name else key
        if self.running or path in self.skip or key == "training" or not (_held(before) or _held(value)):
            return
        slot = (id(module), key)
        at_load = self.loaded.setdefault(slot, before)
        was = bool(self.changed)
        if _same(value, at_load):
            self.changed.discard(slot)
        else:
            self.changed.add(slot)
        region = self.region()
        if region is None or was == bool(self.changed):
            return
        region.settings_changed(path if self.changed else None)


def watch_region(region: Any, original: nn.Module, skip: Iterable[str] = ()) -> Watch:
    """Watch the modules inside ``region`` (its ``original`` tree); ``skip``: the attributes, as
    ``submodule.name`` paths from ``original``, that its forward writes. Returns the watch."""
    tree = list(original.named_modules())          # each module once, by its first name
    watch = Watch(region, {id(module): name for name, module in tree}, frozenset(skip))
    for _, module in tree:
        _patch(type(module))
        entry = _WATCHED.get(id(module))
        if entry is None or entry[0]() is not module:
            entry = (weakref.ref(module, lambda _, key=id(module): _WATCHED.pop(key, None)), [])
            _WATCHED[id(module)] = entry
        entry[1][:] = [w for w in entry[1] if w.region() is not None]     # builds loaded before and gone
        entry[1].append(watch)
    return watch


def _patch(cls: type) -> None:
    """Wrap ``cls.__setattr__`` (once per class, where it does not already run a wrapper)."""
    if getattr(cls.__setattr__, "_cuvil_watching", False):
        return
    previous = cls.__setattr__

    def __setattr__(self: Any, key: str, value: Any) -> None:
        entry = _WATCHED.get(id(self))
        if entry is None or entry[0]() is not self:
            previous(self, key, value)
            return
        before = _current(self, key)
        previous(self, key, value)
        for watch in list(entry[1]):
            watch.set(self, key, before, value)

    __setattr__._cuvil_watching = True          # type: ignore[attr-defined]
    cls.__setattr__ = __setattr__               # type: ignore[method-assign,assignment]


def _current(module: nn.Module, key: str) -> Any:
    """What ``module.key`` is: a plain attribute, a parameter, a buffer or a submodule."""
    found = module.__dict__.get(key, _MISSING)
    if found is _MISSING:
        for store in ("_parameters", "_buffers", "_modules"):
            found = module.__dict__.get(store, {}).get(key, _MISSING)
            if found is not _MISSING:
                break
    return found


#: the plain values a program can hold as constants
_PLAIN = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device)


def _held(value: Any) -> bool:
    """Whether a program can hold ``value``: a plain value (or a tuple or list of them), a tensor (a
    weight assigned anew), a module (a submodule replaced). Not other objects: a Hugging Face
    model's ``generation_config`` that ``generate()`` sets, a method bound anew, a cache."""
    if isinstance(value, (tuple, list)):
        return all(_held(v) for v in value)
    return isinstance(value, (*_PLAIN, torch.Tensor, nn.Module))


def _same(a: Any, b: Any) -> bool:
    """The same object, or an equal plain value (a number, a string, a tuple of them)."""
    if a is b:
        return True
    if type(a) is not type(b) or not isinstance(a, (bool, int, float, complex, str, bytes, tuple, frozenset)):
        return False
    try:
        return bool(a == b)
    except Exception:          # a tuple holding tensors
        return False
