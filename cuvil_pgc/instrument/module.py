"""instrument_module: a ProfileRegion around every submodule's forward, down to a depth.

Each module gets a region named by its qualified path (``model.layer1.0.conv1``; the root is
named ``prefix``) with the module's class in ``args.module``. Nested calls nest, so region paths
join those names with "/". Regions are entered and left by forward pre-hooks and forward hooks
(``always_call=True``: exceptions still close the region). ``handle.remove()`` removes every hook
and leaves the model exactly as it was.

With no session recording, each hook tests one global and returns; Dynamo traces them without a
graph break, so a later ``torch.compile`` of the instrumented model neither breaks nor recompiles
(tested with ``torch._dynamo`` counters).
"""

from __future__ import annotations

from typing import Any

from cuvil_pgc.instrument import region as _region
from cuvil_pgc.instrument.region import ProfileRegion


class InstrumentHandle:
    """Returned by :func:`instrument_module`; ``remove()`` undoes it."""

    def __init__(self, model: Any, regions: dict[str, ProfileRegion], hooks: list[Any]) -> None:
        self.model = model
        self.regions = regions
        self._hooks = hooks

    @property
    def paths(self) -> list[str]:
        """Qualified module paths that carry a region."""
        return list(self.regions)

    def remove(self) -> None:
        """Remove every hook this handle added (idempotent)."""
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()

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
    hooks: list[Any] = []
    for qualname, module in model.named_modules(prefix=prefix, remove_duplicate=True):
        level = qualname.count(".") - prefix.count(".")
        if depth is not None and level > depth:
            continue
        region = ProfileRegion(qualname, module=type(module).__name__)
        regions[qualname] = region
        hooks.append(module.register_forward_pre_hook(_pre_hook(region)))
        hooks.append(module.register_forward_hook(_post_hook(region), always_call=True))
    return InstrumentHandle(model, regions, hooks)


def _pre_hook(region: ProfileRegion):
    def pre(module: Any, args: Any) -> None:
        if _region._recorder is not None:
            region.__enter__()
    return pre


def _post_hook(region: ProfileRegion):
    def post(module: Any, args: Any, output: Any) -> None:
        if _region._recorder is not None or region._frame is not None:
            region.__exit__(None, None, None)
    return post
