"""Trace files: schema, streaming writer, tolerant reader and the columnar Trace."""

from __future__ import annotations

from cuvil_pgc.trace.columns import Source, StringTable, Trace

__all__ = ["Source", "StringTable", "Trace"]
