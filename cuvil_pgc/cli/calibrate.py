"""``cuvil-pgc calibrate``: measure this machine's model (peak FLOP/s, bandwidth, overheads) for ``analyze``."""

from __future__ import annotations

import typer

from cuvil_pgc.cli.output import emit_json


def register(app: typer.Typer) -> None:
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
        from cuvil_pgc.viewer.console_machine import machine_table

        device = normalize_device(device)
        err = Console(stderr=True)
        with err.status(f"calibrating {device} ({'quick, ' if quick else ''}up to "
                        f"{5 if quick else 30} s on a CPU)..."):
            model = calibrate(device=device, quick=quick)
        if output:
            model.save(output)
        if json_out:
            emit_json(model.to_json())
            return
        Console().print(machine_table(model))
        err.print(f"cached as {cache_path(model.fingerprint)}" + (f"; written to {output}" if output else ""))
