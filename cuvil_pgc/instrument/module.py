"""instrument_module: a ProfileRegion around every submodule's forward, down to a depth.

Each module gets a region named by its qualified path (``model.layer1.0.conv1``; the root is
named ``prefix``) with the module's class in ``args.module`` and a prefix of its structural hash
in ``args.structure`` (cuvil_pgc._structure), which the recompiler uses to tell stale regions. Nested calls nest, so region paths
join those names with "/".

The region wraps the module's ``forward`` through an instance attribute rather than forward hooks:
a module with any hook takes ``nn.Module``'s slow call path, which cost more than the region itself
(measured in benchmarks/profile_overhead.py). ``handle.remove()`` deletes those attributes (or puts
back an instance ``forward`` the user had set) and leaves the model exactly as it was.

A TorchScript module (``torch.jit.load``'s, or a scripted block in a Python model) gets its region,
but its submodules do not: TorchScript calls them in C++, never through their Python ``forward``
(which a traced submodule may not even have).

With no session recording, each wrapper tests one global and calls the original forward; Dynamo
traces it without a graph break, so a later ``torch.compile`` of the instrumented model neither
breaks nor recompiles (tested with ``torch._dynamo`` counters).
"""

from __future__ import annotations

import functools
from typing import Any

from cuvil_pgc._structure import SHORT, structural_hash
from cuvil_pgc.instrument.region import ProfileRegion, recording


class InstrumentHandle:
    """Returned by :func:`instrument_module`; ``remove()`` undoes it."""

    def __init__(self, model: Any, regions: dict[str, ProfileRegion], patched: list[tuple[Any, Any]]) -> None:
        self.model = model
        self.regions = regions
        self._patched = patched     # (module, the instance forward it had before, or _ABSENT)

    @property
    def paths(self) -> list[str]:
        """Qualified module paths that carry a region."""
        return list(self.regions)

    def remove(self) -> None:
        """Restore every module's forward (idempotent)."""
        for module, previous in reversed(self._patched):
            if previous is _ABSENT:
                module.__dict__.pop("forward", None)
            else:
                module.__dict__["forward"] = previous
        self._patched.clear()

    def __enter__(self) -> InstrumentHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def instrument_module(model: Any, depth: int | None = None, prefix: str = "model") -> InstrumentHandle:
    """Wrap ``model`` and its submodules down to ``depth`` (None: all; 0: the root only) in regions.

    Args:
        model: a ``torch.nn.Module``.
        depth: how many levels below the root get regions.
        prefix: name of the root region; children are ``prefix.child.grandchild``.

    Returns:
        An :class:`InstrumentHandle`; call ``.remove()`` to restore the model.
    """
    import torch

    if not isinstance(model, torch.nn.Module):
        from cuvil_pgc.errors import ConfigError

        raise ConfigError(f"instrument_module needs a torch.nn.Module, got {type(model).__name__}")
    if depth is not None and depth < 0:
        from cuvil_pgc.errors import ConfigError

        raise ConfigError(f"depth={depth} must be >= 0 or None")
    regions: dict[str, ProfileRegion] = {}
    patched: list[tuple[Any, Any]] = []
    scripted: list[str] = []       # TorchScript modules: their submodules are called inside TorchScript
    for qualname, module in model.named_modules(prefix=prefix, remove_duplicate=True):
        level = qualname.count(".") - prefix.count(".")
        if depth is not None and level > depth or any(qualname.startswith(f"{s}.") for s in scripted):
            continue
        if isinstance(module, torch.jit.ScriptModule):
            scripted.append(qualname)
        region = ProfileRegion(qualname, module=type(module).__name__,
                               structure=structural_hash(module)[:SHORT])
        regions[qualname] = region
        patched.append((module, module.__dict__.get("forward", _ABSENT)))
        module.__dict__["forward"] = _wrap(module.forward, region)
    return InstrumentHandle(model, regions, patched)


_ABSENT = object()


def _wrap(forward: Any, region: ProfileRegion):
    from torch.compiler import is_compiling

    @functools.wraps(forward)
    def forward_in_region(*args: Any, **kwargs: Any) -> Any:
        # where torch.compile traces the call (a model compiled whole, the body of a while_loop or
        # a torch.cond branch, which torch compiles even in eager) there is no region: Dynamo cannot
        # enter one, and with fullgraph a region made the user's call fail. Asked first, so that
        # the traced code does not read (and guard on) whether a session records
        if is_compiling() or not recording():
            return forward(*args, **kwargs)
        with region:
            return forward(*args, **kwargs)
    return forward_in_region
