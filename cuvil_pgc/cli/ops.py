"""``cuvil-pgc ops TRACE...``: the per-operator table of ours or torch.profiler's traces."""

from __future__ import annotations

import os

import typer

from cuvil_pgc.cli.output import emit, print_warnings


def register(app: typer.Typer) -> None:
    @app.command()
    def ops(
        traces: list[str] = typer.Argument(..., metavar="TRACE...", help="Trace files (ours or torch.profiler), or directories or globs of them."),
        sort: str = typer.Option("self_cpu", "--sort", help="self_cpu | total_cpu | self_device | device | calls"),
        group_by_shape: bool = typer.Option(False, "--group-by-shape", help="One row per operator and input shapes."),
        region: str | None = typer.Option(None, "--region", help="Only operators inside this region (and below): its path as summary prints it, or one component of it."),
        top: int = typer.Option(30, "--top", min=1, help="Rows to show (JSON and CSV: all)."),
        json_out: bool = typer.Option(False, "--json", help="Print the table as one JSON document."),
        csv_out: bool = typer.Option(False, "--csv", help="Print the table as CSV."),
        wide: bool = typer.Option(False, "--wide", help="Every column, whatever the terminal width."),
    ) -> None:
        """Per-operator table: calls, self and total CPU time, device time, FLOPs and bytes, shapes."""
        from rich.console import Console

        from cuvil_pgc.analyze.operators import operator_stats
        from cuvil_pgc.trace.discover import trace_files
        from cuvil_pgc.trace.reader import load_trace
        from cuvil_pgc.viewer.console_ops import operators_view
        from cuvil_pgc.viewer.progress import stage_progress

        files = trace_files(traces)          # a directory or a glob: its trace files, as analyze takes them
        with stage_progress(2) as progress:
            with progress.stage(f"loading {len(files)} trace(s)"):
                trace = load_trace(*files)
            with progress.stage("grouping operators"):
                rows = operator_stats(trace, sort=sort, group_by_shape=group_by_shape, region=region)
        # what the reader did not read as operators, as analyze says it (never dropped silently)
        print_warnings([f"{os.path.basename(s.path)}: {w}" for s in trace.sources for w in s.warnings])
        if not rows and not (json_out or csv_out):
            typer.echo(f"{', '.join(traces)}: no operators in the trace (record them with ops=True, or "
                       "torch.profiler's CPU activity)", err=True)
            return
        title = f"Operators{f' in {region}' if region else ''}, by {sort}"
        machine_readable = json_out or csv_out
        view = operators_view(rows, title=title, top=None if machine_readable else top,
                              group_by_shape=group_by_shape)
        emit(view, Console(), as_json=json_out, as_csv=csv_out, wide=wide, extra_json={"traces": list(traces)})
