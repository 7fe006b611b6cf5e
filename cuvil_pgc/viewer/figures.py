"""Plotly figures of the HTML report, one builder per section.

Each builder takes pure data (an Analysis, derived roofline data, a plan dict) and returns a
plotly figure as a JSON-ready dict (``{"data": [...], "layout": {...}}``), or None when there is
nothing to draw (the section then shows a note instead). Nothing here analyses: the figures draw
what the Analysis holds. Every user string passes through :func:`.template.plot_text`, never into
a ``hovertemplate`` (plotly would read ``%{...}`` in it).

Big traces: the analysis already keeps at most ``timeline.MAX_SPANS`` region calls (the longest)
and ``timeline.MAX_POINTS`` points per counter; the region timeline draws spans as WebGL
(``scattergl``) line segments, one trace per hot path (``MAX_SPAN_TRACES``) and one for the rest,
with x in ms rounded to 0.1 µs, so a timeline costs a few bytes per span.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from cuvil_pgc.analyze import vocabulary
from cuvil_pgc.recompile.plan_doc import region_speedup
from cuvil_pgc.trace.schema import display_path
from cuvil_pgc.viewer.template import plot_text

if TYPE_CHECKING:
    from cuvil_pgc.analyze.analysis import Analysis
    from cuvil_pgc.recompile.plan_doc import Plan

BOTTLENECK_COLORS = {c.name: c.color for c in vocabulary.CLASSES}
OTHER_COLOR = vocabulary.UNKNOWN_COLOR
PALETTE = ("#3558a8", "#e07b39", "#2a9d3f", "#b5179e", "#0096c7", "#c77d00", "#7b2cbf", "#d62828",
           "#588157", "#8a8a8a", "#264653", "#e9c46a")
MAX_SPAN_TRACES = 40
MAX_DRAWN_SPANS = 50_000
MAX_COMPILE_GRAPHS = 40
MAX_UTIL_SERIES = 16
HIST_REGIONS = 6
SKEW_REGIONS = 12
TEMPLATE = "plotly_white"
LANE_PX = 26           # timeline: pixels per (lane, depth) row
UTIL_PX = 200          # timeline: the utilization panel
_FONT = {"family": "system-ui, -apple-system, Segoe UI, Roboto, sans-serif", "size": 12}


def template() -> dict[str, Any]:
    """The plotly template every figure uses, sent once per page (the page script applies it)."""
    import plotly.io as pio

    return pio.templates[TEMPLATE].to_plotly_json()


def _layout(**kw: Any) -> dict[str, Any]:
    base = {"template": "none", "font": _FONT, "margin": {"l": 60, "r": 20, "t": 30, "b": 40},
            "hovermode": "closest", "legend": {"x": 1.01, "y": 1.0, "xanchor": "left", "yanchor": "top"}}
    base.update(kw)
    return base


def _json(fig: go.Figure) -> dict[str, Any]:
    """The figure's JSON without a template: the page applies the shared one (``template()``)."""
    out = fig.to_plotly_json()
    out.get("layout", {}).pop("template", None)
    return out


# ------------------------------------------------------------------ region timeline + utilization

def timeline_figure(analysis: Analysis) -> dict[str, Any] | None:
    """Region spans per lane and depth above the SM (GPU) or CPU utilization, one shared x axis."""
    spans = analysis.timeline.spans or {}
    util = utilization_series(analysis.timeline.counters or {})
    has_spans = bool(spans.get("ts_us"))
    if not has_spans and not util:
        return None
    rows = (1 if has_spans else 0) + (1 if util else 0)
    # lanes LANE_PX apart whatever their number (a fixed share of the height spread 2 lanes ~90 px apart)
    span_rows = _span_rows(spans) if has_spans else None
    n_rows = len(span_rows[1]) if span_rows else 0
    span_px = min(LANE_PX * n_rows + 24, 900) if has_spans else 0
    util_px = UTIL_PX if util else 0
    gap_px = 40 if rows == 2 else 0
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=gap_px / (span_px + util_px + gap_px),
                        row_heights=[span_px, util_px] if rows == 2 else [1.0])
    arrays = []
    if has_spans:
        _, arrays = _add_spans(fig, spans, span_rows)
    if util:
        _add_utilization(fig, analysis.timeline.counters, util, row=rows)
    fig.update_layout(_layout(height=span_px + util_px + gap_px + 80))
    fig.update_xaxes(title_text="time since trace start (ms)", row=rows, col=1)
    out = _json(fig)
    for i, data in enumerate(arrays):      # set after plotly's validation, which costs seconds on big lists
        out["data"][i].update(data)
    return out


