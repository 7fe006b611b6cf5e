"""`cuvil-pgc profile` and `cuvil-pgc summary` (and `doctor`, registered beside them)."""

from __future__ import annotations

import os

import typer
from rich.text import Text

from cuvil_pgc.errors import ConfigError


def register(app: typer.Typer) -> None:
    _register_profile(app)
    _register_summary(app)
    _register_capture(app)
    _register_doctor(app)


def _register_profile(app: typer.Typer) -> None:
    from cuvil_pgc.instrument._script_args import ScriptCommand

    @app.command(cls=ScriptCommand)
    def profile(
        ctx: typer.Context,
        target: str | None = typer.Argument(None, metavar="SCRIPT [ARGS]...",
                                            help="Python script to run; everything after it is its own arguments."),
        output: str | None = typer.Option(None, "-o", "--output", help="Trace file (.trace.json[.gz])."),
        module: str | None = typer.Option(None, "-m", help="Run a module like python -m; what follows is its arguments."),
        model: str | None = typer.Option(None, "--model", help="MODULE:FACTORY returning (model, inputs)."),
        iters: int = typer.Option(20, "--iters", help="Model iterations to record (--model)."),
        warmup: int = typer.Option(3, "--warmup", help="Unrecorded warm-up iterations (--model)."),
        threads: int | None = typer.Option(None, "--threads", min=1,
                                           help="torch intra-op threads for --model (default: torch's here)."),
        depth: int | None = typer.Option(None, "--depth", help="Instrument submodules down to this depth."),
        ops: bool = typer.Option(True, "--ops/--no-ops", help="Capture aten operators."),
        gpu: str = typer.Option("auto", "--gpu", help="auto | on | off: CUPTI kernels and NVML counters."),
        sample_hz: float = typer.Option(20.0, "--sample-hz", help="Utilization sampling rate (0: off)."),
        filter: str | None = typer.Option(None, "--filter",
                                             help="Record only regions / ops / kernels matching this regex."),
        record_shapes: bool = typer.Option(True, "--record-shapes/--no-record-shapes",
                                           help="Operator input shapes (FLOP and byte estimates need them)."),
        with_stack: bool = typer.Option(False, "--with-stack", help="Also record Python functions (torch.profiler)."),
        profile_memory: bool = typer.Option(False, "--profile-memory",
                                            help="Record allocations as the memory_allocated counter."),
        quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress display (--model)."),
    ) -> None:
        """Run a script, a module or a model under a profiling session and write a trace.

        Options come before SCRIPT or -m MODULE, as with python: everything after them belongs to the program (cuvil-pgc profile app.py -o x gives -o x to app.py).
        """
        from cuvil_pgc.instrument import _runner
        from cuvil_pgc.instrument._script_args import script_args
        from cuvil_pgc.instrument.factory import profile as make_session

        chosen = [x for x in (target, module, model) if x]
        argv = script_args(ctx)
        if len(chosen) != 1 or (model and argv):
            raise ConfigError("give exactly one of SCRIPT, -m MODULE or --model MODULE:FACTORY",
                              fix="put cuvil-pgc's options before the script, e.g. "
                                  "cuvil-pgc profile -o run.trace.json app.py --its-flag")
        path = output or _default_output(target, module, model)
        session = make_session(path, ops=ops, gpu=gpu, sample_hz=sample_hz, filter=filter,
                               record_shapes=record_shapes, with_stack=with_stack, profile_memory=profile_memory)
        if threads is not None and not model:
            raise ConfigError("--threads applies to --model only", fix="a script sets its own torch threads")
        if model:
            from cuvil_pgc._threads import torch_threads
            from cuvil_pgc.viewer.progress import search_progress

            with torch_threads(threads) as count:
                typer.echo(f"profiling at {count} torch thread(s)", err=True)
                with search_progress(quiet=quiet) as progress:
                    code = _runner.run_model(session, model, iters, warmup, depth, progress)
        elif module:
            code = _runner.run_module(session, module, argv)
        else:
            code = _runner.run_script(session, target, argv)
        if getattr(session, "unavailable", None):
            typer.echo(f"no trace written: {session.unavailable}", err=True)
        else:
            typer.echo(f"trace written to {getattr(session, 'path', path)}", err=True)
        _warn_if_busy("timings in the trace")
        if code:
            raise typer.Exit(code)


def _warn_if_busy(what: str) -> None:
    """The busy-machine warning on stderr (analyze.contention), if the run queue says so."""
    from cuvil_pgc.analyze.contention import host_load, load_warning

    warning = load_warning(host_load(), what)
    if warning:
        typer.echo(f"warning: {warning}", err=True)


