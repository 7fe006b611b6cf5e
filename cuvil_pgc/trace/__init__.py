"""Trace files: schema, streaming writer, tolerant reader and the columnar Trace.

Attributes load lazily: the recording path (schema, writer) must not import numpy.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "Source": ("cuvil_pgc.trace.columns", "Source"),
    "StringTable": ("cuvil_pgc.trace.columns", "StringTable"),
    "Trace": ("cuvil_pgc.trace.columns", "Trace"),
    "load_trace": ("cuvil_pgc.trace.reader", "load_trace"),
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'cuvil_pgc.trace' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value
