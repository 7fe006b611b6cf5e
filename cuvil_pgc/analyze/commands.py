"""Commands of the analyze stage: ``cuvil-pgc calibrate`` (machine model).

Each command is registered by a small ``_register_<name>(app)`` function called from
:func:`register`; heavy imports (torch, the analyzer) happen inside the command bodies so
``cuvil-pgc --help`` stays fast.
"""

from __future__ import annotations

from typing import Any

import typer


def register(app: typer.Typer) -> None:
    _register_calibrate(app)


def _register_calibrate(app: typer.Typer) -> None:
    @app.command()
    def calibrate(
        device: str = typer.Option("cpu", "--device", help="cpu | cuda | cuda:N"),
        output: str | None = typer.Option(None, "-o", "--output", help="Also write the model to this file."),
        quick: bool = typer.Option(False, "--quick", help="Shorter, noisier microbenchmarks (<= 5 s on CPU)."),
        json_out: bool = typer.Option(False, "--json", help="Print the machine model as one JSON document."),
    ) -> None:
        """Measure peak FLOP/s, memory bandwidth and per-op overhead; cache them for `analyze`."""
        from rich.console import Console

        from cuvil_pgc.analyze.machine import cache_path, calibrate, normalize_device

        device = normalize_device(device)
        err = Console(stderr=True)
        with err.status(f"calibrating {device} ({'quick, ' if quick else ''}up to "
                        f"{5 if quick else 30} s on a CPU)..."):
            model = calibrate(device=device, quick=quick)
        if output:
            model.save(output)
        if json_out:
            from cuvil_pgc.cli import emit_json

            emit_json(model.to_json())
            return
        Console().print(machine_table(model))
        err.print(f"cached as {cache_path(model.fingerprint)}" + (f"; written to {output}" if output else ""))


def machine_table(model: Any) -> Any:
    """A rich table of a MachineModel's figures (GFLOP/s, GB/s, µs, FLOP/byte)."""
    from rich.table import Table

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