def _default_output(target: str | None, module: str | None, model: str | None) -> str:
    if model:
        stem = model.rpartition(":")[2]
    elif module:
        stem = module.rpartition(".")[2]
    else:
        stem = os.path.splitext(os.path.basename(target))[0]
    return f"{stem}.trace.json"


def _register_summary(app: typer.Typer) -> None:
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

        from cuvil_pgc.analyze import analyze
        from cuvil_pgc.trace import load_trace
        from cuvil_pgc.viewer.console import hot_region_rows, hot_regions_view, render_hot_regions
        from cuvil_pgc.viewer.progress import stage_progress
        from cuvil_pgc.viewer.tables import emit

        with stage_progress(2) as progress:          # a bar on interactive terminals only (stderr)
            with progress.stage(f"loading {len(trace)} trace(s)"):
                loaded = load_trace(*trace)
            with progress.stage("analysing"):
                analysis = analyze(loaded)
        facts = analysis.trace
        head = {"traces": list(trace), "events": facts.get("events", 0),
                "duration_us": facts.get("duration_us", 0.0)}
        if json_out or csv_out:
            view = hot_regions_view(analysis, top)
            view.rows = hot_region_rows(view)
            emit(view, None, as_json=json_out, as_csv=csv_out, extra_json=head)
            return
        console = Console()
        console.print(Text(f"{', '.join(trace)}: {head['events']} events, {head['duration_us'] / 1000:.1f} ms",
                           style="bold"))
        if _regionless(analysis):
            _print_top_operators(loaded, console, top, wide)
            return
        render_hot_regions(analysis, console, top=top, wide=wide)


def _regionless(analysis) -> bool:
    """A trace whose only "region" is the time outside every region (a script without regions)."""
    from cuvil_pgc.analyze._prepare import OUTSIDE

    return all(r.path == OUTSIDE for r in analysis.regions)


def _print_top_operators(trace, console, top: int, wide: bool) -> None:
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


def _register_capture(app: typer.Typer) -> None:
    @app.command()
    def capture(
        pid: str = typer.Option(..., "--pid", metavar="PID", help="Process running with CUVIL_PGC_ON_DEMAND=1."),
        seconds: float = typer.Option(10.0, "--seconds", help="Length of the capture window."),
        steps: int | None = typer.Option(None, "--steps", help="Capture this many step() calls instead."),
        directory: str | None = typer.Option(None, "--dir", help="Control directory (CUVIL_PGC_CONTROL_DIR)."),
        timeout: float = typer.Option(60.0, "--timeout", help="Seconds to wait beyond the window."),
    ) -> None:
        """Ask a running process for a detailed capture window and print its trace path."""
        from cuvil_pgc.instrument.capture import request_capture

        if not (pid.isascii() and pid.isdigit() and int(pid) > 0):
            _usage_error(f"--pid must be a process id (a positive integer), got {pid!r}",
                         "cuvil-pgc capture --pid PID [--seconds S | --steps N]")
        typer.echo(request_capture(int(pid), seconds=seconds, steps=steps, directory=directory, timeout=timeout))


def _usage_error(message: str, usage: str) -> None:
    """One line on stderr and exit 2, as for the parser's own usage errors."""
    typer.echo(f"cuvil-pgc: error: {message} (usage: {usage})", err=True)
    raise typer.Exit(2)


def _register_doctor(app: typer.Typer) -> None:
    @app.command()
    def doctor(
        json_out: bool = typer.Option(False, "--json", help="Print the checks as one JSON document."),
    ) -> None:
        """Show which profiling backends work here and, for each that does not, why and what to do."""
        from cuvil_pgc.instrument.doctor import run_checks

        checks = run_checks()
        if json_out:
            from cuvil_pgc.cli import emit_json

            emit_json({"ok": all(c.ok for c in checks), "checks": [c.to_dict() for c in checks]})
            return
        from rich.console import Console
        from rich.markup import escape
        from rich.table import Table

        table = Table(title="cuvil-pgc doctor", show_lines=False)
        for column in ("Backend", "Status", "Found / why not", "What to do"):
            table.add_column(column, overflow="fold")
        for c in checks:
            status = "[green]ok[/green]" if c.ok else "[yellow]unavailable[/yellow]"
            # escaped: a fix like pip install 'cuvil-pgc[ort]' is not rich markup
            table.add_row(escape(c.name), status, escape(c.detail if c.ok else (c.reason or "")),
                          escape("" if c.ok else (c.fix or "")))
        Console().print(table)
