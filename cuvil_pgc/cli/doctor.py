"""``cuvil-pgc doctor``: which backends work on this machine and, for each that does not, why and
what to do. The profiling backends are the instrument stage's checks
(:mod:`cuvil_pgc.instrument.doctor`), the recompiler's runtimes those of
:mod:`cuvil_pgc.recompile.runtimes`; this command runs both lists."""

from __future__ import annotations

from collections.abc import Callable

import typer

from cuvil_pgc.cli.output import emit_json
from cuvil_pgc.instrument import doctor
from cuvil_pgc.instrument.doctor import BackendCheck
from cuvil_pgc.recompile.runtimes import RUNTIME_BACKENDS


def runtime_check(backend: str) -> Callable[[], BackendCheck]:
    """A check of one of the recompiler's runtime backends (see :mod:`cuvil_pgc.recompile.runtimes`)."""

    def check() -> BackendCheck:
        from cuvil_pgc.recompile import runtimes

        status = runtimes.describe(backend)
        name = f"{runtimes.RUNTIMES[backend].title} (recompile backend)"
        return BackendCheck(name, status.ok, status.detail, status.reason, status.fix)

    check.__name__ = f"check_{backend}"
    check.__doc__ = f"The recompiler's {backend} backend is installed and can run."
    return check


def check_call_accel() -> BackendCheck:
    """A built region's lean call in C (:mod:`cuvil_pgc.recompile.lean_call`), built at install
    when a C compiler is present."""
    from cuvil_pgc.recompile import lean_call

    return doctor.c_extension_check("build call accelerator (C)", lean_call.ACCELERATED,
                                    "cuvil_pgc.recompile._leancall",
                                    "a built region checks and makes its runtime's call in C",
                                    "a build's calls are checked and made in Python",
                                    "3-8% of a 0.3 ms ONNX Runtime or OpenVINO call")


def all_checks() -> list[Callable[[], BackendCheck]]:
    """Every check the command runs: the profiling backends (``doctor.CHECKS``, editable), then the
    runtimes and the C checks of a build's call."""
    return [*doctor.CHECKS, *(runtime_check(b) for b in RUNTIME_BACKENDS), check_call_accel]


def register(app: typer.Typer) -> None:
    @app.command("doctor")
    def doctor_command(
        json_out: bool = typer.Option(False, "--json", help="Print the checks as one JSON document."),
    ) -> None:
        """Show which profiling backends work here and, for each that does not, why and what to do."""
        checks = doctor.run_checks(all_checks())
        if json_out:
            emit_json({"ok": all(c.ok for c in checks), "checks": [c.to_dict() for c in checks]})
            return
        from rich.console import Console

        from cuvil_pgc.viewer.console_doctor import doctor_table

        Console().print(doctor_table(checks))
