"""cuvil_pgc.recompile: profile-guided plan search, verified builds, the build store and compare.

``recompile(model, example_inputs, traces, budget=...) -> Build`` (see :mod:`.build`),
``load_build(path_or_ref, model, fallback=...)``, ``compare`` (see :mod:`.compare`). Attributes load
lazily so that importing the package (the CLI does, to register commands) stays cheap.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "recompile": ("cuvil_pgc.recompile.build", "recompile"),
    "load_build": ("cuvil_pgc.recompile.build", "load_build"),
    "Build": ("cuvil_pgc.recompile.build", "Build"),
    "LoadReport": ("cuvil_pgc.recompile.build", "LoadReport"),
    "compare": ("cuvil_pgc.recompile.compare", "compare"),
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'cuvil_pgc.recompile' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value
