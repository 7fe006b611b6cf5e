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
    "merge_traces": ("cuvil_pgc.trace.merge", "merge_traces"),
    "to_arrow": ("cuvil_pgc.trace.arrow", "to_arrow"),
    "from_arrow": ("cuvil_pgc.trace.arrow", "from_arrow"),
    "write_parquet": ("cuvil_pgc.trace.parquet", "write_parquet"),
    "read_parquet": ("cuvil_pgc.trace.parquet", "read_parquet"),
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
