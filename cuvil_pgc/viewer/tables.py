"""Tables of the CLI: one description, three outputs (a terminal table that fits, CSV, JSON).

A command builds a :class:`TableView` (columns and rows of raw values) and hands it to
:func:`print_view`, :func:`write_csv` or :func:`view_json` (``cuvil_pgc.cli.output.emit`` picks one
for ``--json`` / ``--csv`` / neither). On the terminal a table fits the
console width (80 columns when piped) without cutting an identifier: columns with the highest
``drop`` rank go first until the rest fits, and ``wide=True`` keeps every column whatever the
width, and the caption names the columns it dropped. Identifiers (region paths, build names) are
printed whole; other cells never wrap.
CSV and JSON carry the raw values (full region paths, unrounded figures) of every column.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import IO, Any

from rich.console import Group
from rich.markup import escape
from rich.padding import Padding
from rich.table import Table
from rich.text import Text

CellFormat = Callable[[Any], "str | Text"]


def fmt_speedup(x: float | None) -> str:
    """A speedup the same way everywhere: two decimals and an ``x`` (``1.94x``)."""
    return "-" if x is None else f"{x:.2f}x"


def fmt_bytes(n: int, binary: bool = False) -> str:
    """A size with one decimal: ``1.5 MB`` (powers of 1000), or ``1.5 MiB`` with ``binary``."""
    units = (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)) if binary else (("GB", 1e9), ("MB", 1e6), ("kB", 1e3))
    for unit, scale in units:
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _text(value: Any) -> str | Text:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, Text) else str(value)


@dataclass(frozen=True)
class Column:
    """One column: ``key`` into the rows, its header and how a raw value is shown.

    ``drop``: 0 is never dropped; when the table is too wide, the highest ranks go first.
    ``identifier``: a name the reader must see whole (printed without cutting; it folds only when
    nothing else is left to drop). ``stack_under``: the key of another column; when dropping left
    the table too wide, this column's value goes on a second line in that column's cell.
    """

    key: str
    header: str
    fmt: CellFormat = _text
    justify: str = "left"
    drop: int = 0
    identifier: bool = False
    stack_under: str | None = None   # when still too wide: shown as a second line under this column


@dataclass
class TableView:
    """What a command prints as a table: title, columns, rows of raw values, an optional caption."""

    title: str
    columns: Sequence[Column]
    rows: list[dict[str, Any]] = field(default_factory=list)
    caption: str | None = None

    def cells(self, row: dict[str, Any], columns: Sequence[Column]) -> list[str | Text]:
        return [c.fmt(row.get(c.key)) for c in columns]


def fitted_columns(view: TableView, width: int, wide: bool = False) -> list[Column]:
    """The columns shown at ``width``: all with ``wide``, else the lowest-ranked that fit."""
    columns = list(view.columns)
    if wide:
        return columns
    widths = _natural_widths(view)
    while _table_width([widths[c.key] for c in columns]) > width:
        droppable = [c for c in columns if c.drop > 0]
        if not droppable:
            break
        columns.remove(max(droppable, key=lambda c: (c.drop, columns.index(c))))
    return columns


def render_view(view: TableView, width: int, wide: bool = False,
                elsewhere: Sequence[str] = ()) -> tuple[Table, list[Column]]:
    """The rich table for ``view`` at ``width`` and the columns it kept. When columns were dropped,
    the caption says which, once (``elsewhere``: keys of columns the caller prints another way)."""
    columns = fitted_columns(view, width, wide)
    stacked = _stacked(view, columns, width) if not wide else {}
    if stacked:
        columns = _readd(view, columns, stacked, width)
    caption = "\n".join(x for x in (view.caption, hidden_note(view, columns, elsewhere)) if x) or None
    # the text is the user's and the tools' (an exporter's reason quoting `torch.cat([a, b], -1)`),
    # not rich markup, which dropped the brackets' contents
    table = Table(title=view.title and escape(view.title), title_justify="left",
                  caption=caption and escape(caption), caption_justify="left", show_edge=False)
    shown = [c for c in columns if c.key not in stacked]
    for c in shown:
        below = [s.header for s in columns if stacked.get(s.key) == c.key]
        table.add_column(" / ".join([c.header, *below]), justify=c.justify, no_wrap=not c.identifier,
                         overflow="fold" if c.identifier else "ellipsis")
    for row in view.rows:
        cells = dict(zip((c.key for c in columns), (escape(x) if isinstance(x, str) else x
                                                    for x in view.cells(row, columns)), strict=True))
        for key, under in stacked.items():   # indented on every line it wraps to
            cells[under] = Group(cells[under], Padding(cells[key], (0, 0, 0, 2)))
        table.add_row(*(cells[c.key] for c in shown))
    return table, columns


def hidden_note(view: TableView, columns: Sequence[Column], elsewhere: Sequence[str] = ()) -> str | None:
    """``2 columns hidden: pred. ms, tried/rej. (--wide shows them)``, or None when none is."""
    kept = {c.key for c in columns} | set(elsewhere)
    hidden = [c.header for c in view.columns if c.key not in kept]
    if not hidden:
        return None
    return f"{len(hidden)} column{'s' if len(hidden) > 1 else ''} hidden: {', '.join(hidden)} (--wide shows them)"


def _readd(view: TableView, columns: list[Column], stacked: dict[str, str], width: int) -> list[Column]:
    """Bring back dropped columns (lowest rank first) that fit once others are stacked."""
    widths = _natural_widths(view)
    for key, under in stacked.items():
        widths[under] = max(widths[under], widths[key] + 2)
    kept = {c.key for c in columns}
    for c in sorted((c for c in view.columns if c.key not in kept), key=lambda c: c.drop):
        trial = kept | {c.key}
        if _table_width([widths[k.key] for k in view.columns if k.key in trial and k.key not in stacked]) <= width:
            kept = trial
    return [c for c in view.columns if c.key in kept]


def _stacked(view: TableView, columns: list[Column], width: int) -> dict[str, str]:
    """Columns moved under another one (key -> key of the column they sit under) to fit ``width``."""
    widths = _natural_widths(view)
    keys = {c.key for c in columns}
    moved: dict[str, str] = {}
    for c in columns:
        if _table_width([widths[k.key] for k in columns if k.key not in moved]) <= width:
            break
        if c.stack_under in keys:
            moved[c.key] = c.stack_under
            widths[c.stack_under] = max(widths[c.stack_under], widths[c.key] + 2)
    return moved


def print_view(view: TableView, console: Any, wide: bool = False, elsewhere: Sequence[str] = ()) -> list[Column]:
    """Print ``view`` on ``console``; returns the columns shown (so a caller can add what it dropped,
    naming those keys in ``elsewhere`` so the caption does not call them hidden)."""
    table, columns = render_view(view, console.width, wide, elsewhere)
    needed = _table_width(list(_natural_widths(view).values()))
    if wide and needed > console.width:
        # Console.print(width=...) only narrows: a wider table needs a console of its own width on the
        # same stream, or rich squeezes every column back into the terminal's (blank or cut names).
        from rich.console import Console

        console = Console(file=console.file, width=needed, color_system=console.color_system,
                          force_terminal=console.is_terminal, no_color=console.no_color)
    console.print(table, soft_wrap=wide)
    return columns


def write_csv(view: TableView, out: IO[str] | None = None) -> None:
    """Every column of ``view`` as CSV (header row, raw values) on ``out`` (stdout)."""
    out = out or sys.stdout
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([c.key for c in view.columns])
    for row in view.rows:
        writer.writerow([_plain(row.get(c.key)) for c in view.columns])
    out.flush()


def view_json(view: TableView) -> dict[str, Any]:
    """``{"title", "columns", "rows"}`` with raw values, for ``--json``."""
    return {"title": view.title, "columns": [c.key for c in view.columns],
            "rows": [{c.key: _plain(r.get(c.key)) for c in view.columns} for r in view.rows]}


def _plain(value: Any) -> Any:
    return value.plain if isinstance(value, Text) else value


def _natural_widths(view: TableView) -> dict[str, int]:
    widths = {}
    for c in view.columns:
        cells = [c.fmt(r.get(c.key)) for r in view.rows]
        widths[c.key] = max([Text(c.header).cell_len, *(_cell_len(x) for x in cells)])
    return widths


def _cell_len(cell: str | Text) -> int:
    text = cell if isinstance(cell, Text) else Text(cell)
    return max((Text(line).cell_len for line in text.plain.splitlines()), default=0)


def _table_width(widths: list[int]) -> int:
    """Width of a rich table without outer edge and with the default padding: ``w + 2`` per column
    and a rule between columns."""
    return sum(w + 2 for w in widths) + max(len(widths) - 1, 0)
