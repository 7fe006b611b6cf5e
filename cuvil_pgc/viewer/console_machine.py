"""The machine model as a rich table (``cuvil-pgc calibrate``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def machine_table(model: Any) -> Table:
    """A rich table of a MachineModel's figures (GFLOP/s, GB/s, µs, FLOP/byte)."""
    table = Table(title=f"machine model: {model.name} [{model.device}, {model.source}]")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("note", overflow="fold")
    for dtype, flops in model.peak_flops.items():
        table.add_row(f"peak {dtype}", f"{flops / 1e9:,.1f} GFLOP/s", model.notes.get(dtype, ""))
    for dtype in ("bf16", "fp16"):
        if dtype not in model.peak_flops and dtype in model.notes:
            table.add_row(f"peak {dtype}", "-", model.notes[dtype])
    table.add_row("memory bandwidth", f"{model.mem_bw / 1e9:,.2f} GB/s", "reads + writes, sustained")
    if model.dispatch_overhead_s is not None:
        table.add_row("dispatch overhead", f"{model.dispatch_us:,.2f} µs", "per eager op (host)")
    if model.launch_latency_s is not None:
        table.add_row("launch latency", f"{model.launch_us:,.2f} µs", "per kernel, launch-bound chain")
    for dtype in model.peak_flops:
        table.add_row(f"ridge point {dtype}", f"{model.ridge(dtype):,.1f} FLOP/byte", "")
    table.add_row("threads", str(model.threads), "torch intra-op threads")
    table.add_row("fingerprint", model.fingerprint, f"torch {model.torch_version}")
    return table
