"""``cuvil-pgc profile`` (run a script, a module or a model under a session) and ``capture`` (ask
a running process for a capture window): the commands that record traces."""

from __future__ import annotations

import os

import typer

from cuvil_pgc.cli._script_args import ScriptCommand, script_args
from cuvil_pgc.cli.output import busy_warnings, print_warnings, usage_error
from cuvil_pgc.errors import ConfigError


def register_profile(app: typer.Typer) -> None:
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
        from cuvil_pgc.instrument import runner
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
                    code = runner.run_model(session, model, iters, warmup, depth, progress)
        elif module:
            code = runner.run_module(session, module, argv)
        else:
            code = runner.run_script(session, target, argv)
        if getattr(session, "unavailable", None):
            typer.echo(f"no trace written: {session.unavailable}", err=True)
        else:
            typer.echo(f"trace written to {getattr(session, 'path', path)}", err=True)
        print_warnings(busy_warnings("timings in the trace"))
        if code:
            raise typer.Exit(code)


def _default_output(target: str | None, module: str | None, model: str | None) -> str:
    if model:
        stem = model.rpartition(":")[2]
    elif module:
        stem = module.rpartition(".")[2]
    else:
        stem = os.path.splitext(os.path.basename(target))[0]
    return f"{stem}.trace.json"


def register_capture(app: typer.Typer) -> None:
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
            usage_error(f"--pid must be a process id (a positive integer), got {pid!r}",
                        "cuvil-pgc capture --pid PID [--seconds S | --steps N]")
        typer.echo(request_capture(int(pid), seconds=seconds, steps=steps, directory=directory, timeout=timeout))