def _span_rows(spans: dict[str, list]) -> tuple[np.ndarray, list[str]]:
    """Row index of every span (lane-major, depth-minor) and one tick label per row."""
    lanes = np.asarray(spans["lane"], dtype=object)
    depth = np.asarray(spans.get("depth") or [0] * len(lanes), dtype=np.int64)
    keys = sorted({(str(lane), int(d)) for lane, d in zip(lanes.tolist(), depth.tolist(), strict=False)})
    index = {k: i for i, k in enumerate(keys)}
    rows = np.fromiter((index[(str(lane), int(d))] for lane, d in zip(lanes.tolist(), depth.tolist(), strict=False)),
                       dtype=np.int64, count=len(lanes))
    return rows, lane_labels(keys)


def lane_labels(keys: list[tuple[str, int]]) -> list[str]:
    """One label per (lane, depth) row, all in the same form: ``thread 34 · depth 1``; the rank and
    pid are kept only when the trace has several (``r1 pid 12 tid 34 · depth 0``)."""
    prefixes = {lane.rpartition(" tid ")[0] for lane, _ in keys}
    single = len(prefixes) == 1

    def lane_name(lane: str) -> str:
        head, sep, tid = lane.rpartition(" tid ")
        return f"thread {tid}" if single and sep else lane

    return [plot_text(f"{lane_name(lane)} · depth {d}", 48) for lane, d in keys]


def _segments(ts: np.ndarray, dur: np.ndarray, row: np.ndarray) -> tuple[list, list]:
    """x (ms) and y for line segments start→end, NaN-separated (drawn as gaps)."""
    x = np.empty(3 * len(ts))
    x[0::3] = ts / 1e3
    x[1::3] = (ts + dur) / 1e3
    x[2::3] = np.nan
    y = np.repeat(row, 3).astype(object)
    y[2::3] = None
    return np.round(x, 4).tolist(), y.tolist()


def _add_spans(fig: go.Figure, spans: dict[str, list],
               span_rows: tuple[np.ndarray, list[str]] | None = None) -> tuple[int, list[dict[str, list]]]:
    """Add one trace per hot path and one for the rest (first traces of ``fig``); returns the
    number of rows and, per trace, the x/y/text arrays to put in after validation
    (``span_rows``: :func:`_span_rows` of ``spans`` when the caller has it)."""
    ts = np.asarray(spans["ts_us"], dtype=float)
    dur = np.asarray(spans["dur_us"], dtype=float)
    paths = np.asarray(spans["path"], dtype=object)
    verdicts = spans.get("bottleneck") or [""] * len(ts)
    keep = np.arange(len(ts))
    if len(ts) > MAX_DRAWN_SPANS:
        keep = np.sort(np.argsort(-dur, kind="stable")[:MAX_DRAWN_SPANS])
    rows, labels = span_rows or _span_rows(spans)
    ts, dur, paths, rows = ts[keep], dur[keep], paths[keep], rows[keep]
    verdict_of = {p: v for p, v in zip(spans["path"], verdicts, strict=False)}
    uniq, inv = np.unique(paths.astype(str), return_inverse=True)
    totals = np.bincount(inv, weights=dur, minlength=len(uniq))
    top = np.argsort(-totals, kind="stable")[:MAX_SPAN_TRACES].tolist()
    arrays = []
    for k in top:
        sel = inv == k
        x, y = _segments(ts[sel], dur[sel], rows[sel])
        arrays.append({"x": x, "y": y})
        color = BOTTLENECK_COLORS.get(verdict_of.get(uniq[k], ""), OTHER_COLOR)
        fig.add_trace(go.Scattergl(mode="lines", line={"width": 9, "color": color},
                                   name=plot_text(display_path(uniq[k]), 48),
                                   legendgroup="regions",
                                   hovertemplate="%{fullData.name}<br>%{x:.3f} ms<extra></extra>"), row=1, col=1)
    rest = ~np.isin(inv, top)
    if rest.any():
        x, y = _segments(ts[rest], dur[rest], rows[rest])
        text = np.full(len(x), "", dtype=object)      # the name once per span, at its start
        text[0::3] = [plot_text(display_path(p), 80) for p in paths[rest].tolist()]
        arrays.append({"x": x, "y": y, "text": text.tolist()})
        fig.add_trace(go.Scattergl(mode="lines", line={"width": 9, "color": OTHER_COLOR}, name="other regions",
                                   legendgroup="regions", hovertemplate="%{text}<br>%{x:.3f} ms<extra></extra>"),
                      row=1, col=1)
    fig.update_yaxes(tickvals=list(range(len(labels))), ticktext=labels, autorange="reversed",
                     showgrid=False, zeroline=False, row=1, col=1)
    return len(labels), arrays


