"""Renderers: an Analysis presented as text, one class per output format, registered by name.

As pyinstrument's renderers: a renderer takes its options when made and only consumes the data
(``render(analysis) -> str``); :func:`renderer` makes one by name. Registered here:

- ``console``: what ``cuvil-pgc analyze`` prints (hot regions, GPU, fusion, ranks, compile), with
  the colours and width of the terminal it will be printed on;
- ``csv``: the hot-region table as CSV (``analyze --csv``);
- ``html``: the self-contained report (``cuvil-pgc report``, :mod:`.html`).

The analysis as JSON is the data itself (``Analysis.to_json()``), not a rendering. A new output
format is a :class:`Renderer` subclass with a ``name``, decorated with :func:`register`.
"""

from __future__ import annotations

import io
from typing import Any, ClassVar

from cuvil_pgc.errors import ConfigError

RENDERERS: dict[str, type[Renderer]] = {}


class Renderer:
    """Base class: ``__init__`` takes the options, :meth:`render` the Analysis."""

    name: ClassVar[str] = ""

    def render(self, analysis: Any) -> str:
        raise NotImplementedError


def register(cls: type[Renderer]) -> type[Renderer]:
    """Class decorator: make ``cls`` available as ``renderer(cls.name)``."""
    RENDERERS[cls.name] = cls
    return cls


def renderer(name: str, **options: Any) -> Renderer:
    """The renderer registered as ``name``, made with ``options``."""
    cls = RENDERERS.get(name)
    if cls is None:
        raise ConfigError(f"no renderer named {name!r}", fix=f"choose from {', '.join(RENDERERS)}")
    return cls(**options)


@register
class ConsoleRenderer(Renderer):
    """The analysis as rich tables, as ``console`` (default: a Console on stdout) would print them."""

    name = "console"

    def __init__(self, top: int = 20, wide: bool = False, console: Any = None) -> None:
        self.top, self.wide, self.console = top, wide, console

    def render(self, analysis: Any) -> str:
        from rich.console import Console

        from cuvil_pgc.viewer.console import render_analysis
        from cuvil_pgc.viewer.console_compile import render_compile_summary

        console = self.console or Console()
        with console.capture() as captured:
            render_analysis(analysis, console, self.top, self.wide)
            totals = analysis.compile.get("totals") or {}
            if analysis.compile.get("graphs") or totals.get("compile_ms"):     # else nothing was compiled
                shown = render_compile_summary(analysis.compile)
                if shown is not None:
                    console.print(shown)
        return captured.get()


@register
class CsvRenderer(Renderer):
    """The hot-region table as CSV: every column, raw values (``top``: the hottest N; default all)."""

    name = "csv"

    def __init__(self, top: int | None = None) -> None:
        self.top = top

    def render(self, analysis: Any) -> str:
        from cuvil_pgc.viewer.console import hot_region_rows, hot_regions_view
        from cuvil_pgc.viewer.tables import write_csv

        view = hot_regions_view(analysis, self.top or len(analysis.regions))
        view.rows = hot_region_rows(view)
        out = io.StringIO()
        write_csv(view, out)
        return out.getvalue()


@register
class HtmlRenderer(Renderer):
    """The self-contained HTML report; options as :func:`cuvil_pgc.viewer.html.render_html`."""

    name = "html"

    def __init__(self, **options: Any) -> None:
        self.options = options

    def render(self, analysis: Any) -> str:
        from cuvil_pgc.viewer.html import render_html

        return render_html(analysis, **self.options)
