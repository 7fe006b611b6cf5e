"""Command-line splitting for ``cuvil-pgc profile``: everything after the script belongs to it.

``python [options] script.py ARGS`` and ``python [options] -m module ARGS`` stop reading their own
options at the script (or at ``-m module``); ``cuvil-pgc profile`` does the same, so
``cuvil-pgc profile echoargs.py --foo 1 -o x.json`` runs ``echoargs.py --foo 1 -o x.json`` and
writes the default trace. :class:`ScriptCommand` parses only the head (our options and the script
name) with click and leaves the tail in ``ctx.meta[SCRIPT_ARGS]``.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand

SCRIPT_ARGS = "cuvil_pgc.script_args"
MODULE_OPTION = "-m"


def split_argv(args: list[str], value_options: set[str], module_option: str = MODULE_OPTION
               ) -> tuple[list[str], list[str]]:
    """(our arguments, the program's arguments).

    The split comes after the first positional argument (the script), after ``-m MODULE`` (or
    ``-mMODULE``), or at ``--``. ``value_options`` are our options that take a value (their value
    is never the script); unknown options stay in our part, for click to reject.
    """
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            return args[:i + 2], args[i + 2:]            # `--` then the script, then its arguments
        if arg == module_option:
            return args[:i + 2], args[i + 2:]
        if arg.startswith(module_option) and not arg.startswith("--") and len(arg) > len(module_option):
            return args[:i + 1], args[i + 1:]
        if arg.startswith("-") and arg != "-":
            name = arg.split("=", 1)[0]
            i += 2 if (name in value_options and "=" not in arg) else 1
            continue
        return args[:i + 1], args[i + 1:]
    return args, []


class ScriptCommand(TyperCommand):
    """A Typer command whose arguments after the script (or ``-m MODULE``) go to the program."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        # typer 0.29 vendors its own click: options are recognised by shape, not by class
        values = {opt for p in self.params if getattr(p, "param_type_name", "") == "option"
                  and not getattr(p, "is_flag", False) for opt in (*p.opts, *p.secondary_opts)}
        head, tail = split_argv(list(args), values)
        ctx.meta[SCRIPT_ARGS] = tail
        return super().parse_args(ctx, head)


def script_args(ctx: Any) -> list[str]:
    """The program's own arguments, as :class:`ScriptCommand` split them."""
    return list(ctx.meta.get(SCRIPT_ARGS, []))
