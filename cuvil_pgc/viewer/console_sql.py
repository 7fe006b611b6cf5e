"""Rows of a ``cuvil-pgc sql`` query on the terminal."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def print_rows(columns: list[str], rows: list[dict[str, Any]], console: Console) -> None:
    """The rows as a table (floats to three decimals, nulls empty) and their count."""
    view = Table(show_lines=False)
    for name in columns:
        view.add_column(name, overflow="fold")
    for r in rows:
        view.add_row(*["" if r[c] is None else f"{r[c]:,.3f}".rstrip("0").rstrip(".") if isinstance(r[c], float)
                       else str(r[c]) for c in columns])
    console.print(view)
    console.print(f"{len(rows)} row(s)", style="dim")