def utilization_series(counters: dict[str, dict[str, list]]) -> list[tuple[str, bool]]:
    """Counter names to draw under the timeline with their default visibility: SM utilization
    when the run has it (GPU), else CPU utilization; per-core and secondary series start hidden."""
    def family(name: str) -> str:
        return name.split(" ")[0].split(".")[0]

    sm = [n for n in counters if family(n) == "sm_util"]
    if sm:
        extra = [n for n in counters if family(n) in ("sm_occupancy", "mem_bw_util")]
        series = [(n, True) for n in sorted(sm)] + [(n, False) for n in sorted(extra)]
    else:
        cpu = [n for n in counters if family(n) == "cpu_util" and ".process_cores" not in n]
        main = {"cpu_util", "cpu_util.process", "cpu_util.total"}
        series = sorted(((n, n.split(" ")[0] in main) for n in cpu), key=lambda t: (not t[1], t[0]))
    return series[:MAX_UTIL_SERIES]      # per-core series of many ranks would dominate the file


def _add_utilization(fig: go.Figure, counters: dict[str, dict[str, list]], series: list[tuple[str, bool]],
                     row: int) -> None:
    for i, (name, shown) in enumerate(series):
        c = counters[name]
        fig.add_trace(go.Scattergl(x=np.round(np.asarray(c.get("ts_us", []), dtype=float) / 1e3, 4).tolist(),
                                   y=np.round(np.asarray(c.get("value", []), dtype=float), 3).tolist(),
                                   name=plot_text(name, 40), mode="lines",
                                   line={"width": 1.5, "color": PALETTE[i % len(PALETTE)]},
                                   visible=True if shown else "legendonly", legendgroup="util",
                                   hovertemplate="%{fullData.name}: %{y:.1f}%<br>%{x:.3f} ms<extra></extra>"),
                      row=row, col=1)
    kind = "SM" if series and series[0][0].startswith("sm_util") else "CPU"
    fig.update_yaxes(title_text=f"{kind} util (%)", rangemode="tozero", row=row, col=1)


# ------------------------------------------------------------------ compile timeline

