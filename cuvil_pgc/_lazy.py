"""Lazy package attributes: packages name their public objects without importing them.

Importing ``cuvil_pgc`` (and each stage package) must stay cheap — every ``cuvil-pgc`` command
starts by importing the CLI and the stages it names, and ProfileRegion users must not pay for
numpy, torch or plotly. A package
lists ``{name: (module, attribute)}`` and uses :func:`lazy_getattr` as its ``__getattr__``.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def lazy_getattr(package: str, table: dict[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``table[name]`` on first use and caches it."""

    def __getattr__(name: str) -> Any:
        try:
            module_name, attr = table[name]
        except KeyError:
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
        value = getattr(importlib.import_module(module_name), attr)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__
