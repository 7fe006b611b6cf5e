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

from cuvil_pgc.analyze import vocabulary
from cuvil_pgc.analyze.analysis import Analysis, RegionStats
from cuvil_pgc.analyze.gpu_figures import work_label
from cuvil_pgc.trace.schema import display_path
from cuvil_pgc.viewer.formats import fmt_rate, fmt_us, short_name
from cuvil_pgc.viewer.tables import Column, TableView, print_view

_STYLE = {c.name: c.style for c in vocabulary.CLASSES}


def key_evidence(r: RegionStats) -> str:
    """The one line of evidence that supports a region's bottleneck class."""
    ev = r.evidence
    n = ev.get("kernel_count") if ev.get("device") == "cuda" else ev.get("op_count")
    what = "kernels" if ev.get("device") == "cuda" else "ops"
    med = ev.get("median_kernel_us") if ev.get("device") == "cuda" else ev.get("median_op_us")
    counted = (work_label(ev) if ev.get("device") == "cuda" else None) or \
        (f"{n:.0f} {what}" if n is not None else f"{what} not recorded")    # summaries carry no counts
    if r.bottleneck == "launch_overhead":
        fixed = (ev.get("explained_us") or {}).get("launch_overhead")
        how = "launch gaps" if ev.get("device") == "cuda" else "per-op fixed cost + issue gaps"
        calls = (ev.get("runtime_calls_by_api") or {}).get("launch")
        launches = f", {calls:.0f} launch calls" if calls else ""
        return f"{counted}, median {fmt_us(med)}{launches}; {how} ≈ {fmt_us(fixed)}"
    if r.bottleneck in ("memory_bandwidth", "compute"):
        parts = [counted]
        if ev.get("frac_peak_bw") is not None:
            parts.append(f"{fmt_rate(ev.get('achieved_bytes_s'), 'B/s')} ({ev['frac_peak_bw']:.0%} of bw)")
        if ev.get("frac_peak_flops") is not None:
            parts.append(f"{fmt_rate(ev.get('achieved_flops_s'), 'FLOP/s')} ({ev['frac_peak_flops']:.0%} of peak)")
        if ev.get("intensity") is not None and ev.get("ridge") is not None:
            parts.append(f"AI {ev['intensity']:.3g} vs ridge {ev['ridge']:.3g}")
        return ", ".join(parts)
    gpu_line = _gpu_evidence(r)
    if gpu_line:
        return gpu_line
    uncovered = ev.get("uncovered_frac", 0.0)
    util = ev.get("cpu_util")
    tail = f", CPU {util:.0%}" if util is not None else ""
    label = work_label(ev) if ev.get("device") == "cuda" else None
    return f"{uncovered:.0%} of time outside {f'GPU work ({label})' if label else what}{tail}"


_API_OF = {"sync_wait": "sync", "allocation": "alloc", "setup": "setup"}


def _gpu_evidence(r: RegionStats) -> str | None:
    """Evidence of the classes only GPU regions get (communication, sync_wait, allocation, setup),
    and of host_bound / idle GPU regions; None otherwise."""
    ev = r.evidence
    if ev.get("device") != "cuda" or "gpu_busy_frac" not in ev:
        return None
    label = work_label(ev)
    busy = f"GPU busy {ev['gpu_busy_frac']:.0%}" + (f" ({label})" if label else "")
    explained = fmt_us((ev.get("explained_us") or {}).get(r.bottleneck))
    if r.bottleneck == "communication":
        overlap = ev.get("comm_exposed_us", 0.0)
        return f"collectives not hidden behind compute ≈ {explained} (exposed on the GPU {fmt_us(overlap)}); {busy}"
    api = _API_OF.get(r.bottleneck)
    if api:
        calls = (ev.get("runtime_calls_by_api") or {}).get(api, 0.0)
        host = (ev.get("runtime_by_api_us") or {}).get(api, 0.0)
        other = ev.get("sync_wait_busy_us", 0.0) if api == "sync" else 0.0
        tail = f", of which waiting for other regions' GPU work {fmt_us(other)}" if other else ""
        return f"{calls:.0f} {api} calls, {fmt_us(host)} on the host; attributed ≈ {explained}{tail}; {busy}"
    if r.bottleneck in ("host_bound", "idle"):
        util = ev.get("cpu_util")
        return f"{busy}; GPU idle with the host outside launches ≈ {explained}" + (f", CPU {util:.0%}" if util is not None else "")
    return None



