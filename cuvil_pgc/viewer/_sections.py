"""Markup of the report's sections (everything but the figures, which ``figures`` builds).

Each ``*_section`` function returns one ``<section id=...>`` with a heading; it takes pure data and
renders a note when its data is missing. Every user string goes through ``template.text``; the
markup carries no event-handler attributes and no links built from data.
"""

from __future__ import annotations

import datetime as _dt
import math
from typing import TYPE_CHECKING, Any

from cuvil_pgc.analyze import vocabulary
from cuvil_pgc.viewer.console import key_evidence
from cuvil_pgc.viewer.formats import clip, fmt_rate, fmt_us
from cuvil_pgc.viewer.template import text

if TYPE_CHECKING:
    from cuvil_pgc.analyze.analysis import Analysis

MAX_TABLE_ROWS = 500
MAX_LIST_ITEMS = 20


# ------------------------------------------------------------------ small builders

def cell(content: str, v: Any = None, num: bool = False) -> str:
    """A ``<td>``; ``content`` is markup already escaped, ``v`` the sort value."""
    sort = "" if v is None else f' data-v="{text(_sort_value(v))}"'
    klass = ' class="num"' if num else ""
    return f"<td{klass}{sort}>{content}</td>"


def _sort_value(v: Any) -> str:
    if isinstance(v, float) and not math.isfinite(v):
        return "-1e308"
    return repr(v) if isinstance(v, float) else str(v)


def table(headers: list[str], rows: list[str], *, table_id: str | None = None, sortable: bool = False,
          num_cols: tuple[int, ...] = ()) -> str:
    num = ' class="num"'
    ths = "".join(f'<th{num if i in num_cols else ""} scope="col">{text(h)}</th>' for i, h in enumerate(headers))
    cls = "sortable" if sortable else "plain"
    ident = f' id="{text(table_id)}"' if table_id else ""
    return (f'<div class="table-wrap"><table class="{cls}"{ident}><thead><tr>{ths}</tr></thead>'
            f"<tbody>{''.join(rows)}</tbody></table></div>")


def facts(pairs: list[tuple[str, str]]) -> str:
    """A two-column key/value table; values are markup already escaped."""
    rows = "".join(f'<tr><th scope="row">{text(k)}</th><td>{v}</td></tr>' for k, v in pairs)
    return f'<table class="facts"><tbody>{rows}</tbody></table>'


def note(message: str, warn: bool = False) -> str:
    return f'<p class="note{" warn" if warn else ""}">{text(message)}</p>'


def section(section_id: str, title: str, body: str) -> str:
    return f'<section id="{section_id}"><h2>{text(title)}</h2>{body}</section>'


def plot(key: str) -> str:
    return f'<div class="plot" id="plot-{key}" data-figure="{key}"></div>'


def badge(verdict: str) -> str:
    known = vocabulary.of(verdict) is not None
    return f'<span class="badge b-{verdict if known else "unknown"}">{text(verdict or "?")}</span>'


def path_text(path: Any) -> str:
    """An identifier (region path, operator, file): it may wrap only after a ``.`` or ``/`` (a
    ``<wbr>`` there; the CSS never breaks inside a word), so ``model.encoder_blocks.0`` never
    reads ``model.encoder_bloc / ks.0``; a table too narrow for it scrolls sideways instead."""
    return f'<bdi class="path">{_break_after_separators(text(path))}</bdi>'


def _break_after_separators(markup: str) -> str:
    # escaped markup holds no '.' or '/' of its own (entities are &lt; &#x27; ...), so this is safe
    return markup.replace("/", "/<wbr>").replace(".", ".<wbr>")


# ------------------------------------------------------------------ run summary

def summary_section(analysis: Analysis, cuvil_version: str) -> str:
    tr = analysis.trace or {}
    pairs = [("Sources", _sources(tr.get("sources") or [])),
             ("Duration", text(fmt_us(tr.get("duration_us")))),
             ("Events", text(_counts(tr)))]
    pairs += [(f"Machine ({device})", _machine(m)) for device, m in (analysis.machine or {}).items()]
    pairs += [("Devices", _devices(tr.get("devices") or [], tr.get("gpu") or {})),
              ("Versions", _versions(tr.get("runs") or [], cuvil_version)),
              ("Dropped events", _dropped(tr)),
              ("Samplers", _samplers(tr.get("samplers") or {}))]
    if tr.get("filter"):
        pairs.append(("Region filter", f"<code>{text(tr['filter'])}</code>"))
    warnings = "".join(note(w, warn=True) for w in (tr.get("warnings") or [])[:MAX_LIST_ITEMS])
    return section("summary", "Run summary", facts(pairs) + warnings)


