"""What commands print besides their tables: one JSON document, the table-or-CSV-or-JSON choice,
warnings on stderr, and usage errors.

``--json`` commands print exactly one JSON document on stdout (:func:`emit_json`) and nothing else
there; warnings and notes go to stderr.
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from cuvil_pgc.errors import ConfigError


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (the only thing a --json command prints there)."""
    import orjson

    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
                                         | orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()


def emit(view: Any, console: Any, *, as_json: bool = False, as_csv: bool = False,
         wide: bool = False, extra_json: dict[str, Any] | None = None) -> list[Any] | None:
    """The one exit of a table command: JSON, CSV or the fitted table of a ``TableView``; returns the
    columns shown on the terminal (None for JSON and CSV)."""
    from cuvil_pgc.viewer.tables import print_view, view_json, write_csv

    if as_json and as_csv:
        raise ConfigError("--json and --csv are exclusive: pick one")
    if as_json:
        emit_json({**(extra_json or {}), **view_json(view)})
        return None
    if as_csv:
        write_csv(view)
        return None
    return print_view(view, console, wide)


def busy_warnings(what: str) -> list[str]:
    """The busy-machine warning (``analyze.contention``) for ``what`` was just measured, if any."""
    from cuvil_pgc.analyze.contention import host_load, load_warning

    warning = load_warning(host_load(), what)
    return [warning] if warning else []


def print_warnings(warnings: list[str]) -> None:
    """Each warning as ``warning: ...`` on stderr, wrapped at words to the terminal's width."""
    from cuvil_pgc.viewer.notes import print_note

    for warning in warnings:
        print_note(f"warning: {warning}", err=True)


def usage_error(message: str, usage: str) -> None:
    """One line on stderr and exit 2, as for the parser's own usage errors."""
    typer.echo(f"cuvil-pgc: error: {message} (usage: {usage})", err=True)
    raise typer.Exit(2)
