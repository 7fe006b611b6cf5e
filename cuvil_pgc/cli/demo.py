"""``cuvil-pgc demo``: the whole loop on the bundled zoo, offline, on the CPU.

For each model: profile with every submodule instrumented and operators captured -> analyze (the
hot-region table) -> recompile guided by that profile (progress bar) -> sign and save the build ->
HTML report with the plan -> compare eager, torch.compile (default) and the build, interleaved.
It ends with where every artifact is. ``--quick`` runs one model with a small search budget.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import typer

from cuvil_pgc._threads import THREADS_HELP, default_threads
from cuvil_pgc.cli.output import busy_warnings, emit_json

QUICK_MODELS = ("lstm_step",)
FULL_MODELS = ("lstm_step", "mlp", "cnn", "transformer", "mixed")
PROFILE_ITERS = 20
QUICK_BUDGET, FULL_BUDGET = 3, 6


@dataclass
class ModelResult:
    name: str
    trace: str
    report: str
    build: str
    timings_ms: dict[str, float] = field(default_factory=dict)
    speedup_vs_eager: float = 0.0
    speedup_vs_compile: float = 0.0
    warnings: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "trace": self.trace, "report": self.report, "build": self.build,
                "timings_ms": self.timings_ms, "speedup_vs_eager": self.speedup_vs_eager,
                "speedup_vs_compile": self.speedup_vs_compile, "warnings": self.warnings}


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        output: str = typer.Option("cuvil-demo", "-o", "--output", help="Directory for every artifact."),
        quick: bool = typer.Option(False, "--quick", help="One model, small search budget (~3 min)."),
        threads: int | None = typer.Option(None, "--threads", min=1, help=THREADS_HELP),
        quiet: bool = typer.Option(False, "-q", "--quiet", help="No progress display."),
        verbose: bool = typer.Option(False, "-v", "--verbose",
                                     help="Stream the candidate builds' own output (default: a .build.log per model)."),
        as_json: bool = typer.Option(False, "--json",
                                     help="Print one JSON document (speedups, artifact paths); the rest goes to stderr."),
    ) -> None:
        """Run the whole loop on the bundled zoo: profile, analyze, report, recompile, compare."""
        from cuvil_pgc.cli._terminate import terminated_as_exit

        started = time.perf_counter()
        with terminated_as_exit():     # its recompiles leave what they were building unfinished, as recompile's do
            results = run_demo(output, quick=quick, threads=threads, quiet=quiet, verbose=verbose, as_json=as_json)
        if as_json:
            emit_json(demo_json(output, results, time.perf_counter() - started))


def run_demo(out_dir: str, *, quick: bool = False, models: tuple[str, ...] | None = None,
             threads: int | None = None, quiet: bool = False, verbose: bool = False,
             as_json: bool = False) -> list[ModelResult]:
    """Run the demo into ``out_dir`` at ``threads`` torch threads (default: torch's); what each model
    produced. ``as_json``: what it prints goes to stderr (stdout is left for the caller's JSON)."""
    from cuvil_pgc._threads import torch_threads

    default = default_threads()
    with torch_threads(threads) as count:
        return _run_demo(out_dir, quick=quick, models=models, threads=count, default=count == default,
                         quiet=quiet, verbose=verbose, to_stderr=as_json)


def demo_json(out_dir: str, results: list[ModelResult], seconds: float) -> dict[str, Any]:
    """``demo --json``: per model its speedups, median timings, artifact paths and warnings."""
    key = os.path.join(out_dir, "demo-signing.key")
    return {"output": out_dir, "seconds": round(seconds, 3), "signing_key": key, "public_key": key + ".pub",
            "models": [r.to_json() for r in results]}


def _run_demo(out_dir: str, *, quick: bool, models: tuple[str, ...] | None, threads: int,
              default: bool, quiet: bool, verbose: bool, to_stderr: bool = False) -> list[ModelResult]:
    from rich.console import Console

    from cuvil_pgc.recompile.signing import generate_keypair
    from cuvil_pgc.viewer.console_demo import print_summary

    console = Console(stderr=to_stderr)
    os.makedirs(out_dir, exist_ok=True)
    key = os.path.join(out_dir, "demo-signing.key")
    if not os.path.exists(key):
        generate_keypair(key)
    started = time.perf_counter()
    console.print(f"profiling, recompiling and timing at {threads} torch thread(s)"
                  f"{' (torch default here)' if default else ''}; --threads N to change it")
    results = []
    names = models or (QUICK_MODELS if quick else FULL_MODELS)
    for i, name in enumerate(names, 1):
        console.rule(f"[bold]{name}[/] (model {i} of {len(names)}, {time.perf_counter() - started:.0f} s so far)")
        results.append(_one_model(console, name, out_dir, key, QUICK_BUDGET if quick else FULL_BUDGET,
                                  quiet, verbose))
    print_summary(console, results, key, time.perf_counter() - started)
    return results


def _one_model(console: Any, name: str, out_dir: str, key: str, budget: int, quiet: bool = False,
               verbose: bool = False) -> ModelResult:
    from rich.text import Text

    from cuvil_pgc._quiet import log_path_for, third_party_output
    from cuvil_pgc.analyze import analyze
    from cuvil_pgc.trace import load_trace
    from cuvil_pgc.viewer.console import render_hot_regions
    from cuvil_pgc.viewer.console_demo import print_compare, step
    from cuvil_pgc.zoo import get as zoo_model

    model, inputs = zoo_model(name)()
    trace = os.path.join(out_dir, f"{name}.trace.json")
    with step(console, f"profiling {name} ({PROFILE_ITERS} iterations, regions + operators)"):
        _profile(model, inputs, trace)
    with step(console, "analyzing"):
        analysis = analyze(load_trace(trace))
    render_hot_regions(analysis, console, top=8)
    build_path = os.path.join(out_dir, f"{name}.cuvilpkg")
    log = log_path_for(build_path)
    with step(console, f"recompiling (budget {budget} measured candidates)"):
        with third_party_output(log, verbose=verbose) as captured:
            build = _recompile(model, inputs, trace, analysis, budget, quiet, captured.terminal)
            build.save(build_path, name=name, version=1, signing_key=key)
    report = os.path.join(out_dir, f"{name}.report.html")
    with step(console, "writing the HTML report"):
        _report(analysis, build, report, key)
    with step(console, "comparing eager, torch.compile and the build (interleaved)"):
        with third_party_output(log, verbose=verbose) as captured:
            timings = _compare(model, inputs, build_path, key)
    if captured.summary():
        console.print(Text(captured.summary(), style="dim"))
    result = ModelResult(name, trace, report, build_path, timings,
                         speedup_vs_eager=timings["eager"] / timings["build"],
                         speedup_vs_compile=timings["torch.compile"] / timings["build"])
    print_compare(console, result.name, result.timings_ms)
    for busy in busy_warnings("speedups"):
        result.warnings.append(busy)
        console.print(Text(f"warning: {busy}", style="yellow"))
    return result


def _profile(model: Any, inputs: tuple[Any, ...], trace: str) -> None:
    import torch

    from cuvil_pgc.instrument.factory import profile
    from cuvil_pgc.instrument.module import instrument_module

    with torch.inference_mode():
        for _ in range(3):
            model(*inputs)
        with instrument_module(model):
            with profile(trace, ops=True, gpu="off", compile=False):
                for _ in range(PROFILE_ITERS):
                    model(*inputs)


def _recompile(model: Any, inputs: tuple[Any, ...], trace: str, analysis: Any, budget: int,
               quiet: bool = False, terminal: Any = None) -> Any:
    from rich.console import Console

    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.viewer.progress import search_progress

    with search_progress(quiet=quiet, console=Console(file=terminal, stderr=terminal is None)) as progress:
        return recompile(model, inputs, [trace], analysis=analysis, budget=budget, progress=progress)


def _report(analysis: Any, build: Any, path: str, key: str) -> None:
    from cuvil_pgc.recompile.plan_doc import read_build_plan
    from cuvil_pgc.viewer.html import write_report

    _plan, facts = read_build_plan(build.path, pubkey=key + ".pub")   # the saved build, verified
    write_report(analysis, path, plan=build.plan, title=f"cuvil-pgc demo: {os.path.basename(path)}", build=facts)


def _compare(model: Any, inputs: tuple[Any, ...], build_path: str, key: str) -> dict[str, float]:
    import torch

    from cuvil_pgc.recompile.load import load_build
    from cuvil_pgc.recompile.measure import time_interleaved

    fast = load_build(build_path, model, pubkey=key + ".pub", require_signature=True, example_inputs=inputs)
    compiled = torch.compile(model)
    runs = {"eager": model, "torch.compile": compiled, "build": fast}
    with torch.inference_mode():
        samples = time_interleaved({k: (lambda f=f: f(*inputs)) for k, f in runs.items()}, rounds=15, warmup=3)
    return {k: s.median_ms for k, s in samples.items()}
