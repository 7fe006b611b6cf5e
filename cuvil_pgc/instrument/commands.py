"""`cuvil-pgc profile` and `cuvil-pgc summary` (and `doctor`, registered beside them)."""

from __future__ import annotations

import os

import typer

from cuvil_pgc.errors import ConfigError


def register(app: typer.Typer) -> None:
    _register_profile(app)
    _register_summary(app)
    _register_capture(app)
    _register_doctor(app)


def _register_profile(app: typer.Typer) -> None:
    @app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
    def profile(
        target: list[str] | None = typer.Argument(None, metavar="SCRIPT [ARGS]...",
                                                     help="Python script to run, then its arguments."),
        output: str | None = typer.Option(None, "-o", "--output", help="Trace file (.trace.json[.gz])."),
        module: str | None = typer.Option(None, "-m", help="Run a module like python -m."),
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
    ) -> None:
        """Run a script, a module or a model under a profiling session and write a trace."""
        from cuvil_pgc.instrument import _runner
        from cuvil_pgc.instrument.session import profile as make_session

        chosen = [x for x in (target, module, model) if x]
        if len(chosen) != 1:
            raise ConfigError("give exactly one of SCRIPT, -m MODULE or --model MODULE:FACTORY",
                              fix="e.g. cuvil-pgc profile --model cuvil_pgc.zoo:cnn")
        path = output or _default_output(target, module, model)
        session = make_session(path, ops=ops, gpu=gpu, sample_hz=sample_hz, filter=filter)
        if threads is not None and not model:
            raise ConfigError("--threads applies to --model only", fix="a script sets its own torch threads")
        if model:
            from cuvil_pgc._threads import torch_threads

            with torch_threads(threads) as count:
                typer.echo(f"profiling at {count} torch thread(s)", err=True)
                code = _runner.run_model(session, model, iters, warmup, depth)
        elif module:
            code = _runner.run_module(session, module, list(target or []))
        else:
            code = _runner.run_script(session, target[0], target[1:])
        typer.echo(f"trace written to {path}", err=True)
        if code:
            raise typer.Exit(code)


def _default_output(target: list[str] | None, module: str | None, model: str | None) -> str:
    if model:
        stem = model.rpartition(":")[2]
    elif module:
        stem = module.rpartition(".")[2]
    else:
        stem = os.path.splitext(os.path.basename(target[0]))[0]
    return f"{stem}.trace.json"


def _register_summary(app: typer.Typer) -> None:
    @app.command()
    def summary(
        trace: list[str] = typer.Argument(..., help="Trace file(s): ours or torch.profiler's."),
        top: int = typer.Option(15, "--top", help="How many regions to show."),
    ) -> None:
        """Print the top regions of a trace as a table."""
        from rich.console import Console

        from cuvil_pgc.analyze import analyze
        from cuvil_pgc.trace import load_trace
        from cuvil_pgc.viewer.console import render_hot_regions
        from cuvil_pgc.viewer.progress import stage_progress

        with stage_progress(2) as progress:          # a bar on interactive terminals only (stderr)
            with progress.stage(f"loading {len(trace)} trace(s)"):
                loaded = load_trace(*trace)
            with progress.stage("analysing"):
                analysis = analyze(loaded)
        console = Console()
        facts = analysis.trace
        console.print(f"[bold]{', '.join(trace)}[/]: {facts.get('events', 0)} events, "
                      f"{facts.get('duration_us', 0.0) / 1000:.1f} ms")
        render_hot_regions(analysis, console, top=top)


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
        from rich.table import Table

        table = Table(title="cuvil-pgc doctor", show_lines=False)
        for column in ("Backend", "Status", "Found / why not", "What to do"):
            table.add_column(column, overflow="fold")
        for c in checks:
            status = "[green]ok[/green]" if c.ok else "[yellow]unavailable[/yellow]"
            table.add_row(c.name, status, c.detail if c.ok else (c.reason or ""), "" if c.ok else (c.fix or ""))
        Console().print(table)
