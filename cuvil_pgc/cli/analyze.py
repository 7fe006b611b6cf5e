"""``cuvil-pgc analyze`` (hot regions, bottlenecks, fusion candidates), ``summary`` (the short
version) and ``diff`` (what got faster or slower): the commands that read traces and print an
Analysis. Heavy imports (the analyzer, numpy) happen inside the command bodies so that
``cuvil-pgc --help`` stays fast."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import typer

from cuvil_pgc.cli.output import emit, emit_json


def register_summary(app: typer.Typer) -> None:
    @app.command()
    def summary(
        trace: list[str] = typer.Argument(..., help="Trace file(s): ours or torch.profiler's."),
        top: int = typer.Option(15, "--top", help="How many regions to show."),
        json_out: bool = typer.Option(False, "--json", help="Print the table as one JSON document."),
        csv_out: bool = typer.Option(False, "--csv", help="Print the table as CSV."),
        wide: bool = typer.Option(False, "--wide", help="Every column, whatever the terminal width."),
    ) -> None:
        """Print the top regions of a trace as a table (the top operators when it has no regions)."""
        from rich.console import Console
        from rich.text import Text

        from cuvil_pgc.analyze import analyze
        from cuvil_pgc.trace import load_trace
        from cuvil_pgc.viewer.console import hot_region_rows, hot_regions_view, render_hot_regions
        from cuvil_pgc.viewer.progress import stage_progress

        with stage_progress(2) as progress:          # a bar on interactive terminals only (stderr)
            with progress.stage(f"loading {len(trace)} trace(s)"):
                loaded = load_trace(*trace)
            with progress.stage("analysing"):
                analysis = analyze(loaded)
        facts = analysis.trace
        head = {"traces": list(trace), "events": facts.get("events", 0),
                "duration_us": facts.get("duration_us", 0.0)}
        if json_out and analysis.regionless():    # what the terminal shows instead of one "(outside regions)" row
            from cuvil_pgc.analyze.operators import operator_stats

            head["operators"] = [r.to_json() for r in operator_stats(loaded)[:top]]
        if json_out or csv_out:
            view = hot_regions_view(analysis, top)
            view.rows = hot_region_rows(view)
            emit(view, None, as_json=json_out, as_csv=csv_out, extra_json=head)
            return
        console = Console()
        console.print(Text(f"{', '.join(trace)}: {head['events']} events, {head['duration_us'] / 1000:.1f} ms",
                           style="bold"))
        if analysis.regionless():
            _print_top_operators(loaded, console, top, wide)
            return
        render_hot_regions(analysis, console, top=top, wide=wide)


def _print_top_operators(trace: Any, console: Any, top: int, wide: bool) -> None:
    from rich.text import Text

    from cuvil_pgc.analyze.operators import operator_stats
    from cuvil_pgc.viewer.console_ops import operators_view
    from cuvil_pgc.viewer.tables import print_view

    rows = operator_stats(trace)
    if not rows:
        console.print(Text("no regions and no operators in this trace: record with ops=True, or wrap code in "
                           "ProfileRegion / run it with cuvil-pgc profile --model", style="dim"))
        return
    print_view(operators_view(rows, title="Top operators (the trace has no regions)", top=top), console, wide)
    console.print(Text("wrap code in ProfileRegion (or use instrument_module) to rank regions; "
                       "`cuvil-pgc ops` has the full operator table", style="dim"))


def register_analyze(app: typer.Typer) -> None:
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
        from cuvil_pgc.analyze.analyzer import analyze as run_analysis
        from cuvil_pgc.analyze.machine import MachineModel
        from cuvil_pgc.cli.fleet import analyze_on_engine, wants_engine
        from cuvil_pgc.viewer.progress import stage_progress
        from cuvil_pgc.viewer.renderers import renderer

        model = MachineModel.load(machine) if machine else None
        # The fallback-machine warning comes back in result.trace["warnings"] and is printed below:
        # keep the module's own log line from printing it a second time.
        logging.getLogger("cuvil_pgc.analyze.machine").setLevel(logging.ERROR)
        if engine is not None or address is not None or wants_engine(traces):
            result = analyze_on_engine(traces, engine or "local", address, workers, model, filter)
        else:
            with stage_progress(2) as progress:          # a bar on interactive terminals only (stderr)
                with progress.stage(f"loading {len(traces)} trace(s)"):
                    trace = _load_inputs(traces)
                with progress.stage("analysing"):
                    result = run_analysis(trace, machine=model, filter=filter)
        _warn(result.trace.get("warnings", []))
        if json_out:
            doc = result.to_json()
            if top:
                doc["regions"] = doc["regions"][:top]
            emit_json(doc)
            return
        shown = renderer("csv", top=top) if csv_out else renderer("console", top=top or 20, wide=wide)
        sys.stdout.write(shown.render(result))
        sys.stdout.flush()


def register_diff(app: typer.Typer) -> None:
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
            emit_json(doc)
            return
        from rich.console import Console

        from cuvil_pgc.viewer.console import diff_view, render_diff

        if csv_out:
            from cuvil_pgc.viewer.tables import write_csv

            write_csv(diff_view(doc))
            return
        render_diff(doc, Console(), wide=wide)


def _load_inputs(traces: list[str]) -> Any:
    """Trace files, or one Parquet export directory (cuvil-pgc export --parquet)."""
    from cuvil_pgc.trace.reader import load_trace

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
