"""What ``cuvil-pgc demo`` prints: a line per step, each model's timings and the closing summary."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from rich.table import Table

from cuvil_pgc.viewer.tables import Column, TableView, fmt_speedup, print_view


@contextlib.contextmanager
def step(console: Any, what: str) -> Iterator[None]:
    """``what ...`` before the block and its duration after: a line per step, not a spinner (the
    recompile step shows its own live display on stderr)."""
    t0 = time.perf_counter()
    console.print(f"[dim]{what} ...[/]")
    try:
        yield
    finally:
        console.print(f"[dim]  done in {time.perf_counter() - t0:.1f} s[/]")


def print_compare(console: Any, name: str, timings_ms: dict[str, float]) -> None:
    """One model's median per call for each way of running it, and the build's speedup over each."""
    table = Table(title=f"{name}: median per call, interleaved runs", title_justify="left")
    table.add_column("runs")
    table.add_column("median", justify="right")
    table.add_column("build speedup", justify="right")
    for k, ms in timings_ms.items():
        table.add_row(k, f"{ms:.3f} ms", f"{ms / timings_ms['build']:.2f}x")
    console.print(table)


def print_summary(console: Any, results: list[Any], key: str, seconds: float) -> None:
    """The speedups of every model (``ModelResult``), where each artifact is, and the signing key."""
    columns = [Column("model", "model", identifier=True),
               Column("vs_eager", "vs eager", fmt_speedup, "right"),
               Column("vs_compile", "vs torch.compile", fmt_speedup, "right")]
    rows = [{"model": r.name, "vs_eager": r.speedup_vs_eager, "vs_compile": r.speedup_vs_compile} for r in results]
    print_view(TableView(f"cuvil-pgc demo finished in {seconds:.0f} s", columns, rows), console)
    for r in results:      # paths on lines of their own: a table cell would fold them mid-name
        console.print(f"{r.name}: trace {r.trace}", soft_wrap=True)
        console.print(f"{' ' * len(r.name)}  report {r.report}", soft_wrap=True)
        console.print(f"{' ' * len(r.name)}  build {r.build}", soft_wrap=True)
    console.print(f"signing key: {key} (public key {key}.pub); verify a build with "
                  f"`cuvil-pgc verify BUILD --pubkey {key}.pub`", soft_wrap=True)