def _sources(sources: list[dict]) -> str:
    if not sources:
        return "-"
    items = []
    for s in sources[:MAX_LIST_ITEMS]:
        extra = [f"rank {s.get('rank')}", str(s.get("format", "?"))]
        if s.get("recovered"):
            extra.append("recovered from a partial file")
        extra += [str(n) for n in s.get("notes") or []]
        items.append(f"<li>{path_text(s.get('path'))} <span class=\"count\">({text('; '.join(extra))})</span></li>")
    more = len(sources) - MAX_LIST_ITEMS
    return f"<ul>{''.join(items)}</ul>" + (note(f"{more} more sources") if more > 0 else "")


def _counts(tr: dict) -> str:
    counts = tr.get("counts") or {}
    parts = [f"{v:,} {k}" for k, v in counts.items() if v]
    return f"{tr.get('events', 0):,} events" + (f" ({', '.join(parts)})" if parts else "")


def _machine(m: dict) -> str:
    if not isinstance(m, dict):
        return "-"
    peaks = ", ".join(f"{k} {fmt_rate(v, 'FLOP/s')}" for k, v in (m.get("peak_flops") or {}).items())
    parts = [str(m.get("name", "?")), f"peak {peaks or '-'}", f"bandwidth {fmt_rate(m.get('mem_bw'), 'B/s')}"]
    if m.get("dispatch_overhead_s"):
        parts.append(f"dispatch {fmt_us(m['dispatch_overhead_s'] * 1e6)}/op")
    if m.get("launch_latency_s"):
        parts.append(f"launch {fmt_us(m['launch_latency_s'] * 1e6)}/kernel")
    source = m.get("source", "?")
    parts.append(f"source: {source}" + (f" ({m['measured_at']})" if m.get("measured_at") else ""))
    return text(" — ".join(parts[:1]) + " · " + ", ".join(parts[1:]))


def _devices(devices: list, gpu: dict) -> str:
    if not devices and gpu:         # GPU work in a trace that does not describe its GPUs
        work = ", ".join(f"{name} ({d.get('kernel_count', 0):,} kernels)" if isinstance(d, dict) else str(name)
                         for name, d in list(gpu.items())[:MAX_LIST_ITEMS])
        return text(f"not described in the trace (no deviceProperties); GPU work on {work}")
    if not devices:
        return "none recorded (CPU-only run)"
    items = []
    for d in devices[:MAX_LIST_ITEMS]:
        if isinstance(d, dict):
            mem = d.get("totalGlobalMem") or d.get("total_memory") or d.get("memory")
            label = f"{d.get('id', d.get('index', '?'))}: {d.get('name', '?')}"
            if isinstance(mem, (int, float)):
                label += f", {mem / 2**30:.1f} GiB"
            items.append(f"<li>{text(label)}</li>")
        else:
            items.append(f"<li>{text(d)}</li>")
    return f"<ul>{''.join(items)}</ul>"


def _versions(runs: list[dict], cuvil_version: str) -> str:
    lines = [f"cuvil-pgc {cuvil_version} (report)"]
    for r in runs[:MAX_LIST_ITEMS]:
        bits = [f"rank {r.get('rank', '?')}"]
        for key, label in (("python", "Python"), ("torch", "torch"), ("platform", ""), ("host", "host")):
            if r.get(key):
                bits.append(f"{label} {r[key]}".strip())
        if r.get("start_unix_ns"):
            start = _dt.datetime.fromtimestamp(r["start_unix_ns"] / 1e9, tz=_dt.timezone.utc)
            bits.append("started " + start.strftime("%Y-%m-%d %H:%M:%S UTC"))
        if r.get("command"):
            cmd = r["command"] if isinstance(r["command"], str) else " ".join(map(str, r["command"]))
            bits.append("command: " + clip(cmd, 160))
        lines.append(", ".join(bits))
    return "<br>".join(text(line) for line in lines)


def _dropped(tr: dict) -> str:
    dropped = {k: v for k, v in (tr.get("dropped") or {}).items() if v}
    parts = [f"{k}: {v:,.0f}" for k, v in dropped.items()] or ["none"]
    spans = tr.get("timeline_spans_dropped") or 0
    if spans:
        parts.append(f"timeline: {spans:,} shortest region calls not drawn (all are in the statistics)")
    return text("; ".join(parts))


def _samplers(samplers: dict) -> str:
    if not samplers:
        return "no sampler status recorded (not a cuvil-pgc trace, or no samplers ran)"
    items = []
    for name, st in samplers.items():
        st = st if isinstance(st, dict) else {"status": st}
        status = str(st.get("status", "?"))
        why = st.get("reason") or "; ".join(str(n) for n in st.get("notes") or [])
        detail = ", ".join(f"{k} {clip(v, 60)}" for k, v in st.items()
                           if k not in ("status", "reason", "notes") and isinstance(v, (int, float, str)))
        items.append(f'<li><b>{text(name)}</b>: <span class="status-{text(status)}">{text(status)}</span>'
                     + (f" — {text(clip(why, 300))}" if why else "")
                     + (f' <span class="count">({text(detail)})</span>' if detail else "") + "</li>")
    return f"<ul>{''.join(items)}</ul>"


# ------------------------------------------------------------------ hot regions

