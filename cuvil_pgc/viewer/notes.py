"""Lines of prose the CLI prints beside its tables (notes, warnings), wrapped at word boundaries to
the console's width (80 columns when piped), never folded mid-word unless a word is wider than that."""

from __future__ import annotations

from typing import Any


def print_note(text: str, *, err: bool = False, console: Any = None) -> None:
    """Print ``text`` wrapped at spaces on ``console`` (default: a new one on stdout, or stderr with ``err``)."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console(stderr=err)
    console.print(Text(text), soft_wrap=False, overflow="fold")
