"""``cuvil-pgc recompile`` (search a faster plan guided by the profile, write a verified build) and
``compare`` (two ways of running the model, interleaved).

``recompile`` shows its progress on stderr (stage, candidate i of N, elapsed and estimated time,
the incumbent's speedup; interactive terminals only, off with ``--quiet``) and the plan as a table
with predicted vs measured speedups; with ``--json`` the DESIGN.md document and nothing else on
stdout. ``compare`` prints a table, CSV or the ``compare --json`` document.
"""

from __future__ import annotations

import re
from typing import Any

import typer

from cuvil_pgc._threads import THREADS_HELP, default_threads
from cuvil_pgc.cli.output import busy_warnings, emit_json, print_warnings


def register(app: typer.Typer) -> None:
    @app.command("recompile")
    def recompile_command(
        traces: list[str] = typer.Argument(..., help="Trace files of the model (cuvil-pgc profile, torch.profiler)."),
        model: str = typer.Option(..., "--model", help="MODULE:FACTORY returning (model, example_inputs)."),
        output: str = typer.Option("build.cuvilpkg", "-o", "--output", help="Where to write the build."),
        budget: int | None = typer.Option(
            None, "--budget", min=1,
            help="Most candidates to measure, records of earlier searches of this model included."),
        time_budget: str | None = typer.Option(
            None, "--time-budget", metavar="DURATION",
            help="Begin no candidate's build after this long (90s, 20m, 1h; the one being built is finished), "
                 "then build the best plan measured."),
        exhaustive: bool = typer.Option(False, "--exhaustive", help="Measure every candidate (slow)."),
        rtol: float | None = typer.Option(None, "--rtol", help="Accuracy guard rtol (default per dtype)."),
        atol: float | None = typer.Option(None, "--atol", help="Accuracy guard atol (default per dtype)."),
        device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
        backends: str | None = typer.Option(None, "--backends",
                                            help="Comma-separated subset of eager,compile,aoti,cudagraphs,ort,openvino,tensorrt."),
        sign: str | None = typer.Option(None, "--sign",
                                        help="Ed25519 private key to sign the build (default: $CUVIL_SIGNING_KEY)."),
        threads: int | None = typer.Option(None, "--threads", min=1, help=THREADS_HELP),
        deployed_race: bool = typer.Option(
            True, "--deployed-race/--no-deployed-race",
            help="Decide between whole-model plans that run without the model's code (ONNX Runtime, OpenVINO, "
                 "AOTInductor) again, each in worker processes of their own, as deployed."),
        dynamic: bool = typer.Option(
            False, "--dynamic",
            help="Also ship each ONNX Runtime, OpenVINO and AOTInductor region exported for other input sizes (batch, sequence "
                 "length), checked at other sizes; without it calls at other sizes run the original module."),
        name: str | None = typer.Option(None, "--name", help="Build name (default: the factory's name)."),
        version: int = typer.Option(1, "--version", min=1, help="Build version."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
        wide: bool = typer.Option(False, "--wide", help="Every column, whatever the terminal width."),
        quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress display."),
        verbose: bool = typer.Option(False, "-v", "--verbose",
                                     help="Stream the candidate builds' own output (default: into BUILD's .build.log)."),
    ) -> None:
        """Search a faster plan for the model guided by its profile, and write a verified build."""
        from cuvil_pgc._modelspec import load_model_spec
        from cuvil_pgc._threads import resolve_threads
        from cuvil_pgc.errors import ConfigError
        from cuvil_pgc.recompile.build import recompile
        from cuvil_pgc.recompile.trust import UNSIGNED_NOTE, configured_signing_key

        if device not in ("cpu", "cuda") and not device.startswith("cuda:"):
            raise ConfigError(f"--device {device!r} is not cpu or cuda")
        chosen = _backends(backends)
        seconds = _duration(time_budget, "--time-budget") if time_budget is not None else None
        threads = resolve_threads(threads)
        key = configured_signing_key(sign)
        if key is not None:     # an unusable key fails now, not after the search
            from cuvil_pgc.recompile.signing import load_private_key

            load_private_key(key)
        net, inputs = load_model_spec(model)
        is_default = threads == default_threads()
        from rich.console import Console

        from cuvil_pgc._quiet import log_path_for, third_party_output
        from cuvil_pgc.cli._terminate import terminated_as_exit
        from cuvil_pgc.viewer.progress import search_progress

        # the load before the search: other processes'. After it, the load average holds the
        # search's own (its compile workers, the race's worker processes: 5.0 on 2 idle cores)
        busy = busy_warnings("measured speedups")
        captured = None
        try:
            with terminated_as_exit(), third_party_output(log_path_for(output), verbose=verbose) as captured:
                with search_progress(quiet=quiet or as_json, console=Console(file=captured.terminal)) as progress:
                    build = recompile(net, inputs, traces, budget=budget, exhaustive=exhaustive, rtol=rtol,
                                      atol=atol, device=device, progress=progress, backends=chosen,
                                      threads=threads, deployed_race=deployed_race, dynamic=dynamic,
                                      model_ref=model, time_budget=seconds)
                build.save(output, name=name or _build_name(model), version=version, signing_key=key)
        except BaseException:
            _log_note(captured)
            raise
        from cuvil_pgc.viewer.notes import print_note

        if key is None:
            print_note(f"note: {UNSIGNED_NOTE}", err=True)
        if as_json:
            emit_json({**build.to_json(), "warnings": busy})
            _log_note(captured)
            return
        from cuvil_pgc.viewer.console_recompile import plan_view
        from cuvil_pgc.viewer.tables import print_view

        print_view(plan_view(build.plan, output), Console(), wide)
        print_note(
            f"measured at {threads} torch thread(s){' (torch default here)' if is_default else ''}, "
            "recorded in the build: load_build warns in a process that runs another count "
            "(--threads N: the deployment's)")
        if chosen is None:
            _missing_runtimes_note(device)
        _log_note(captured)
        print_warnings(busy)

    @app.command("compare")
    def compare_command(
        a: str = typer.Argument(..., help="A: a build, store://NAME[@TAG], eager or compile."),
        b: str = typer.Argument(..., help="B: a build, store://NAME[@TAG], eager or compile."),
        model: str = typer.Option(..., "--model", help="MODULE:FACTORY returning (model, example_inputs)."),
        store: str | None = typer.Option(None, "--store", help="Build store for store:// refs."),
        pubkey: str | None = typer.Option(None, "--pubkey",
                                          help="Trust builds signed by this key (default: $CUVIL_TRUSTED_KEY)."),
        allow_unsigned: bool = typer.Option(False, "--allow-unsigned",
                                            help="Load builds no trusted key signed (logged)."),
        threads: int | None = typer.Option(None, "--threads", min=1, help=THREADS_HELP),
        rounds: int = typer.Option(30, "--rounds", min=5, help="Interleaved rounds."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
        csv_out: bool = typer.Option(False, "--csv", help="Print the table as CSV."),
    ) -> None:
        """Compare two ways of running the model: interleaved runs, medians, bootstrap CI, verdict."""
        from cuvil_pgc._modelspec import load_model_spec
        from cuvil_pgc._threads import torch_threads
        from cuvil_pgc.analyze.contention import spread_warning
        from cuvil_pgc.recompile.compare import compare

        net, inputs = load_model_spec(model)
        with torch_threads(threads):
            result = compare(net, inputs, a, b, store=store, pubkey=pubkey, allow_unsigned=allow_unsigned or None,
                             rounds=rounds)
        result["warnings"] = busy_warnings("timings") + [
            w for side in ("a", "b") if (w := spread_warning(result[side]["name"], result[side]["median_ms"],
                                                             result[side]["ci95_ms"]))]
        if as_json:
            emit_json(result)
            return
        if csv_out:
            from cuvil_pgc.viewer.console_recompile import compare_view
            from cuvil_pgc.viewer.tables import write_csv

            write_csv(compare_view(result))
            print_warnings(result["warnings"])
            return
        from rich.console import Console

        from cuvil_pgc.viewer.console_recompile import compare_table

        Console().print(compare_table(result))
        print_warnings(result["warnings"])


def _missing_runtimes_note(device: str) -> None:
    """Which runtimes the search left out because they cannot run here, and the fix for each: a
    base install searched torch's backends alone and said nothing of it."""
    from cuvil_pgc.recompile.runtimes import RUNTIMES, unusable
    from cuvil_pgc.viewer.notes import print_note

    missing = unusable(device)
    if missing:
        print_note("note: not in the search, as they cannot run here: " + "; ".join(
            f"{RUNTIMES[s.backend].title} ({s.reason}: {s.fix})" for s in missing))


def _log_note(captured: Any) -> None:
    """Where the candidate builds' own output went (stderr; nothing when there was none)."""
    from cuvil_pgc.viewer.notes import print_note

    note = captured.summary() if captured is not None else None
    if note:
        print_note(note, err=True)


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


def _duration(value: str, option: str) -> float:
    """Seconds of ``90``, ``90s``, ``20m``, ``1.5h``."""
    from cuvil_pgc._cache import duration_seconds
    from cuvil_pgc.errors import ConfigError

    seconds = duration_seconds(value, "smh", bare=True) or 0.0
    if seconds <= 0:
        raise ConfigError(f"{option} {value!r} is not a positive duration", fix="give seconds or 90s, 20m, 1h")
    return seconds


def _build_name(spec: str) -> str:
    factory = spec.rpartition(":")[2]
    return re.sub(r"[^A-Za-z0-9._-]", "_", factory)[:64] or "model"
