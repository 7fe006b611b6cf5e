"""``cuvil-pgc report TRACE... -o report.html``: load, analyse, render and write the HTML report.

``--build`` (a ``.cuvilpkg`` path or ``store://NAME[@VERSION|@TAG]``) adds that build's recompile
plan; the build is opened only through ``recompile.trust.open_trusted`` (signed by a trusted key,
or ``--allow-unsigned``, every member verified before anything is read). The report is written
atomically; a progress bar shows on interactive terminals only.
"""

from __future__ import annotations

import os

import typer

from cuvil_pgc.errors import ConfigError


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        traces: list[str] = typer.Argument(..., metavar="TRACE...", help="Trace files (ours or torch.profiler), or directories or globs of them."),
        output: str = typer.Option("report.html", "-o", "--output", help="The HTML file to write."),
        build: str | None = typer.Option(None, "--build", help="Show this build's recompile plan "
                                            "(a .cuvilpkg path, or store://NAME with an optional @VERSION or @TAG)."),
        store: str | None = typer.Option(None, "--store", help="Build store for store:// refs (default $CUVIL_STORE)."),
        pubkey: str | None = typer.Option(None, "--pubkey", help="Require the build to be signed by this key."),
        allow_unsigned: bool = typer.Option(False, "--allow-unsigned",
                                            help="Read a build no trusted key signed (logged)."),
        plotly_js: str = typer.Option("inline", "--plotly-js", help="inline (self-contained, offline) or cdn."),
        filter: str | None = typer.Option(None, "--filter", help="Only region paths matching this regex."),
        machine: str | None = typer.Option(None, "--machine", help="Machine model file (calibrate -o)."),
        title: str | None = typer.Option(None, "--title", help="Page title."),
    ) -> None:
        """Write a self-contained HTML report: hot regions, timelines, compile, roofline, plan."""
        from cuvil_pgc.viewer.template import PLOTLY_MODES

        if plotly_js not in PLOTLY_MODES:
            raise ConfigError(f"--plotly-js {plotly_js!r} is not one of {', '.join(PLOTLY_MODES)}")
        written = make_report(traces, output, build=build, store=store, pubkey=pubkey,
                              allow_unsigned=allow_unsigned or None, plotly_js=plotly_js,
                              filter=filter, machine=machine, title=title)
        size = os.path.getsize(written)
        print(f"wrote {written} ({size / 1e6:.1f} MB){'' if plotly_js == 'cdn' else ', plotly.js inlined'}")


def make_report(traces: list[str], output: str, *, build: str | None = None, store: str | None = None,
                pubkey: str | None = None, allow_unsigned: bool | None = None, plotly_js: str = "inline",
                filter: str | None = None,
                machine: str | None = None, title: str | None = None) -> str:
    """Load, analyse, render and write; returns the path written."""
    from cuvil_pgc.analyze.analyzer import analyze
    from cuvil_pgc.analyze.machine import MachineModel
    from cuvil_pgc.recompile.plan_doc import read_build_plan
    from cuvil_pgc.trace.discover import trace_files
    from cuvil_pgc.trace.reader import load_trace
    from cuvil_pgc.viewer.html import write_report
    from cuvil_pgc.viewer.progress import stage_progress

    model = MachineModel.load(machine) if machine else None
    with stage_progress(4 if build else 3) as progress:
        plan, facts = None, None
        if build:
            with progress.stage(f"verifying build {os.path.basename(build)}"):
                plan, facts = read_build_plan(build, store=store, pubkey=pubkey, allow_unsigned=allow_unsigned)
        files = trace_files(traces)          # a directory or a glob: its trace files, as analyze takes them
        with progress.stage(f"loading {len(files)} trace file{'s' if len(files) != 1 else ''}"):
            trace = load_trace(*files)
        with progress.stage(f"analysing {len(trace):,} events"):
            analysis = analyze(trace, machine=model, filter=filter)
        with progress.stage("rendering the report"):
            path = write_report(analysis, output, plan=plan, build=facts, plotly_js=plotly_js, title=title)
    return str(path)
