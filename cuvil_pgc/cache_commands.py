"""``cuvil-pgc cache`` (what the cache holds, by kind) and ``cache clear [--older-than AGE]``."""

from __future__ import annotations

import time

import typer

from cuvil_pgc import _cache


def register(app: typer.Typer) -> None:
    cache = typer.Typer(name="cache", help="Show or trim cuvil-pgc's cache ($CUVIL_CACHE_DIR).",
                        invoke_without_command=True)

    @cache.callback()
    def show(ctx: typer.Context,
             json_out: bool = typer.Option(False, "--json", help="Print one JSON document."),
             csv_out: bool = typer.Option(False, "--csv", help="Print the table as CSV.")) -> None:
        """Size of the cache by kind (calibrations, search records, AOTInductor packages, unpacked builds)."""
        if ctx.invoked_subcommand is not None:
            return
        from rich.console import Console

        from cuvil_pgc.viewer.tables import emit

        root, limit = _cache.cache_dir(), _cache.max_bytes()
        extra = {"directory": str(root), "max_bytes": limit, "evictable": list(_cache.EVICTABLE)}
        shown = emit(_usage_view(root, limit), Console(), as_json=json_out, as_csv=csv_out, extra_json=extra)
        if shown is not None:
            bound = "no bound" if limit <= 0 else f"bound {_size(limit)} ({_cache.CACHE_MAX_ENV})"
            typer.echo(f"{root}: artifacts and unpacked builds evicted least recently used first; {bound}")

    @cache.command("clear")
    def clear(older_than: str | None = typer.Option(None, "--older-than",
                                                      help="Only entries unused for this long (30d, 12h, 45m)."),
              kind: list[str] | None = typer.Option(None, "--kind", help=f"Only this kind ({', '.join(_cache.KINDS)}).")
              ) -> None:
        """Remove cached entries (all, or those unused for --older-than)."""
        from cuvil_pgc.errors import ConfigError

        kinds = tuple(kind or _cache.KINDS)
        unknown = [k for k in kinds if k not in _cache.KINDS]
        if unknown:
            raise ConfigError(f"--kind {', '.join(unknown)} is not a cache kind", fix=f"choose from {', '.join(_cache.KINDS)}")
        age = _cache.parse_age(older_than) if older_than else None
        n, size = _cache.clear(older_than_s=age, kinds=kinds)
        typer.echo(f"removed {n} entr{'y' if n == 1 else 'ies'} ({_size(size)}) from {_cache.cache_dir()}")

    app.add_typer(cache, name="cache")


def _usage_view(root, limit: int):
    from cuvil_pgc.viewer.tables import Column, TableView

    def age(t: float | None) -> str:
        if t is None:
            return "-"
        days = (time.time() - t) / 86400
        return f"{days:.0f} d" if days >= 1 else f"{days * 24:.0f} h" if days * 24 >= 1 else "< 1 h"

    rows = [{"kind": u.kind, "entries": u.entries, "bytes": u.bytes, "oldest": u.oldest, "newest": u.newest,
             "evictable": u.kind in _cache.EVICTABLE} for u in _cache.usage(root)]
    rows.append({"kind": "total", "entries": sum(r["entries"] for r in rows), "bytes": sum(r["bytes"] for r in rows),
                 "oldest": None, "newest": None, "evictable": None})
    columns = [Column("kind", "kind"), Column("entries", "entries", justify="right"),
               Column("bytes", "size", _size, "right"), Column("oldest", "oldest use", age, "right", drop=2),
               Column("newest", "last use", age, "right", drop=1),
               Column("evictable", "LRU-bounded", lambda e: "-" if e is None else ("yes" if e else "no"), drop=3)]
    return TableView(f"cache {root}", columns, rows)


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
