"""The report's ``operators`` section: the same per-operator table as ``cuvil-pgc ops``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cuvil_pgc.viewer._sections import cell, note, path_text, section, table
from cuvil_pgc.viewer.formats import fmt_rate, fmt_us
from cuvil_pgc.viewer.template import text

if TYPE_CHECKING:
    from cuvil_pgc.analyze.analysis import Analysis


def operators_section(analysis: Analysis) -> str:
    rows = analysis.operators or []
    title = "Operators"
    if not rows:
        return section("operators", title, note("No operators in this trace (profile with ops=True, or record "
                                                "torch.profiler's CPU activity)."))
    device = any(r.get("device_us") for r in rows)
    headers = ["operator", "calls", "self CPU", "CPU total", *(["self device", "device total"] if device else []),
               "FLOPs", "bytes"]
    body = [_row(r, device) for r in rows]
    intro = note("Per-operator totals over the whole trace, by self CPU time (as torch.profiler's "
                 "key_averages().table()); `cuvil-pgc ops TRACE --group-by-shape` splits them by input shapes. "
                 "Click a header to sort.")
    n = len(headers)
    return section("operators", title, intro + table(headers, body, table_id="ops-table", sortable=True,
                                                     num_cols=tuple(range(1, n))))


def _row(r: dict[str, Any], device: bool) -> str:
    times = [r["self_cpu_us"], r["total_cpu_us"], *([r["self_device_us"], r["device_us"]] if device else [])]
    flops, nbytes = r.get("flops"), r.get("bytes")
    return ("<tr>" + cell(path_text(r["name"]), r["name"]) + cell(f"{r['calls']:,}", r["calls"], True)
            + "".join(cell(text(fmt_us(t)), t, True) for t in times)
            + cell(text(fmt_rate(flops, "")), flops or 0.0, True) + cell(text(fmt_rate(nbytes, "B")), nbytes or 0.0, True)
            + "</tr>")
