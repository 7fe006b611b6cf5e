"""The ``cuvil-pgc`` command.

This module owns the Typer app, the global ``--debug`` flag and error handling; each stage
registers its own subcommands from ``<package>/commands.py`` (``register(app)``), listed in
``COMMAND_MODULES``. Errors: a CuvilError prints one line on stderr and exits 1 (2 for usage);
``--debug`` adds the traceback, never local variables (keys and user data live in locals).
``--json`` commands print exactly one JSON document on stdout via :func:`emit_json`.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any

import typer

from cuvil_pgc.errors import CuvilError

COMMAND_MODULES = (
    "cuvil_pgc.instrument.commands",
    "cuvil_pgc.analyze.commands",
    "cuvil_pgc.analyze.fleet_commands",
    "cuvil_pgc.viewer.commands",
    "cuvil_pgc.recompile.commands",
    "cuvil_pgc.demo",
    "cuvil_pgc.cache_commands",
)

app = typer.Typer(
    name="cuvil-pgc",
    help="Profile PyTorch inference, find why hot regions are slow, and recompile a faster build.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    pretty_exceptions_show_locals=False,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

_state = {"debug": False}


@app.callback()
def _root(debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors.")) -> None:
    _state["debug"] = debug
    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING, format="%(message)s")


def emit_json(obj: Any) -> None:
    """Print one JSON document on stdout (the only thing a --json command prints there)."""
    import orjson

    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
                                         | orjson.OPT_NON_STR_KEYS) + b"\n")
    sys.stdout.flush()


def _register_all() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:   # that stage has no commands yet
                continue
            raise
        module.register(app)


_register_all()


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
        _fail(f"internal error: {type(exc).__name__}: {exc} (rerun with --debug and report it)", debug)
    sys.exit(code if isinstance(code, int) else 0)


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
