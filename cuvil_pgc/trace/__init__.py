"""Trace files: schema, streaming writer, tolerant reader and the columnar Trace.

Attributes load lazily: the recording path (schema, writer) must not import numpy.
"""

from __future__ import annotations

from cuvil_pgc._lazy import lazy_getattr

_LAZY = {
    "Source": ("cuvil_pgc.trace.columns", "Source"),
    "StringTable": ("cuvil_pgc.trace.columns", "StringTable"),
    "Trace": ("cuvil_pgc.trace.columns", "Trace"),
    "load_trace": ("cuvil_pgc.trace.reader", "load_trace"),
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
