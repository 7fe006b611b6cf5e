"""Run a user's program under a session: a script, a module (``-m``) or a model factory.

Used by ``cuvil-pgc profile`` (:mod:`cuvil_pgc.cli.profile`). The user's program runs as ``__main__`` with its own argv, like
``python -m cProfile``; its exit code is passed through. The trace is finished whether the
program returns, exits or raises. A ``cuvil_pgc.profile()`` the program calls itself joins the
session (:mod:`._joined`).
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from typing import Any

from cuvil_pgc.errors import ConfigError
from cuvil_pgc.instrument.session import Session


def run_script(session: Session, script: str, args: list[str]) -> int:
    """Run ``script`` with ``args`` as ``__main__`` under ``session``; returns its exit code."""
    if not os.path.isfile(script):
        raise ConfigError(f"script {script} does not exist", path=script,
                          fix="pass a Python file, -m MODULE or --model MODULE:FACTORY")
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    return _run(session, [script, *args], lambda: runpy.run_path(script, run_name="__main__"))


def run_module(session: Session, module: str, args: list[str]) -> int:
    """Run ``python -m module args`` under ``session``; returns its exit code."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise ConfigError(f"no module named {module!r}", fix="check the name and that it is importable")
    sys.path.insert(0, os.getcwd())
    return _run(session, [module, *args], lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))


def run_model(session: Session, spec: str, iters: int, warmup: int, depth: int | None,
              progress: Any = None) -> int:
    """Profile ``model(*inputs)`` ``iters`` times with every submodule instrumented.

    ``progress(done, total, message)`` hears of each iteration (and ``progress.stage(name)`` of
    loading, warming up and recording), as :class:`cuvil_pgc.viewer.progress.SearchDisplay` does.
    """
    import torch

    from cuvil_pgc._example_inputs import input_objects_kept
    from cuvil_pgc._modelspec import load_model_spec
    from cuvil_pgc._progress import stage
    from cuvil_pgc.instrument.module import instrument_module

    if iters < 1 or warmup < 0:
        raise ConfigError(f"--iters {iters} / --warmup {warmup}: need iters >= 1 and warmup >= 0")
    stage(progress, "loading the model")
    model, inputs = load_model_spec(spec)
    # instrumented before the warm-up: a model that torch compiles (whole, in part, or a torch.cond
    # it runs) compiles there with the regions' forwards in place, as it runs while recording;
    # instrumented after it, Dynamo's guards on those forwards failed and the first recorded call
    # compiled again (136 ms of a 2 ms call, ranked the model's hottest region)
    handle = instrument_module(model, depth=depth) if isinstance(model, torch.nn.Module) else None
    # every iteration is the example's call: a decoding step's cache is put back after each, which
    # the step extends (each recorded step was a token longer than the one before)
    restore = input_objects_kept(inputs)
    with torch.inference_mode():
        try:
            stage(progress, "warming up")
            for i in range(warmup):
                _tick(progress, i, warmup, "warm-up iteration")
                model(*inputs)
                restore()
            with session:
                stage(progress, "recording")
                for i in range(iters):
                    _tick(progress, i, iters, "iteration")
                    model(*inputs)
                    restore()
                _tick(progress, iters, iters, "iteration")
        finally:
            restore()
            if handle is not None:
                handle.remove()
    return 0


def _tick(progress: Any, done: int, total: int, what: str) -> None:
    if progress is not None:
        progress(done, total, f"{what} {min(done + 1, total)} of {total}")


def _run(session: Session, argv: list[str], call: Any) -> int:
    saved = sys.argv
    sys.argv = argv
    code = 0
    session.joinable = True     # the program's own profile() joins this session (instrument._joined)
    try:
        with session:
            try:
                call()
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except Exception:
                # The user's own error: show it as Python would; the trace is still finished.
                traceback.print_exc()
                code = 1
    finally:
        sys.argv = saved
    return code