def hot_regions_view(analysis: Analysis, top: int = 20) -> TableView:
    """The hot-region table as data: hotness order, bottleneck class with confidence, key evidence."""
    def verdict(r: RegionStats) -> Text:
        return Text(f"{r.bottleneck} {r.confidence:.2f}", style=_STYLE.get(r.bottleneck, ""))

    columns = [Column("rank", "#", justify="right"),
               Column("path", "region", fmt=lambda p: Text(display_path(p)), identifier=True),
               Column("calls", "calls", justify="right", drop=3),
               Column("total_us", "total", fmt_us, "right"),
               Column("self_us", "self", fmt_us, "right", drop=4),
               Column("p50_us", "p50", fmt_us, "right", drop=2),
               Column("p99_us", "p99", fmt_us, "right", drop=5),
               Column("share", "share", lambda x: f"{x:.1%}", "right", drop=4),
               Column("saving_us", "saving", fmt_us, "right"),
               Column("bottleneck", "bottleneck", lambda r: verdict(r) if isinstance(r, RegionStats) else r),
               Column("evidence", "evidence", lambda e: Text(e or "", style="dim"), drop=6)]
    rows = [{"rank": i, "path": r.path, "calls": r.calls, "total_us": r.total_us, "self_us": r.self_us,
             "p50_us": r.p50_us, "p99_us": r.p99_us, "share": r.share, "saving_us": r.hotness,
             "bottleneck": r, "evidence": key_evidence(r), "confidence": r.confidence}
            for i, r in enumerate(analysis.regions[:top], 1)]
    return TableView("Hot regions (ranked by what recompiling could save)", columns, rows)


def hot_region_rows(view: TableView) -> list[dict]:
    """Rows of :func:`hot_regions_view` as plain values (JSON, CSV)."""
    return [{**r, "bottleneck": r["bottleneck"].bottleneck} for r in view.rows]


def render_hot_regions(analysis: Analysis, console: Console, top: int = 20, wide: bool = False) -> None:
    """Print the hot-region table; the evidence goes below it when the width leaves no room."""
    view = hot_regions_view(analysis, top)
    shown = print_view(view, console, wide, elsewhere=("evidence",))
    if "evidence" not in {c.key for c in shown}:
        for r in view.rows:
            console.print(Text(f"{r['rank']:>2}. {r['bottleneck'].bottleneck}: {r['evidence']}", style="dim"),
                          overflow="fold")
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


def render_analysis(analysis: Analysis, console: Console, top: int = 20, wide: bool = False) -> None:
    """Everything ``cuvil-pgc analyze`` prints on stdout without --json (warnings go to stderr)."""
    render_machine(analysis, console)
    render_hot_regions(analysis, console, top, wide)
    render_gpu(analysis, console)
    render_fusion(analysis, console)
    render_ranks(analysis, console)


def diff_view(doc: dict[str, Any]) -> TableView:
    """The diff table as data: regions that got faster or slower, with ratio, CI and p-value."""
    style = {"slower": "red", "faster": "green", "same": "dim", "insufficient": "dim"}

    def ratio(r: dict[str, Any]) -> str:
        ci = r.get("ratio_ci95")
        text = "-" if r.get("ratio") is None else f"{r['ratio']:.2f}"
        if ci and all(x is not None for x in ci):
            text += f" [{ci[0]:.2f}, {ci[1]:.2f}]"
        return text

    columns = [Column("path", "region", lambda p: Text(display_path(p)), identifier=True),
               Column("verdict", "verdict", lambda v: Text(v, style=style.get(v, ""))),
               Column("ratio", "ratio [95% CI]", justify="right"),
               Column("p_value", "p", lambda p: "-" if p is None else f"{p:.2g}", "right", drop=2),
               Column("medians", "median A → B", justify="right", drop=1),
               Column("calls", "calls A/B", justify="right", drop=3)]
    rows = [{"path": r["path"], "verdict": r["verdict"], "ratio": ratio(r), "p_value": r.get("p_value"),
             "medians": f"{fmt_us(r['median_a_us'])} → {fmt_us(r['median_b_us'])}",
             "calls": f"{r['calls_a']}/{r['calls_b']}"} for r in doc.get("regions", [])]
    return TableView(f"Region diff, B vs A (Mann-Whitney U, alpha {doc.get('alpha')})", columns, rows)


def render_diff(doc: dict[str, Any], console: Console, top: int = 30, wide: bool = False) -> None:
    """Print the diff table and the regions seen on one side only."""
    view = diff_view(doc)
    view.rows = view.rows[:top]
    print_view(view, console, wide)
    for o in doc.get("only_one_side", []):
        console.print(Text(f"{o['verdict']}: {o['path']}", style="dim"))
