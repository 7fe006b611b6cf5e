"""``module.eval()`` for every model a user can hand in, including ones without the switch."""

from __future__ import annotations

from typing import Any


def eval_mode(module: Any) -> Any:
    """``module.eval()``; ``module`` itself where it has no train/eval switch. A model loaded the
    way ``torch.export`` deploys one (``torch.export.load(path).module()``) raises
    NotImplementedError ("Calling eval() is not supported yet") and runs as it was exported, so
    recompiling or loading a build for it crashed before doing anything."""
    try:
        return module.eval()
    except NotImplementedError:
        return module
