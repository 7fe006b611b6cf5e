"""The Typer app of ``cuvil-pgc``: the global ``--debug`` flag, every command registered from its
module in this package, and :func:`main` with the error handling.

Errors: a CuvilError prints one line on stderr and exits 1 (2 for usage); ``--debug`` adds the
traceback, never local variables (keys and user data live in locals). ``--json`` commands print
exactly one JSON document on stdout (:func:`cuvil_pgc.cli.output.emit_json`).
"""

from __future__ import annotations

import logging
import sys

import typer

from cuvil_pgc.cli import (
    analyze,
    builds,
    cache,
    calibrate,
    demo,
    doctor,
    fleet,
    ops,
    profile,
    recompile,
    report,
)
from cuvil_pgc.errors import CuvilError

app = typer.Typer(
    name="cuvil-pgc",
    help="Profile PyTorch inference, find why hot regions are slow, and recompile a faster build.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

#: every command, in the order ``cuvil-pgc --help`` lists them (command groups come last there)
REGISTRATIONS = (
    profile.register_profile, analyze.register_summary, profile.register_capture, doctor.register,
    calibrate.register, analyze.register_analyze, analyze.register_diff, ops.register, fleet.register,
    report.register, builds.register_signing, builds.register_store, recompile.register, demo.register,
    cache.register,
)

_state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")) -> None:
    _state["debug"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(message)s")


for _register in REGISTRATIONS:
    _register(app)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script and ``python -m cuvil_pgc``."""
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
    try:
        # Without standalone mode the parser returns the code of typer.Exit instead of exiting.
        code = app(args=args, prog_name="cuvil-pgc", standalone_mode=False)
    except CuvilError as exc:
        _fail(str(exc), debug)
    except KeyboardInterrupt:
        _fail("interrupted", debug, code=130)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        _fail("aborted", debug, code=1)
    except Exception as exc:  # usage errors of the parser and everything unexpected
        usage = _usage_error(exc)
        if usage is not None:
            _fail(usage[0], debug, code=usage[1])
        _fail(f"internal error: {type(exc).__name__}: {exc} (rerun as `{_debug_command(args)}` for the traceback, "
              "and report it)", debug)
    sys.exit(code if isinstance(code, int) else 0)


def _debug_command(args: list[str]) -> str:
    """The command line to rerun for a traceback: ``--debug`` is the top-level option, before the
    command (after it, it would be the command's or the profiled script's argument)."""
    command = next((a for a in args if not a.startswith("-")), None)
    return " ".join(word for word in ("cuvil-pgc", "--debug", command, "...") if word)


def _usage_error(exc: Exception) -> tuple[str, int] | None:
    """One line and the exit code for an error of the command-line parser, or None.

    Typer 0.29 vendors its own click (``typer._click``) where older releases use click itself:
    both raise exceptions with ``format_message()`` and ``exit_code`` (2 for usage errors), so
    they are recognised by that shape, and no import of click is needed.
    """
    if not (callable(getattr(exc, "format_message", None)) and isinstance(getattr(exc, "exit_code", None), int)):
        return None
    message = exc.format_message()
    ctx = getattr(exc, "ctx", None)
    if ctx is not None and getattr(ctx, "command_path", None):
        help_option = (getattr(ctx, "help_option_names", None) or ["--help"])[0]
        message = f"{message} (usage: {ctx.get_usage().replace('Usage: ', '', 1).strip()}; " \
                  f"try '{ctx.command_path} {help_option}')"
    return " ".join(message.split()), exc.exit_code


def _fail(message: str, debug: bool, code: int = 1) -> None:
    if debug:
        import traceback

        traceback.print_exc()
    print(f"cuvil-pgc: error: {message}", file=sys.stderr)
    sys.exit(code)