def compile_figure(analysis: Analysis) -> dict[str, Any] | None:
    """Gantt of compile phases per graph (bars) with cache lookups, graph breaks and recompiles."""
    cs = analysis.timeline.compile_spans or {}
    if not cs.get("ts_us"):
        return None
    labels = [_graph_label(cs, i) for i in range(len(cs["ts_us"]))]
    graphs = set(list(dict.fromkeys(labels))[:MAX_COMPILE_GRAPHS])
    keep = [i for i, g in enumerate(labels) if g in graphs]
    bars = [i for i in keep if cs["dur_us"][i] > 0]
    marks = [i for i in keep if cs["dur_us"][i] <= 0]
    order = _row_order(cs, bars, marks)
    fig = go.Figure()
    phases = list(dict.fromkeys(str(cs["phase"][i]) for i in bars))
    for j, phase in enumerate(phases):
        sel = [i for i in bars if str(cs["phase"][i]) == phase]
        fig.add_trace(go.Bar(orientation="h", y=[_compile_row(cs, i) for i in sel],
                             base=[round(cs["ts_us"][i] / 1e3, 4) for i in sel],
                             x=[round(cs["dur_us"][i] / 1e3, 4) for i in sel],
                             name=plot_text(phase, 40), marker={"color": PALETTE[j % len(PALETTE)]},
                             text=[_compile_hover(cs, i) for i in sel], textposition="none",
                             hovertemplate="%{text}<extra></extra>"))
    _add_compile_marks(fig, cs, marks)
    fig.update_layout(_layout(barmode="overlay", height=max(260, 22 * len(order) + 120),
                              yaxis={"categoryorder": "array", "categoryarray": order, "autorange": "reversed",
                                     "automargin": True},
                              xaxis={"title": {"text": "time since trace start (ms)"}}))
    return _json(fig)


def _graph_label(cs: dict[str, list], i: int) -> str:
    graph = cs["graph"][i]
    label = "(outside graphs)" if graph in (None, "", "None") else str(graph)
    ranks = cs.get("rank") or []
    return f"r{ranks[i]} {label}" if len(set(ranks)) > 1 else label


def _compile_row(cs: dict[str, list], i: int) -> str:
    return plot_text(f"{_graph_label(cs, i)} · {cs['phase'][i]}", 60)


def _events_row(cs: dict[str, list], i: int) -> str:
    return plot_text(f"{_graph_label(cs, i)} · events", 60)


def _row_order(cs: dict[str, list], bars: list[int], marks: list[int]) -> list[str]:
    rows: list[str] = []
    is_bar = set(bars)
    for i in sorted(bars + marks, key=lambda i: (_graph_label(cs, i), cs["ts_us"][i], -cs["dur_us"][i])):
        row = _compile_row(cs, i) if i in is_bar else _events_row(cs, i)
        if row not in rows:
            rows.append(row)
    return rows


def _compile_hover(cs: dict[str, list], i: int) -> str:
    parts = [f"graph {plot_text(_graph_label(cs, i))}", f"phase {plot_text(cs['phase'][i])}",
             f"{cs['dur_us'][i] / 1e3:.3f} ms at {cs['ts_us'][i] / 1e3:.3f} ms"]
    if cs["cache"][i]:
        parts.append(f"cache {plot_text(cs['cache'][i])}")
    if cs["reason"][i]:
        parts.append("reason: " + plot_text(cs["reason"][i], 300))
    return "<br>".join(parts)


_MARK_STYLE = {"graph_break": ("x", "#d62828", "graph break"), "recompile": ("diamond", "#e07b39", "recompile"),
               "hit": ("circle", "#2a9d3f", "cache hit"), "miss": ("circle-open", "#d62828", "cache miss"),
               "bypass": ("square-open", "#8a8a8a", "cache bypass")}


def _mark_kind(cs: dict[str, list], i: int) -> str:
    phase = str(cs["phase"][i])
    if phase in ("graph_break", "recompile"):
        return phase
    return str(cs["cache"][i]) if cs["cache"][i] in ("hit", "miss", "bypass") else "other"


def _add_compile_marks(fig: go.Figure, cs: dict[str, list], marks: list[int]) -> None:
    kinds: dict[str, list[int]] = {}
    for i in marks:
        kinds.setdefault(_mark_kind(cs, i), []).append(i)
    for kind, rows in kinds.items():
        symbol, color, label = _MARK_STYLE.get(kind, ("circle-dot", OTHER_COLOR, "event"))
        fig.add_trace(go.Scatter(x=[round(cs["ts_us"][i] / 1e3, 4) for i in rows],
                                 y=[_events_row(cs, i) for i in rows], mode="markers", name=label,
                                 marker={"symbol": symbol, "size": 11, "color": color, "line": {"width": 2}},
                                 text=[_compile_hover(cs, i) for i in rows], hovertemplate="%{text}<extra></extra>"))


