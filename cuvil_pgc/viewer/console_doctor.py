"""The backend checks of ``cuvil-pgc doctor`` as a rich table."""

from __future__ import annotations

from typing import Any

from rich.markup import escape
from rich.table import Table


def doctor_table(checks: list[Any]) -> Table:
    """One row per check (``BackendCheck``): status, what was found or why not, and what to do."""
    table = Table(title="cuvil-pgc doctor", show_lines=False)
    for column in ("Backend", "Status", "Found / why not", "What to do"):
        table.add_column(column, overflow="fold")
    for c in checks:
        status = "[green]ok[/green]" if c.ok else "[yellow]unavailable[/yellow]"
        # escaped: a fix like pip install 'cuvil-pgc[ort]' is not rich markup
        table.add_row(escape(c.name), status, escape(c.detail if c.ok else (c.reason or "")),
                      escape("" if c.ok else (c.fix or "")))
    return table
