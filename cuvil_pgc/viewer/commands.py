"""Commands of the viewer stage: ``cuvil-pgc report TRACE... -o report.html``.

The command loads and analyses the traces (``load_trace`` + ``analyze``), optionally reads a
build's plan.json (``--build``: a ``.cuvilpkg`` path or ``store://NAME[@VERSION|@TAG]``, opened only
through ``recompile.trust.open_trusted``: signed by a trusted key, or ``--allow-unsigned``, and every
member verified before anything is read), renders the
report and writes it atomically. A progress bar shows on interactive terminals only.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:
    from cuvil_pgc.recompile.plan_doc import Plan

PLAN_MEMBER = "plan.json"


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        traces: list[str] = typer.Argument(..., metavar="TRACE...", help="Trace files (ours or torch.profiler)."),
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
        from cuvil_pgc.errors import ConfigError
        from cuvil_pgc.viewer._template import PLOTLY_MODES

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
    from cuvil_pgc.trace.reader import load_trace
    from cuvil_pgc.viewer.html import write_report
    from cuvil_pgc.viewer.progress import stage_progress

    model = MachineModel.load(machine) if machine else None
    with stage_progress(4 if build else 3) as progress:
        plan, facts = None, None
        if build:
            with progress.stage(f"verifying build {os.path.basename(build)}"):
                plan, facts = read_build_plan(build, store=store, pubkey=pubkey, allow_unsigned=allow_unsigned)
        with progress.stage(f"loading {len(traces)} trace file{'s' if len(traces) != 1 else ''}"):
            trace = load_trace(*traces)
        with progress.stage(f"analysing {len(trace):,} events"):
            analysis = analyze(trace, machine=model, filter=filter)
        with progress.stage("rendering the report"):
            path = write_report(analysis, output, plan=plan, build=facts, plotly_js=plotly_js, title=title)
    return str(path)


def read_build_plan(source: str, *, store: str | None = None, pubkey: str | None = None,
                    allow_unsigned: bool | None = None) -> tuple[Plan, dict[str, Any]]:
    """The plan of a verified build and facts about the build (path, name, version, signature)."""
    from cuvil_pgc.errors import BuildError
    from cuvil_pgc.recompile._json_bounds import check_json_bounds
    from cuvil_pgc.recompile.plan_doc import Plan, PlanFormatError
    from cuvil_pgc.recompile.trust import open_trusted

    with open_trusted(source, store=store, pubkey=pubkey, allow_unsigned=allow_unsigned) as vb:
        if PLAN_MEMBER not in vb.members():
            raise BuildError(f"the build has no {PLAN_MEMBER}", path=vb.path,
                             fix="pass a build written by `cuvil-pgc recompile`")
        try:
            data = vb.read_bytes(PLAN_MEMBER)
            check_json_bounds(data, what=PLAN_MEMBER, path=vb.path)    # no RecursionError from deep JSON
            plan = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BuildError(f"{PLAN_MEMBER} is not JSON ({exc})", path=vb.path,
                             fix="rebuild the package with `cuvil-pgc recompile`") from None
        try:
            plan = Plan.from_json(plan)
        except PlanFormatError as exc:
            raise BuildError(f"{PLAN_MEMBER} is not a plan this cuvil-pgc reads ({exc})", path=vb.path,
                             fix="upgrade cuvil-pgc or rebuild the package with `cuvil-pgc recompile`") from None
        m = vb.manifest
        facts = {"path": vb.path, "name": m.name, "version": m.version, "created": m.created.isoformat(),
                 "signed": vb.signed, "signature_verified": vb.signature_verified}
    return plan, facts
