"""The operator table as a :class:`~cuvil_pgc.viewer.tables.TableView` (``cuvil-pgc ops``, ``summary``).

Device columns appear when the trace has device time, FLOP and byte columns when it knows any,
the shapes column with ``--group-by-shape``.
"""

from __future__ import annotations

from cuvil_pgc.analyze.operators import OperatorStats, has_device_time
from cuvil_pgc.viewer.formats import fmt_rate, fmt_us
from cuvil_pgc.viewer.tables import Column, TableView


def operators_view(rows: list[OperatorStats], *, title: str = "Operators", top: int | None = None,
                   group_by_shape: bool = False) -> TableView:
    """Rows (already sorted) as a table view; ``top`` keeps the first rows."""
    shown = rows[:top] if top else rows
    total_self = sum(r.self_cpu_us for r in rows) or 1.0
    columns = [Column("name", "operator", identifier=True),
               Column("calls", "calls", justify="right"),
               Column("self_cpu_us", "self CPU", fmt_us, "right"),
               Column("self_cpu_share", "self %", lambda x: f"{x:.1%}", "right", drop=3),
               Column("total_cpu_us", "CPU total", fmt_us, "right", drop=2)]
    if has_device_time(rows):
        columns += [Column("self_device_us", "self device", fmt_us, "right", drop=4),
                    Column("device_us", "device total", fmt_us, "right")]
    if any(r.flops is not None for r in rows):
        columns.append(Column("flops", "FLOPs", lambda x: fmt_rate(x, ""), "right", drop=5))
    if any(r.bytes is not None for r in rows):
        columns.append(Column("bytes", "bytes", lambda x: fmt_rate(x, "B"), "right", drop=6))
    if group_by_shape:
        columns.append(Column("shapes", "input shapes", lambda s: s or "-", identifier=True, stack_under="name"))
    data = [{**r.to_json(), "self_cpu_share": r.self_cpu_us / total_self} for r in shown]
    more = len(rows) - len(shown)
    caption = f"{more} more operators (--top N to show more)" if more > 0 else None
    return TableView(title, columns, data, caption)