# ------------------------------------------------------------------ latency histograms

def histogram_figure(analysis: Analysis, top: int = HIST_REGIONS) -> dict[str, Any] | None:
    """Call-latency histograms (log-spaced bins) of the hottest regions, small multiples."""
    drawable = [r for r in analysis.regions if (r.histogram or {}).get("counts")]
    regions = ([r for r in drawable if r.calls > 1] or drawable)[:top]
    if not regions:
        return None
    cols = 2 if len(regions) > 1 else 1
    rows = math.ceil(len(regions) / cols)
    # each row: a title above and an axis title below; the gap between rows holds both (px / plot height)
    row_px, gap_px = 260, 110
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[plot_text(display_path(r.path), 60) for r in regions],
                        horizontal_spacing=0.08, vertical_spacing=gap_px / (row_px * rows) if rows > 1 else 0.0)
    for k, r in enumerate(regions):
        edges = [e / 1e3 for e in r.histogram["edges_us"]]
        counts = list(r.histogram["counts"])
        color = BOTTLENECK_COLORS.get(r.bottleneck, OTHER_COLOR)
        fig.add_trace(go.Scatter(x=edges, y=counts + counts[-1:], mode="lines", line={"shape": "hv", "color": color},
                                 fill="tozeroy", name=plot_text(display_path(r.path), 48), showlegend=False,
                                 hovertemplate="≥ %{x:.4g} ms: %{y} calls<extra></extra>"),
                      row=k // cols + 1, col=k % cols + 1)
    fig.update_xaxes(type="log", title_text="call latency (ms)")
    fig.update_yaxes(title_text="calls", rangemode="tozero")
    # top margin: the first row's titles sit below the modebar (about 30 px), not under it
    fig.update_layout(_layout(height=row_px * rows + 84, margin={"l": 60, "r": 20, "t": 64, "b": 50}))
    return _json(fig)


# ------------------------------------------------------------------ roofline

def roofline_figure(data: dict[str, Any]) -> dict[str, Any] | None:
    """Regions (and ops) by arithmetic intensity vs achieved FLOP/s under the machine's roofs."""
    roofs, regions, ops = data.get("roofs") or [], data.get("regions") or [], data.get("ops") or []
    if not roofs and not regions:
        return None
    xs = [p["intensity"] for p in regions + ops] + [r["ridge"] for r in roofs]
    lo, hi = min(xs + [1.0]) / 4, max(xs + [1.0]) * 8
    fig = go.Figure()
    for j, roof in enumerate(roofs):
        x = [lo, roof["ridge"], hi]
        y = [roof["mem_bw"] * lo, roof["peak_flops"], roof["peak_flops"]]
        label = (f"{roof['device']} {roof['dtype']} roof: {_si(roof['peak_flops'])}FLOP/s, "
                 f"{_si(roof['mem_bw'])}B/s" + (" (fallback)" if roof.get("source") == "fallback" else ""))
        fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=plot_text(label),
                                 line={"color": PALETTE[j % len(PALETTE)], "dash": "solid" if j == 0 else "dot"},
                                 hovertemplate="%{fullData.name}<extra></extra>"))
    _add_points(fig, regions, ops)
    fig.update_layout(_layout(height=520, xaxis={"type": "log", "title": {"text": "arithmetic intensity (FLOP/byte)"}},
                              yaxis={"type": "log", "title": {"text": "achieved FLOP/s"}, "exponentformat": "SI"}))
    return _json(fig)


