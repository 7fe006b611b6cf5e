"""torch.profiler's module regions ↔ the model's submodules.

A trace recorded with ``torch.profiler.profile(with_stack=True)`` names each module call
``<Class>_<n>`` (the reader makes them regions, ``Sequential_0/Linear_1``; see ``trace.schema``),
numbering the instances of each class in the order the profiled run first called them.
:func:`module_call_names` runs the model once with a hook on every submodule and numbers them the
same way (``{"M_0": "", "Linear_0": "b", "Sequential_0": "blk", "Linear_1": "blk.0"}``);
:func:`profiled_qualname` maps a region path with it where every numbered component from the
first named module on is named, each a submodule of the one before, a user's ranges between them
passed over (``ProfilerStep/M_0/Sequential_0/Linear_1`` → ``blk.0``). A run that first called the
modules in another order than the profiled one (a branch taken on other data) fails that check
for the regions it renumbers, which are left unmatched.
"""

from __future__ import annotations

import re
from typing import Any

import torch

_NUMBERED = re.compile(r"^[A-Za-z_]\w*_\d+$")


def numbered_regions(paths: list[str]) -> bool:
    """Whether any region path ends in a numbered module call (``Linear_1``)."""
    return any(_NUMBERED.match(p.rsplit("/", 1)[-1]) for p in paths)


def module_call_names(model: torch.nn.Module, inputs: tuple[Any, ...]) -> dict[str, str]:
    """``<Class>_<n>`` → qualname for the modules one forward of ``model`` on ``inputs`` calls
    (TorchScript modules take no hooks and are left out)."""
    names: dict[str, str] = {}
    seen: set[int] = set()
    per_class: dict[str, int] = {}
    hooks = []
    for qualname, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):
            continue

        def first_call(m: torch.nn.Module, _args: Any, qualname: str = qualname) -> None:
            if id(m) in seen:
                return
            seen.add(id(m))
            cls = type(m).__name__
            names[f"{cls}_{per_class.get(cls, 0)}"] = qualname
            per_class[cls] = per_class.get(cls, 0) + 1
        hooks.append(module.register_forward_pre_hook(first_call))
    try:
        with torch.no_grad():
            model(*inputs)
    finally:
        for hook in hooks:
            hook.remove()
    return names


def profiled_qualname(path: str, names: dict[str, str]) -> str | None:
    """The submodule a torch.profiler module region's path names (see module docstring), or None."""
    parts = path.split("/")
    first = next((i for i, part in enumerate(parts) if part in names), None)
    if first is None:
        return None
    qualname = names[parts[first]]
    for part in parts[first + 1:]:
        inner = names.get(part)
        if inner is None and not _NUMBERED.match(part):
            continue          # a record_function range inside a module's forward
        if inner is None or not _inside(inner, qualname):
            return None
        qualname = inner
    return qualname


def _inside(inner: str, outer: str) -> bool:
    return outer == "" or inner.startswith(outer + ".")
