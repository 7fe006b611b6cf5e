"""The ``recompile`` and ``compare`` commands (registered by :mod:`.commands`).

``recompile`` prints a rich progress bar on stderr during the search (interactive terminals
only) and the plan as a rich table with predicted vs measured speedups; with ``--json`` the
DESIGN.md document and nothing else on stdout. ``compare`` prints a rich table or the
``compare --json`` document.
"""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager
from typing import Any

import typer


def register_recompile(app: typer.Typer) -> None:
    @app.command("recompile")
    def recompile_command(
        traces: list[str] = typer.Argument(..., help="Trace files of the model (cuvil-pgc profile, torch.profiler)."),
        model: str = typer.Option(..., "--model", help="MODULE:FACTORY returning (model, example_inputs)."),
        output: str = typer.Option("build.cuvilpkg", "-o", "--output", help="Where to write the build."),
        budget: int | None = typer.Option(
            None, "--budget", min=1,
            help="Most candidates to measure, records of earlier searches of this model included."),
        exhaustive: bool = typer.Option(False, "--exhaustive", help="Measure every candidate (slow)."),
        rtol: float | None = typer.Option(None, "--rtol", help="Accuracy guard rtol (default per dtype)."),
        atol: float | None = typer.Option(None, "--atol", help="Accuracy guard atol (default per dtype)."),
        device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
        backends: str | None = typer.Option(None, "--backends",
                                            help="Comma-separated subset of eager,compile,aoti,cudagraphs,ort,openvino,tensorrt."),
        sign: str | None = typer.Option(None, "--sign", help="Ed25519 private key to sign the build."),
        name: str | None = typer.Option(None, "--name", help="Build name (default: the factory's name)."),
        version: int = typer.Option(1, "--version", min=1, help="Build version."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Search a faster plan for the model guided by its profile, and write a verified build."""
        from cuvil_pgc._modelspec import load_model_spec
        from cuvil_pgc.errors import ConfigError
        from cuvil_pgc.recompile.build import recompile

        if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
            raise ConfigError(f"--device {device!r} is not cpu or cuda")
        chosen = _backends(backends)
        net, inputs = load_model_spec(model)
        with _progress(enabled=not as_json and sys.stderr.isatty()) as progress:
            build = recompile(net, inputs, traces, budget=budget, exhaustive=exhaustive, rtol=rtol, atol=atol,
                              device=device, progress=progress, backends=chosen)
        build.save(output, name=name or _build_name(model), version=version, signing_key=sign)
        if as_json:
            from cuvil_pgc.cli import emit_json

            emit_json(build.to_json())
            return
        from rich.console import Console

        Console(soft_wrap=True).print(plan_table(build.plan, output))

    @app.command("compare")
    def compare_command(
        a: str = typer.Argument(..., help="A: a build, store://NAME[@TAG], eager or compile."),
        b: str = typer.Argument(..., help="B: a build, store://NAME[@TAG], eager or compile."),
        model: str = typer.Option(..., "--model", help="MODULE:FACTORY returning (model, example_inputs)."),
        store: str | None = typer.Option(None, "--store", help="Build store for store:// refs."),
        pubkey: str | None = typer.Option(None, "--pubkey", help="Require builds signed by this key."),
        rounds: int = typer.Option(30, "--rounds", min=5, help="Interleaved rounds."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Compare two ways of running the model: interleaved runs, medians, bootstrap CI, verdict."""
        from cuvil_pgc._modelspec import load_model_spec
        from cuvil_pgc.recompile.compare import compare, compare_table

        net, inputs = load_model_spec(model)
        result = compare(net, inputs, a, b, store=store, pubkey=pubkey, rounds=rounds)
        if as_json:
            from cuvil_pgc.cli import emit_json

            emit_json(result)
            return
        from rich.console import Console

        Console(soft_wrap=True).print(compare_table(result))


def _backends(value: str | None) -> tuple[str, ...] | None:
    from cuvil_pgc.errors import ConfigError
    from cuvil_pgc.recompile.candidates import BACKENDS

    if not value:
        return None
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    unknown = [n for n in names if n not in BACKENDS]
    if unknown:
        raise ConfigError(f"--backends: unknown {', '.join(unknown)}", fix=f"choose from {', '.join(BACKENDS)}")
    return names


def _build_name(spec: str) -> str:
    factory = spec.rpartition(":")[2]
    return re.sub(r"[^A-Za-z0-9._-]", "_", factory)[:64] or "model"


@contextmanager
def _progress(enabled: bool):
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("searching"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.description}"), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int, message: str) -> None:
            bar.update(task, completed=done, total=total, description=message)

        yield update


def plan_table(plan: dict[str, Any], path: str | None = None) -> Any:
    """The plan as a rich table: per region, chosen config, predicted vs measured speedups."""
    from rich.table import Table

    table = Table(title=f"recompile plan{f' → {path}' if path else ''}")
    for column in ("region", "bottleneck", "chosen", "eager ms", "predicted ms", "measured ms",
                   "pred. speedup", "meas. speedup", "tried / rejected"):
        table.add_column(column, justify="right" if "ms" in column or "speedup" in column else "left")
    for r in plan["regions"]:
        tried = [a for a in r["alternatives"] if a["status"] != "not_measured"]
        rejected = [a for a in tried if a["status"] not in ("ok",)]
        base, pred, meas = r["baseline_ms"], r["predicted_ms"], r["measured_ms"]
        table.add_row(r["path"], r["bottleneck"], r["chosen"], _f(base), _f(pred), _f(meas),
                      _x(base, pred), _x(base, meas), f"{len(tried)} / {len(rejected)}")
    stale = ", ".join(s["path"] for s in plan["stale"]) or "none"
    table.caption = (f"whole model: eager {_f(plan['baseline_ms'])} ms → {_f(plan['plan_ms'])} ms "
                     f"({plan['speedup_vs_eager']}x); measured {plan['measured_candidates']} of "
                     f"{plan['space_size']} candidates, {plan['reused_records']} from records; stale regions: {stale}")
    return table


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def _x(base: float | None, value: float | None) -> str:
    return "-" if not base or not value else f"{base / value:.2f}x"
