"""Console rendering of the compile summary (``cuvil_pgc.analyze.compile_summary``) with rich.

``render_compile_summary(summary)`` returns a renderable for ``cuvil-pgc analyze``: a headline
(compile vs run time, cache hit rate, counts), where compile time went by phase, one table row
per compiled graph (compile and run time, cache results, counts), then the graph breaks,
recompiles and cache misses with their reasons (per-graph phases are in ``--json`` and the
HTML report). It only formats what the summary holds; it computes nothing new.
"""

from __future__ import annotations

import os
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

MAX_LISTED = 12   # reasons listed per section; the rest are counted
TOP_PHASES = 4


def render_compile_summary(summary: dict[str, Any]) -> RenderableType:
    """A rich renderable of the compile summary (a one-line note when nothing was compiled)."""
    graphs = summary.get("graphs") or []
    if not graphs:
        return Text("torch.compile: no compilation recorded in this trace", style="dim")
    parts: list[RenderableType] = [_headline(summary.get("totals") or {})]
    if summary.get("phases"):
        parts.append(_phase_line(summary["phases"]))
    parts.append(_GraphTable(graphs))
    breaks = [f"{_label(g)} at {_where(b.get('location'))}: {b.get('reason')}" for g in graphs
              for b in g.get("graph_breaks", [])]
    recompiles = [r for g in graphs for r in g.get("recompiles", [])]
    misses = [m for g in graphs for m in g.get("cache_misses", [])]
    for title, lines in (("Graph breaks", breaks), ("Recompiles", recompiles), ("Cache misses", misses)):
        if lines:
            parts.append(_listing(title, lines))
    return Group(*parts)


def _headline(totals: dict[str, Any]) -> Text:
    text = Text("torch.compile: ", style="bold")
    text.append(f"{totals.get('compiles', 0)} compiles ({totals.get('graphs', 0)} graphs), ")
    text.append(f"compile {_ms(totals.get('compile_ms'))}", style="bold")
    run = totals.get("run_ms")
    text.append(f", run {_ms(run)}" if run is not None else ", run time unknown (record with ops=True)")
    rate = totals.get("cache_hit_rate")
    text.append(f", FX cache hit rate {rate:.0%}" if rate is not None else ", no FX cache lookups")
    text.append(f", {totals.get('recompiles', 0)} recompiles, {totals.get('graph_breaks', 0)} graph breaks")
    return text


class _GraphTable:
    """The per-graph table, sized to the console: numbers keep their width, frame names shrink."""

    NUMBERS_WIDTH = 60      # id, compile, run, cache, counts, with padding and rules

    def __init__(self, graphs: list[dict[str, Any]]) -> None:
        self.graphs = graphs

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        frame_width = max(12, min(48, options.max_width - self.NUMBERS_WIDTH))
        table = Table(title="Compiled graphs", title_justify="left", box=box.SIMPLE_HEAD, expand=False)
        table.add_column("id", no_wrap=True)
        table.add_column("frame", overflow="ellipsis", max_width=frame_width, no_wrap=True)
        for header in ("compile", "run"):
            table.add_column(header, justify="right", no_wrap=True)
        table.add_column("fx/aot cache", justify="center", no_wrap=True)
        for header in ("recomp.", "breaks"):
            table.add_column(header, justify="right", no_wrap=True)
        for g in self.graphs:
            cache = g.get("cache") or {}
            table.add_row(
                str(g.get("compile_id")), _frame(g), _ms(g.get("total_ms")),
                _ms(g["run_ms"]) if g.get("run_ms") is not None else "-",
                Text.assemble(_cache(cache.get("fx")), "/", _cache(cache.get("aot"))),
                str(len(g.get("recompiles", []))), str(len(g.get("graph_breaks", []))),
            )
        yield table


def _phase_line(phases: dict[str, float]) -> Text:
    """Where compile time went over all graphs (self time per phase, largest first)."""
    total = sum(phases.values()) or 1.0
    text = Text("Compile time by phase: ", style="bold")
    text.append(", ".join(f"{p} {_ms(ms)} ({ms / total:.0%})" for p, ms in list(phases.items())[:TOP_PHASES]))
    if len(phases) > TOP_PHASES:
        text.append(f", {len(phases) - TOP_PHASES} more", style="dim")
    return text


def _listing(title: str, lines: list[str]) -> Text:
    text = Text(f"{title} ({len(lines)})\n", style="bold")
    for line in lines[:MAX_LISTED]:
        text.append(f"  • {line}\n")
    if len(lines) > MAX_LISTED:
        text.append(f"  … {len(lines) - MAX_LISTED} more\n", style="dim")
    return text


def _frame(g: dict[str, Any]) -> str:
    name = g.get("frame") or "?"
    if g.get("caller"):          # torch's wrapper frame (compiled modules): show the user's call
        return f"{name} (called at {_where(g['caller'])})"
    if g.get("file"):
        return f"{name} ({os.path.basename(str(g['file']))}:{g.get('line')})"
    return name


def _label(g: dict[str, Any]) -> str:
    return f"{g.get('frame') or '?'} ({g.get('compile_id')})"


def _where(location: Any) -> str:
    if not location:
        return "unknown location"
    path, _, line = str(location).rpartition(":")
    return f"{os.path.basename(path)}:{line}" if path else str(location)


def _cache(state: Any) -> Text:
    style = {"hit": "green", "miss": "yellow", "bypass": "red"}.get(state or "", "dim")
    return Text(state or "-", style=style)


def _ms(ms: Any) -> str:
    if ms is None:
        return "-"
    ms = float(ms)
    return f"{ms / 1000:.2f} s" if ms >= 1000 else f"{ms:.1f} ms"
