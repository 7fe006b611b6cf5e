"""A compiled region's ``state_dict`` and ``load_state_dict`` as the original model's.

:class:`~.realized.CompiledRegion` registers these two hooks: a build's ``state_dict`` has the keys
of the model it was built from, and loading that model's keys loads into the original module;
weights that differ from the ones the region was built with make it run the original module from
then on (the compiled program holds the old ones). ``module`` is that region (not imported here:
``realized`` imports this module).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger("cuvil_pgc.recompile.apply")      # the name these warnings always had


def state_dict_as_original(module: Any, state_dict: dict[str, Any], prefix: str, _meta: Any) -> None:
    """A build's ``state_dict`` has the keys of the model it was built from: the original module's,
    not ``original.``-prefixed, and not the compiled program's copy (a torch.compile region's
    ``OptimizedModule`` is a submodule)."""
    inner, program = prefix + "original.", prefix + "_compiled."
    for key in [k for k in state_dict if k.startswith((inner, program))]:
        value = state_dict.pop(key)
        if key.startswith(inner):
            state_dict[prefix + key[len(inner):]] = value


def load_into_original(module: Any, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
    """``load_state_dict`` of the original model's keys loads into the original module. Weights that
    differ from the ones the region was built with make it run the original module from then on
    (the compiled program holds the old ones), with a warning."""
    inner = prefix + "original."
    current = module.original.state_dict(keep_vars=True)
    changed = []
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        value = state_dict.pop(key)
        name = key[len(prefix):]
        state_dict[inner + name] = value
        now = current.get(name)
        if not (isinstance(value, torch.Tensor) and isinstance(now, torch.Tensor) and now.shape == value.shape
                and torch.equal(now.detach(), value.detach().to(now.device))):
            changed.append(name)
    program = module._modules.get("_compiled")
    if program is not None:      # the compiled program's own copy loads as it is (see state_dict_as_original)
        for name, value in program.state_dict(keep_vars=True).items():
            state_dict.setdefault(f"{prefix}_compiled.{name}", value)
    if changed and not module.weights_changed:
        module.weights_changed = True
        module._lean = module._direct = None
        log.warning("cuvil-pgc: %s: the weights loaded into it differ from the ones it was built with (%s%s): "
                    "it runs the original module from now on; recompile for these weights", module.plan_config,
                    ", ".join(changed[:3]), f" and {len(changed) - 3} more" if len(changed) > 3 else "")
