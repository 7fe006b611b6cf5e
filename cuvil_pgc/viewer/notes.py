"""Lines of prose the CLI prints beside its tables (notes, warnings), wrapped at word boundaries to
the console's width (80 columns when piped). A word wider than that (a path, usually) is never
folded: it gets a line of its own, whole, so that it can be copied from the terminal."""

from __future__ import annotations

import textwrap
from typing import Any


def print_note(text: str, *, err: bool = False, console: Any = None) -> None:
    """Print ``text`` wrapped at spaces on ``console`` (default: a new one on stdout, or stderr with ``err``)."""
    from rich.console import Console
    from rich.text import Text

    console = console or Console(stderr=err)
    for paragraph in text.split("\n"):
        lines = textwrap.wrap(paragraph, console.width, break_long_words=False, break_on_hyphens=False) or [""]
        for line in lines:
            console.print(Text(line), soft_wrap=True, overflow="ignore", crop=False)