def hot_regions_section(analysis: Analysis) -> str:
    regions = analysis.regions[:MAX_TABLE_ROWS]
    if not regions:
        return section("hot-regions", "Hot regions", note("No regions in this analysis (the filter matched none?)."))
    headers = ["#", "region", "calls", "total", "self", "mean", "p50", "p95", "p99", "share", "saving",
               "bottleneck", "confidence", "evidence"]
    rows = [_region_row(i, r) for i, r in enumerate(regions, 1)]
    more = len(analysis.regions) - len(regions)
    body = ('<div class="filter-row"><input type="search" class="table-filter" data-table="hot-table" '
            'data-count="hot-count" placeholder="filter regions, bottlenecks, evidence…" aria-label="filter regions">'
            f'<span class="count" id="hot-count">{len(rows)} of {len(rows)} shown</span></div>'
            + note("Ranked by saving: the time recompiling could remove (hotness). Click a header to sort.")
            + table(headers, rows, table_id="hot-table", sortable=True, num_cols=tuple(range(2, 11)) + (12,)))
    if more > 0:
        body += note(f"{more} colder regions not listed (see `cuvil-pgc analyze --json`).")
    return section("hot-regions", "Hot regions", body)


def _region_row(rank: int, r: Any) -> str:
    times = [r.total_us, r.self_us, r.mean_us, r.p50_us, r.p95_us, r.p99_us]
    return ("<tr>" + cell(str(rank), rank, True)
            + cell(path_text("\u2002" * min(r.depth, 6) + r.path), r.path)
            + cell(f"{r.calls:,}", r.calls, True)
            + "".join(cell(text(fmt_us(t)), t, True) for t in times)
            + cell(f"{r.share:.1%}", r.share, True) + cell(text(fmt_us(r.hotness)), r.hotness, True)
            + cell(badge(r.bottleneck), r.bottleneck) + cell(f"{r.confidence:.2f}", r.confidence, True)
            + cell(_evidence(r)) + "</tr>")


def _evidence(r: Any) -> str:
    try:
        line = key_evidence(r)
    except (TypeError, ValueError, KeyError):
        line = ""
    ev = {k: v for k, v in (r.evidence or {}).items() if v is not None}
    items = "".join(f"<dt>{text(k)}</dt><dd>{text(_evidence_value(v))}</dd>" for k, v in ev.items())
    details = f"<details><summary>all evidence</summary><dl>{items}</dl></details>" if items else ""
    return text(line) + details


def _evidence_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, dict):
        return ", ".join(f"{k} {_evidence_value(x)}" for k, x in v.items())
    return clip(v, 300)


# ------------------------------------------------------------------ fusion, ranks

def fusion_section(analysis: Analysis) -> str:
    cands = analysis.fusion_candidates[:MAX_TABLE_ROWS]
    if not cands:
        return section("fusion", "Fusion candidates",
                       note("No fusion candidates: no frequent op/kernel sequence in the hot regions "
                            "(or no op capture: profile with ops=True)."))
    rows = ["<tr>" + cell(path_text(c.region), c.region) + cell(path_text(" → ".join(map(str, c.ops))), len(c.ops))
            + cell(f"{c.occurrences:,}", c.occurrences, True) + cell(text(fmt_us(c.total_us)), c.total_us, True)
            + cell(text(fmt_rate(c.bytes_saved, "B")), c.bytes_saved, True)
            + cell(text(fmt_us(c.est_saving_us)), c.est_saving_us, True) + "</tr>" for c in cands]
    body = table(["region", "op sequence", "times", "time", "bytes not re-read", "est. saving"], rows,
                 table_id="fusion-table", sortable=True, num_cols=(2, 3, 4, 5))
    return section("fusion", "Fusion candidates", body)


def ranks_section(ranks: dict[str, Any], has_figure: bool) -> str:
    title = "Cross-rank skew"
    if len(ranks.get("ranks") or []) < 2:
        return section("ranks", title, note("Single rank: no cross-rank skew to show "
                                            "(pass the trace files of several ranks to compare them)."))
    stragglers = ranks.get("stragglers") or []
    rows = ["<tr>" + cell(path_text(s.get("path")), s.get("path")) + cell(text(s.get("slowest_rank")), s.get("slowest_rank"), True)
            + cell(text(fmt_us(s.get("skew_us"))), s.get("skew_us"), True)
            + cell("-" if s.get("skew_pct") is None else f"{s['skew_pct']:.1f}%", s.get("skew_pct") or 0.0, True)
            + "</tr>" for s in stragglers[:MAX_TABLE_ROWS]]
    body = text(f"ranks {', '.join(map(str, ranks.get('ranks') or []))}")
    body = f"<p>{body}</p>" + (plot("ranks") if has_figure else "")
    body += (table(["region", "slowest rank", "skew (vs median)", "skew %"], rows, table_id="ranks-table",
                   sortable=True, num_cols=(1, 2, 3)) if rows else note("No region is slower on one rank."))
    return section("ranks", title, body)
