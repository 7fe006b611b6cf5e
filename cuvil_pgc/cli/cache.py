"""``cuvil-pgc cache`` (what the cache holds, by kind) and ``cache clear [--older-than AGE]``."""

from __future__ import annotations

import typer

import cuvil_pgc._cache as _cache
from cuvil_pgc.cli.output import emit
from cuvil_pgc.errors import ConfigError


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

        from cuvil_pgc.viewer.console_cache import usage_view
        from cuvil_pgc.viewer.tables import fmt_bytes

        root, limit = _cache.cache_dir(), _cache.max_bytes()
        extra = {"directory": str(root), "max_bytes": limit, "evictable": list(_cache.EVICTABLE)}
        view = usage_view(root, _cache.usage(root), _cache.EVICTABLE)
        shown = emit(view, Console(), as_json=json_out, as_csv=csv_out, extra_json=extra)
        if shown is not None:
            bound = "no bound" if limit <= 0 else f"bound {fmt_bytes(limit, binary=True)} ({_cache.CACHE_MAX_ENV})"
            typer.echo(f"{root}: artifacts and unpacked builds evicted least recently used first; {bound}")

    @cache.command("clear")
    def clear(older_than: str | None = typer.Option(None, "--older-than",
                                                      help="Only entries unused for this long (30d, 12h, 45m)."),
              kind: list[str] | None = typer.Option(None, "--kind", help=f"Only this kind ({', '.join(_cache.KINDS)}).")
              ) -> None:
        """Remove cached entries (all, or those unused for --older-than)."""
        from cuvil_pgc.viewer.tables import fmt_bytes

        kinds = tuple(kind or _cache.KINDS)
        unknown = [k for k in kinds if k not in _cache.KINDS]
        if unknown:
            raise ConfigError(f"--kind {', '.join(unknown)} is not a cache kind", fix=f"choose from {', '.join(_cache.KINDS)}")
        age = _cache.parse_age(older_than) if older_than else None
        n, size = _cache.clear(older_than_s=age, kinds=kinds)
        typer.echo(f"removed {n} entr{'y' if n == 1 else 'ies'} ({fmt_bytes(size, binary=True)}) from {_cache.cache_dir()}")

    app.add_typer(cache, name="cache")
