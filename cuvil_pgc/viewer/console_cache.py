"""The cache's contents by kind as a table (``cuvil-pgc cache``)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from cuvil_pgc.viewer.tables import Column, TableView, fmt_bytes


def usage_view(root: Any, usage: Iterable[Any], evictable: Iterable[str]) -> TableView:
    """One row per kind (``_cache.usage``: entries, bytes, oldest and newest use) and a total."""
    evictable = set(evictable)
    rows = [{"kind": u.kind, "entries": u.entries, "bytes": u.bytes, "oldest": u.oldest, "newest": u.newest,
             "evictable": u.kind in evictable} for u in usage]
    rows.append({"kind": "total", "entries": sum(r["entries"] for r in rows), "bytes": sum(r["bytes"] for r in rows),
                 "oldest": None, "newest": None, "evictable": None})
    columns = [Column("kind", "kind"), Column("entries", "entries", justify="right"),
               Column("bytes", "size", _binary, "right"), Column("oldest", "oldest use", _age, "right", drop=2),
               Column("newest", "last use", _age, "right", drop=1),
               Column("evictable", "LRU-bounded", lambda e: "-" if e is None else ("yes" if e else "no"), drop=3)]
    return TableView(f"cache {root}", columns, rows)


def _binary(n: int) -> str:
    return fmt_bytes(n, binary=True)


def _age(t: float | None) -> str:
    if t is None:
        return "-"
    days = (time.time() - t) / 86400
    return f"{days:.0f} d" if days >= 1 else f"{days * 24:.0f} h" if days * 24 >= 1 else "< 1 h"
