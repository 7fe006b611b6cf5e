"""Commands of the analyze stage: ``cuvil-pgc calibrate`` (machine model), ``analyze`` and ``diff``.

Each command is registered by a small ``_register_<name>(app)`` function called from
:func:`register`; heavy imports (torch, the analyzer) happen inside the command bodies so
``cuvil-pgc --help`` stays fast.
"""

from __future__ import annotations

import logging
from typing import Any

import typer


def register(app: typer.Typer) -> None:
    from cuvil_pgc.analyze.ops_commands import register_ops

    _register_calibrate(app)
    _register_analyze(app)
    register_ops(app)


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


def _register_analyze(app: typer.Typer) -> None:
    @app.command()
    def analyze(
        traces: list[str] = typer.Argument(..., metavar="TRACE...", help="Trace files (ours or torch.profiler)."),
        json_out: bool = typer.Option(False, "--json", help="Print the analysis as one JSON document."),
        top: int | None = typer.Option(None, "--top", min=1,
                                       help="Hot regions to show (table default 20; JSON default all)."),
        machine: str | None = typer.Option(None, "--machine", help="Machine model file (calibrate -o)."),
        filter: str | None = typer.Option(None, "--filter", help="Only region paths matching this regex."),
        engine: str | None = typer.Option(None, "--engine",
                                          help="local | ray: analyse each trace apart, then merge (default for "
                                               "directories and globs: local)."),
        address: str | None = typer.Option(None, "--address", help="Ray cluster address (--engine ray)."),
        workers: int | None = typer.Option(None, "--workers", min=1, help="Processes for --engine local."),
        csv_out: bool = typer.Option(False, "--csv", help="Print the hot-region table as CSV."),
        wide: bool = typer.Option(False, "--wide", help="Every column, whatever the terminal width."),
    ) -> None:
        """Rank hot regions, attribute each bottleneck, and list fusion candidates."""
        from rich.console import Console

        from cuvil_pgc.analyze.analyzer import analyze as run_analysis
        from cuvil_pgc.analyze.machine import MachineModel
        from cuvil_pgc.trace.reader import load_trace
        from cuvil_pgc.viewer.progress import stage_progress

        model = MachineModel.load(machine) if machine else None
        # The fallback-machine warning comes back in result.trace["warnings"] and is printed below:
        # keep the module's own log line from printing it a second time.
        logging.getLogger("cuvil_pgc.analyze.machine").setLevel(logging.ERROR)
        from cuvil_pgc.analyze.fleet_commands import analyze_on_engine, wants_engine

        if engine is not None or address is not None or wants_engine(traces):
            result = analyze_on_engine(traces, engine or "local", address, workers, model, filter)
        else:
            with stage_progress(2) as progress:          # a bar on interactive terminals only (stderr)
                with progress.stage(f"loading {len(traces)} trace(s)"):
                    trace = _load_inputs(traces, load_trace)
                with progress.stage("analysing"):
                    result = run_analysis(trace, machine=model, filter=filter)
        _warn(result.trace.get("warnings", []))
        if json_out:
            from cuvil_pgc.cli import emit_json

            doc = result.to_json()
            if top:
                doc["regions"] = doc["regions"][:top]
            emit_json(doc)
            return
        if csv_out:
            from cuvil_pgc.viewer.console import hot_region_rows, hot_regions_view
            from cuvil_pgc.viewer.tables import write_csv

            view = hot_regions_view(result, top or len(result.regions))
            view.rows = hot_region_rows(view)
            write_csv(view)
            return
        _print_analysis(result, Console(), top or 20, wide)

    @app.command()
    def diff(
        trace_a: str = typer.Argument(..., metavar="TRACE_A", help="Before."),
        trace_b: str = typer.Argument(..., metavar="TRACE_B", help="After."),
        json_out: bool = typer.Option(False, "--json", help="Print the diff as one JSON document."),
        filter: str | None = typer.Option(None, "--filter", help="Only region paths matching this regex."),
        csv_out: bool = typer.Option(False, "--csv", help="Print the table as CSV."),
        wide: bool = typer.Option(False, "--wide", help="Every column, whatever the terminal width."),
    ) -> None:
        """Regions that got faster or slower from TRACE_A to TRACE_B, with significance."""
        from cuvil_pgc.analyze.diff import diff as run_diff

        doc = run_diff(trace_a, trace_b, filter=filter)
        if json_out:
            from cuvil_pgc.cli import emit_json

            emit_json(doc)
            return
        from rich.console import Console

        from cuvil_pgc.viewer.console import diff_view, render_diff

        if csv_out:
            from cuvil_pgc.viewer.tables import write_csv

            write_csv(diff_view(doc))
            return
        render_diff(doc, Console(), wide=wide)


def _load_inputs(traces: list[str], load_trace: Any) -> Any:
    """Trace files, or one Parquet export directory (cuvil-pgc export --parquet)."""
    import os

    if len(traces) == 1 and os.path.isdir(traces[0]):
        from cuvil_pgc.trace.parquet import is_dataset, read_parquet

        if is_dataset(traces[0]):
            return read_parquet(traces[0])
    return load_trace(*traces)


def _warn(warnings: list[str]) -> None:
    """Analysis warnings (e.g. the fallback machine model) on stderr, never on stdout."""
    from rich.console import Console

    err = Console(stderr=True)
    for warning in warnings:
        err.print(f"warning: {warning}", style="yellow", markup=False, highlight=False)


def _print_analysis(result: Any, console: Any, top: int, wide: bool = False) -> None:
    """Hot regions, fusion candidates, rank skew and (when its renderer exists) the compile summary."""
    import importlib

    from cuvil_pgc.viewer.console import render_analysis

    render_analysis(result, console, top, wide)
    totals = result.compile.get("totals") or {}
    if not (result.compile.get("graphs") or totals.get("compile_ms")):
        return                                   # nothing was compiled: no section
    try:
        compile_view = importlib.import_module("cuvil_pgc.viewer.console_compile")
    except ModuleNotFoundError:
        return
    shown = compile_view.render_compile_summary(result.compile)
    if shown is not None:
        console.print(shown)
