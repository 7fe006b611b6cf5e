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
from cuvil_pgc.analyze.gpu_figures import work_label

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
    counted = (work_label(ev) if ev.get("device") == "cuda" else None) or f"{n:.0f} {what}"
    if r.bottleneck == "launch_overhead":
        fixed = (ev.get("explained_us") or {}).get("launch_overhead")
        how = "launch gaps" if ev.get("device") == "cuda" else "per-op fixed cost + issue gaps"
        return f"{counted}, median {fmt_us(med)}; {how} ≈ {fmt_us(fixed)}"
    if r.bottleneck in ("memory_bandwidth", "compute"):
        parts = [counted]
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
    label = work_label(ev) if ev.get("device") == "cuda" else None
    return f"{uncovered:.0%} of time outside {f'GPU work ({label})' if label else what}{tail}"


WIDE = 140     # console columns from which the evidence sits in the table instead of below it


def render_hot_regions(analysis: Analysis, console: Console, top: int = 20) -> None:
    """The hot-region table: hotness order, bottleneck class with confidence, and key evidence."""
    wide = console.width >= WIDE
    table = Table(title="Hot regions (ranked by what recompiling could save)", title_justify="left")
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("region", overflow="fold")
    cols = ("calls", "total", "self", "p50", "p99", "share", "saving") if wide else ("calls", "total", "p50", "saving")
    for col in cols:
        table.add_column(col, justify="right", no_wrap=True)
    table.add_column("bottleneck", no_wrap=not wide, overflow="fold")
    if wide:
        table.add_column("evidence", overflow="fold")
    regions = analysis.regions[:top]
    for i, r in enumerate(regions, 1):
        values = {"calls": str(r.calls), "total": fmt_us(r.total_us), "self": fmt_us(r.self_us),
                  "p50": fmt_us(r.p50_us), "p99": fmt_us(r.p99_us), "share": f"{r.share:.1%}",
                  "saving": fmt_us(r.hotness)}
        verdict = Text(f"{r.bottleneck} {r.confidence:.2f}", style=_STYLE.get(r.bottleneck, ""))
        extra = [Text(key_evidence(r), style="dim")] if wide else []
        table.add_row(str(i), Text("  " * min(r.depth, 6) + display_path(r.path)), *(values[c] for c in cols),
                      verdict, *extra)
    console.print(table)
    if not wide:
        for i, r in enumerate(regions, 1):
            console.print(Text(f"{i:>2}. {r.bottleneck}: {key_evidence(r)}", style="dim"), overflow="fold")
    hidden = len(analysis.regions) - top
    if hidden > 0:
        console.print(Text(f"... {hidden} more regions (--top N to show more)", style="dim"))


def display_path(path: str) -> str:
    """A region path without the ancestors its own name repeats: instrument_module names regions by
    qualified module path, so ``model/model.layer1/model.layer1.0`` reads ``model.layer1.0``;
    ``serve/model/model.fc`` reads ``serve/model.fc``."""
    parts = path.split("/")
    kept = [p for p, nxt in zip(parts, parts[1:] + [""], strict=True) if not nxt.startswith(p + ".")]
    return "/".join(kept)


def short_name(name: str, limit: int = 48) -> str:
    """Long kernel names (templates) cut to ``limit`` characters."""
    return name if len(name) <= limit else name[:limit - 1] + "…"


def render_fusion(analysis: Analysis, console: Console, top: int = 10) -> None:
    cands = analysis.fusion_candidates[:top]
    if not cands:
        return
    table = Table(title="Fusion candidates (frequent op sequences in hot regions)", title_justify="left")
    for col in ("region", "sequence", "times", "time", "bytes saved", "est. saving"):
        table.add_column(col, overflow="fold")
    for c in cands:
        table.add_row(Text(c.region), Text(" → ".join(short_name(o) for o in c.ops)), str(c.occurrences), fmt_us(c.total_us),
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


def render_gpu(analysis: Analysis, console: Console) -> None:
    from cuvil_pgc.viewer.console_gpu import render_gpu as render

    render(analysis, console)


def render_analysis(analysis: Analysis, console: Console, top: int = 20) -> None:
    """Everything ``cuvil-pgc analyze`` prints on stdout without --json (warnings go to stderr)."""
    render_machine(analysis, console)
    render_hot_regions(analysis, console, top)
    render_gpu(analysis, console)
    render_fusion(analysis, console)
    render_ranks(analysis, console)


def render_diff(doc: dict[str, Any], console: Console, top: int = 30) -> None:
    """The diff table: regions that got faster or slower, with ratio, CI and p-value."""
    table = Table(title=f"Region diff, B vs A (Mann-Whitney U, alpha {doc.get('alpha')})", title_justify="left")
    table.add_column("region", overflow="fold", min_width=12)
    table.add_column("verdict", no_wrap=True)
    table.add_column("ratio [95% CI]", no_wrap=True, justify="right")
    table.add_column("p", no_wrap=True, justify="right")
    table.add_column("median A → B", justify="right")
    table.add_column("calls A/B", justify="right")
    style = {"slower": "red", "faster": "green", "same": "dim", "insufficient": "dim"}
    for r in doc.get("regions", [])[:top]:
        ci = r.get("ratio_ci95")
        ratio = "-" if r.get("ratio") is None else f"{r['ratio']:.2f}"
        if ci and all(x is not None for x in ci):
            ratio += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
        p = r.get("p_value")
        table.add_row(Text(r["path"]), Text(r["verdict"], style=style.get(r["verdict"], "")), ratio,
                      "-" if p is None else f"{p:.2g}", f"{fmt_us(r['median_a_us'])} → {fmt_us(r['median_b_us'])}",
                      f"{r['calls_a']}/{r['calls_b']}")
    console.print(table)
    for o in doc.get("only_one_side", []):
        console.print(Text(f"{o['verdict']}: {o['path']}", style="dim"))
