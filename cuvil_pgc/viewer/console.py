"""Terminal renderers (rich) shared by ``cuvil-pgc analyze``, ``summary`` and ``diff``.

Each function takes pure data (an Analysis, a diff dict) and a ``rich.console.Console`` and only
prints; nothing here analyses. User-provided strings (region paths, op names) are printed as
plain text, never interpreted as rich markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from cuvil_pgc.analyze.analysis import Analysis, RegionStats

_STYLE = {"launch_overhead": "magenta", "memory_bandwidth": "cyan", "compute": "green",
          "host_bound": "yellow", "idle": "dim"}


def fmt_us(us: float | None) -> str:
    """µs as a short human figure: 850 µs, 12.3 ms, 4.56 s."""
    if us is None:
        return "-"
    if abs(us) >= 1e6:
        return f"{us / 1e6:.3g} s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} µs"


def fmt_rate(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def key_evidence(r: RegionStats) -> str:
    """The one line of evidence that supports a region's bottleneck class."""
    ev = r.evidence
    n = ev.get("kernel_count") if ev.get("device") == "cuda" else ev.get("op_count")
    what = "kernels" if ev.get("device") == "cuda" else "ops"
    med = ev.get("median_kernel_us") if ev.get("device") == "cuda" else ev.get("median_op_us")
    if r.bottleneck == "launch_overhead":
        cost = ev.get("launch_overhead_us") if ev.get("device") == "cuda" else ev.get("dispatch_overhead_us")
        return f"{n:.0f} {what}, median {fmt_us(med)}; overhead ≈ {fmt_us(cost)}"
    if r.bottleneck in ("memory_bandwidth", "compute"):
        parts = [f"{n:.0f} {what}"]
        if ev.get("frac_peak_bw") is not None:
            parts.append(f"{fmt_rate(ev.get('achieved_bytes_s'), 'B/s')} ({ev['frac_peak_bw']:.0%} of bw)")
        if ev.get("frac_peak_flops") is not None:
            parts.append(f"{fmt_rate(ev.get('achieved_flops_s'), 'FLOP/s')} ({ev['frac_peak_flops']:.0%} of peak)")
        if ev.get("intensity") is not None and ev.get("ridge") is not None:
            parts.append(f"AI {ev['intensity']:.3g} vs ridge {ev['ridge']:.3g}")
        return ", ".join(parts)
    uncovered = ev.get("uncovered_frac", 0.0)
    util = ev.get("cpu_util")
    tail = f", CPU {util:.0%}" if util is not None else ""
    return f"{uncovered:.0%} of time outside {what}{tail}"


def render_hot_regions(analysis: Analysis, console: Console, top: int = 20) -> None:
    """The hot-region table: hotness order, bottleneck class, confidence and key evidence."""
    table = Table(title="Hot regions (ranked by what recompiling could save)", title_justify="left")
    for col, just in (("#", "right"), ("region", "left"), ("calls", "right"), ("total", "right"),
                      ("self", "right"), ("p50", "right"), ("p99", "right"), ("share", "right"),
                      ("saving", "right"), ("bottleneck", "left"), ("conf", "right"), ("evidence", "left")):
        table.add_column(col, justify=just, overflow="fold")
    for i, r in enumerate(analysis.regions[:top], 1):
        indent = "  " * min(r.depth, 6)
        table.add_row(str(i), Text(indent + r.path), str(r.calls), fmt_us(r.total_us), fmt_us(r.self_us),
                      fmt_us(r.p50_us), fmt_us(r.p99_us), f"{r.share:.1%}", fmt_us(r.hotness),
                      Text(r.bottleneck, style=_STYLE.get(r.bottleneck, "")), f"{r.confidence:.2f}",
                      Text(key_evidence(r)))
    console.print(table)
    hidden = len(analysis.regions) - top
    if hidden > 0:
        console.print(Text(f"... {hidden} more regions (--top N to show more)", style="dim"))


def render_fusion(analysis: Analysis, console: Console, top: int = 10) -> None:
    cands = analysis.fusion_candidates[:top]
    if not cands:
        return
    table = Table(title="Fusion candidates (frequent op sequences in hot regions)", title_justify="left")
    for col in ("region", "sequence", "times", "time", "bytes saved", "est. saving"):
        table.add_column(col, overflow="fold")
    for c in cands:
        table.add_row(Text(c.region), Text(" → ".join(c.ops)), str(c.occurrences), fmt_us(c.total_us),
                      fmt_rate(c.bytes_saved, "B"), fmt_us(c.est_saving_us))
    console.print(table)


def render_machine(analysis: Analysis, console: Console) -> None:
    for device, m in analysis.machine.items():
        peak = (m.get("peak_flops") or {}).get("fp32")
        line = (f"machine ({device}): {m.get('name', '?')} — fp32 peak {fmt_rate(peak, 'FLOP/s')}, "
                f"bandwidth {fmt_rate(m.get('mem_bw'), 'B/s')}, source {m.get('source', '?')}")
        console.print(Text(line, style="dim"))


def render_ranks(analysis: Analysis, console: Console, top: int = 10) -> None:
    stragglers = (analysis.ranks or {}).get("stragglers") or []
    if not stragglers:
        return
    table = Table(title=f"Cross-rank skew (ranks {analysis.ranks.get('ranks')})", title_justify="left")
    for col in ("region", "slowest rank", "skew", "skew %"):
        table.add_column(col, overflow="fold")
    for s in stragglers[:top]:
        pct = s.get("skew_pct")
        table.add_row(Text(s["path"]), str(s["slowest_rank"]), fmt_us(s["skew_us"]),
                      "-" if pct is None else f"{pct:.1f}%")
    console.print(table)


def render_analysis(analysis: Analysis, console: Console, top: int = 20) -> None:
    """Everything ``cuvil-pgc analyze`` prints without --json."""
    render_machine(analysis, console)
    render_hot_regions(analysis, console, top)
    render_fusion(analysis, console)
    render_ranks(analysis, console)
    for w in analysis.trace.get("warnings", []):
        console.print(Text(f"warning: {w}", style="yellow"))


def render_diff(doc: dict[str, Any], console: Console, top: int = 30) -> None:
    """The diff table: regions that got faster or slower, with ratio, CI and p-value."""
    table = Table(title=f"Region diff (B vs A; significance: Mann-Whitney U, alpha {doc.get('alpha')})",
                  title_justify="left")
    for col in ("region", "calls A/B", "median A", "median B", "change", "ratio [95% CI]", "p", "verdict"):
        table.add_column(col, overflow="fold")
    style = {"slower": "red", "faster": "green", "same": "dim", "insufficient": "dim"}
    for r in doc.get("regions", [])[:top]:
        ci = r.get("ratio_ci95")
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.3f}"
        if ci and all(x is not None for x in ci):
            ratio += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
        p = r.get("p_value")
        table.add_row(Text(r["path"]), f"{r['calls_a']}/{r['calls_b']}", fmt_us(r["median_a_us"]),
                      fmt_us(r["median_b_us"]), fmt_us(r["change_us"]), ratio,
                      "-" if p is None else f"{p:.2g}", Text(r["verdict"], style=style.get(r["verdict"], "")))
    console.print(table)
    for o in doc.get("only_one_side", []):
        console.print(Text(f"{o['verdict']}: {o['path']}", style="dim"))
