"""Terminal tables of the per-device GPU figures (``analysis.trace["gpu"]``, see analyze.gpu_figures).

One row per device: kernels, GPU time by kind, busy and idle time with the idle causes, launch
delay, stream queue length and communication/compute overlap; then the top kernels trace-wide.
Pure rendering: nothing here computes a figure.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cuvil_pgc.viewer.formats import fmt_us, short_name


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.0%}"


def gpu_device_rows(fig: dict[str, Any]) -> dict[str, str]:
    """The cells of one device's row, shared by the terminal table and the HTML section."""
    causes = fig.get("idle_causes_us") or {}
    idle = fig.get("idle_us") or 0.0
    delay = fig.get("launch_delay_us") or {}
    queues = [s.get("queue_length") or {} for s in (fig.get("streams") or {}).values()]
    q_mean = [q["mean"] for q in queues if q.get("mean") is not None]
    q_max = [q["max"] for q in queues if q.get("max") is not None]
    overlap = fig.get("comm_compute_overlap")
    kinds = fig.get("kinds") or {}
    work = ", ".join(f"{k} {fmt_us(v.get('sum_us'))}" for k, v in kinds.items())
    counts = [f"{fig.get('kernel_count', 0):,} kernels"]
    counts += [f"{fig[k]:,} {what}{'s' if fig[k] != 1 else ''}"
               for k, what in (("memcpy_count", "memcpy"), ("memset_count", "memset")) if fig.get(k)]
    ranges = fig.get("profiler_ranges")
    if ranges:
        counts.append(f"{ranges['count']:,} profiler-range kernels")
    return {
        "device": fig.get("device", "?") + (f" ({fig['name']})" if fig.get("name") else ""),
        "work": "; ".join(counts),
        "time": work or "-",
        "busy": f"{fmt_us(fig.get('busy_us'))} ({_pct(fig.get('busy_frac'))} of {fmt_us(fig.get('span_us'))})",
        "idle": (f"{fmt_us(idle)}: host wait {fmt_us(causes.get('host_wait'))}, kernel wait "
                 f"{fmt_us(causes.get('kernel_wait'))}, other {fmt_us(causes.get('other'))}") if idle else "-",
        "launch delay": (f"p50 {fmt_us(delay.get('p50'))}, p95 {fmt_us(delay.get('p95'))}; "
                         f"{delay.get('longer_than_kernel', 0):,} of {delay.get('count', 0):,} launches outlast "
                         "their kernel") if delay.get("count") else "-",
        "queue": f"mean {max(q_mean):.1f}, max {max(q_max):.0f}" if q_mean else "-",
        "comm overlap": "-" if not overlap else f"{_pct(overlap.get('ratio'))} of {fmt_us(overlap.get('comm_us'))}",
    }


def render_gpu(analysis: Any, console: Console, top: int = 10) -> None:
    """The GPU-device table and the top-kernel table (nothing without GPU work)."""
    gpu = analysis.trace.get("gpu") or {}
    if not gpu:
        return
    table = Table(title="GPU devices (busy = union of kernels, memcpy, memset)", title_justify="left")
    cols = ("device", "work", "busy", "idle", "launch delay", "queue", "comm overlap")
    for col in cols:
        table.add_column(col, overflow="fold")
    for fig in gpu.values():
        cells = gpu_device_rows(fig)
        table.add_row(*(Text(cells[c]) for c in cols))
    console.print(table)
    kernels = analysis.trace.get("gpu_top_kernels") or []
    if not kernels:
        return
    table = Table(title="Top GPU kernels (all devices)", title_justify="left")
    for col in ("kernel", "kind", "calls", "total", "mean", "share"):
        table.add_column(col, overflow="fold", justify="left" if col in ("kernel", "kind") else "right")
    for k in kernels[:top]:
        table.add_row(Text(short_name(k["name"], 72)), k["kind"], f"{k['count']:,}", fmt_us(k["sum_us"]),
                      fmt_us(k["mean_us"]), _pct(k["share"]))
    console.print(table)
