"""The report's ``gpu`` section: the per-device GPU figures and the top kernels (analyze.gpu_figures).

Same cells as the terminal table (``console_gpu.gpu_device_rows``); every string is escaped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuvil_pgc.viewer import _sections as sec
from cuvil_pgc.viewer.console_gpu import gpu_device_rows
from cuvil_pgc.viewer.formats import fmt_us
from cuvil_pgc.viewer.template import text

if TYPE_CHECKING:
    from cuvil_pgc.analyze.analysis import Analysis

TITLE = "GPU devices"
_COLS = ("device", "work", "time", "busy", "idle", "launch delay", "queue", "comm overlap")
_HEADERS = ["device", "work", "time by kind", "busy (union)", "idle and its causes", "launch delay",
            "stream queue", "comm / compute overlap"]


def gpu_section(analysis: Analysis) -> str:
    gpu = analysis.trace.get("gpu") or {}
    if not gpu:
        return sec.section("gpu", TITLE, sec.note("No GPU kernels, memcpy or memset in this trace."))
    rows = ["<tr>" + "".join(sec.cell(text(cells[c])) for c in _COLS) + "</tr>"
            for cells in map(gpu_device_rows, gpu.values())]
    body = sec.note("Busy time is the union of kernel, memcpy and memset intervals per device; idle time is the "
                    "rest of the span from the first to the last GPU event, split as HolisticTraceAnalysis does: "
                    "host wait (the launch came after the GPU went idle), kernel wait (gaps under 30 µs), other.")
    body += sec.table(_HEADERS, rows, table_id="gpu-table")
    kernels = analysis.trace.get("gpu_top_kernels") or []
    if kernels:
        krows = ["<tr>" + sec.cell(text(k["name"]), k["name"]) + sec.cell(text(k["kind"]), k["kind"])
                 + sec.cell(f"{k['count']:,}", k["count"], True) + sec.cell(text(fmt_us(k["sum_us"])), k["sum_us"], True)
                 + sec.cell(text(fmt_us(k["mean_us"])), k["mean_us"], True)
                 + sec.cell(f"{k['share']:.1%}", k["share"], True) + "</tr>" for k in kernels]
        body += sec.table(["kernel", "kind", "calls", "total", "mean", "share of kernel time"], krows,
                          table_id="gpu-kernels-table", sortable=True, num_cols=(2, 3, 4, 5))
    return sec.section("gpu", TITLE, body)