def _add_points(fig: go.Figure, regions: list[dict], ops: list[dict]) -> None:
    biggest = max([p["total_us"] for p in regions] + [1.0])
    for verdict in dict.fromkeys(p["bottleneck"] for p in regions):
        pts = [p for p in regions if p["bottleneck"] == verdict]
        fig.add_trace(go.Scatter(
            x=[p["intensity"] for p in pts], y=[p["flops_s"] for p in pts], mode="markers",
            name=f"regions: {plot_text(verdict)}",
            marker={"color": BOTTLENECK_COLORS.get(verdict, OTHER_COLOR), "line": {"width": 1, "color": "#fff"},
                    "size": [8 + 22 * math.sqrt(p["total_us"] / biggest) for p in pts]},
            text=[f"{plot_text(p['path'], 120)}<br>{p['device']}, {_si(p['flops_s'])}FLOP/s, "
                  f"AI {p['intensity']:.3g}, total {p['total_us'] / 1e3:.3g} ms" for p in pts],
            hovertemplate="%{text}<extra></extra>"))
    if ops:
        fig.add_trace(go.Scatter(
            x=[p["intensity"] for p in ops], y=[p["flops_s"] for p in ops], mode="markers", name="ops / kernels",
            marker={"symbol": "x-thin", "size": 7, "line": {"width": 1.5, "color": "#444"}},
            text=[f"{plot_text(p['name'], 80)} in {plot_text(p['region'], 80)}<br>{_si(p['flops_s'])}FLOP/s, "
                  f"AI {p['intensity']:.3g}, {p['calls']:.0f} calls" for p in ops],
            hovertemplate="%{text}<extra></extra>"))


def _si(x: float) -> str:
    for scale, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}"
    return f"{x:.3g} "


# ------------------------------------------------------------------ cross-rank skew

def ranks_figure(ranks: dict[str, Any], top: int = SKEW_REGIONS) -> dict[str, Any] | None:
    """Per-rank total time of the regions with the largest cross-rank skew (grouped bars)."""
    regions = sorted(ranks.get("regions") or [], key=lambda d: -(d.get("skew_us") or 0.0))[:top]
    rank_ids = [str(r) for r in ranks.get("ranks") or []]
    if len(rank_ids) < 2 or not regions:
        return None
    fig = go.Figure()
    names = [plot_text(d["path"], 200) for d in regions]
    for j, rank in enumerate(rank_ids):
        fig.add_trace(go.Bar(x=list(range(len(regions))), text=names, textposition="none",
                             y=[(d.get("per_rank_us") or {}).get(rank, 0.0) / 1e3 for d in regions],
                             name=f"rank {plot_text(rank)}", marker={"color": PALETTE[j % len(PALETTE)]},
                             hovertemplate="%{text}<br>%{fullData.name}: %{y:.3f} ms<extra></extra>"))
    fig.update_layout(_layout(barmode="group", height=400, yaxis={"title": {"text": "total time (ms)"}},
                              xaxis=_category_axis([d["path"] for d in regions])))
    return _json(fig)


# ------------------------------------------------------------------ recompile plan

def plan_figure(plan: Plan) -> dict[str, Any] | None:
    """Predicted vs measured speedup over eager per planned region."""
    rows = [r for r in plan.regions if region_speedup(r, "predicted_ms") or region_speedup(r, "measured_ms")]
    if not rows:
        return None
    paths = [display_path(r.path or r.scope or "?") for r in rows]
    names = [plot_text(p, 200) for p in paths]
    fig = go.Figure()
    for key, name, color in (("predicted_ms", "predicted", "#9bb1de"), ("measured_ms", "measured", "#3558a8")):
        fig.add_trace(go.Bar(x=list(range(len(rows))), y=[region_speedup(r, key) for r in rows], name=name,
                             marker={"color": color}, text=names, textposition="none",
                             hovertemplate="%{text}<br>" + name + " speedup %{y:.2f}×<extra></extra>"))
    fig.add_hline(y=1.0, line={"dash": "dot", "color": "#888"})
    fig.update_layout(_layout(barmode="group", height=400, xaxis=_category_axis(paths),
                              yaxis={"title": {"text": "speedup over eager (×)"}, "rangemode": "tozero"}))
    return _json(fig)


def _category_axis(paths: list[str]) -> dict[str, Any]:
    """Bars at 0..n-1 labelled by (shortened) paths: equal labels never merge two bars."""
    return {"tickvals": list(range(len(paths))), "ticktext": [plot_text(p, 36) for p in paths], "tickangle": 30}
