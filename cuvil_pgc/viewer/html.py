"""The self-contained HTML report: ``render_html(analysis, ...) -> str`` and ``write_report``.

The report reads an :class:`~cuvil_pgc.analyze.analysis.Analysis` (and optionally a recompile
plan) and never raw events. It is one file that works offline: plotly.js inlined once (or, with
``plotly_js="cdn"``, referenced from the CDN with an SRI hash), the figures as one JSON block,
and a small script of ours drawing them with ``Plotly.newPlot``. Sections, each with an id:
``summary``, ``hot-regions``, ``gpu``, ``operators``, ``timeline``, ``compile``, ``histograms``, ``roofline``, ``fusion``,
``ranks`` and ``plan``; each shows a note when its data is missing. Escaping and the
Content-Security-Policy are described in :mod:`cuvil_pgc.viewer.template`.
"""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuvil_pgc.errors import ConfigError
from cuvil_pgc.viewer import _run_sections as runs
from cuvil_pgc.viewer import _sections as sec
from cuvil_pgc.viewer import figures as figs
from cuvil_pgc.viewer.template import PLOTLY_MODES, page, text

if TYPE_CHECKING:
    from cuvil_pgc.analyze.analysis import Analysis
    from cuvil_pgc.recompile.plan_doc import Plan

TEMPLATE_KEY = "_template"     # not a figure: the plotly template all figures share
SECTIONS = (("summary", "Summary"), ("hot-regions", "Hot regions"), ("gpu", "GPU"), ("operators", "Operators"),
            ("timeline", "Timeline"),
            ("compile", "Compile"), ("histograms", "Latency"), ("roofline", "Roofline"),
            ("fusion", "Fusion"), ("ranks", "Ranks"), ("plan", "Recompile plan"))


def render_html(analysis: Analysis, *, plan: Plan | None = None, plotly_js: str = "inline",
                title: str | None = None, build: dict[str, Any] | None = None) -> str:
    """The report as one HTML document.

    Args:
        analysis: the Analysis to present.
        plan: a build's recompile :class:`~cuvil_pgc.recompile.plan_doc.Plan` (or its plan.json
            document), shown in the ``plan`` section.
        plotly_js: ``"inline"`` (self-contained, works offline) or ``"cdn"`` (smaller file).
        title: page title; default names the trace files.
        build: facts about the build the plan came from (path, name, version, created, signed).
    """
    if plotly_js not in PLOTLY_MODES:
        raise ConfigError(f"--plotly-js {plotly_js!r} is not one of {', '.join(PLOTLY_MODES)}")
    if isinstance(plan, dict):              # a plan.json document, as the API took before plans were typed
        from cuvil_pgc.recompile.plan_doc import Plan, PlanFormatError

        try:
            plan = Plan.from_json(plan)
        except PlanFormatError as exc:
            raise ConfigError(f"the plan is not a plan this cuvil-pgc reads ({exc})",
                              fix="pass build.plan or the plan.json of a build written by `cuvil-pgc recompile`") from None
    figures = build_figures(analysis, plan)
    title = title or default_title(analysis)
    body = "".join(s(analysis, plan, build, figures) for s in SECTION_RENDERERS)
    return page(title=title, header=_header(title, analysis), nav=_nav(), body=body, figures=figures,
                plotly_js=plotly_js)


def build_figures(analysis: Analysis, plan: Plan | None) -> dict[str, Any]:
    """Figure JSON by key (the ``data-figure`` of its div); sections without data have none."""
    from cuvil_pgc.analyze.roofline import roofline_data

    built = {"timeline": figs.timeline_figure(analysis), "compile": figs.compile_figure(analysis),
             "histograms": figs.histogram_figure(analysis), "roofline": figs.roofline_figure(roofline_data(analysis)),
             "ranks": figs.ranks_figure(analysis.ranks or {}),
             "plan": figs.plan_figure(plan) if plan else None}
    figures = {k: v for k, v in built.items() if v is not None}
    if figures:
        figures[TEMPLATE_KEY] = figs.template()
    return figures


def default_title(analysis: Analysis) -> str:
    sources = [Path(str(s.get("path", ""))).name for s in (analysis.trace or {}).get("sources") or []]
    label = ", ".join(sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")
    return f"cuvil-pgc report — {label}" if label else "cuvil-pgc report"


def _header(title: str, analysis: Analysis) -> str:
    from cuvil_pgc._version import __version__

    now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    n = len(analysis.regions)
    return (f'<header class="report"><h1>{text(title)}</h1><p>{text(f"{n} regions · generated {now} by cuvil-pgc {__version__}")}'
            "</p></header>")


def _nav() -> str:
    links = "".join(f'<a href="#{sid}">{text(label)}</a>' for sid, label in SECTIONS)
    return f'<nav class="sections">{links}</nav>'


# ------------------------------------------------------------------ sections

def _summary(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    from cuvil_pgc._version import __version__

    return sec.summary_section(analysis, __version__)


def _hot(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    return sec.hot_regions_section(analysis)


def _operators(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    from cuvil_pgc.viewer._ops_section import operators_section

    return operators_section(analysis)


def _gpu(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    from cuvil_pgc.viewer._gpu_section import gpu_section

    return gpu_section(analysis)


def _timeline(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    util = figs.utilization_series(analysis.timeline.counters or {})
    counts = (analysis.trace or {}).get("counts") or {}
    gpu_run = bool(counts.get("kernel") or (analysis.trace or {}).get("devices"))
    kind = "SM" if (util and util[0][0].startswith("sm_util")) or (gpu_run and not util) else "CPU"
    title = f"Region timeline and {kind} utilization"
    if "timeline" not in figures:
        return sec.section("timeline", title, sec.note("No region calls or utilization samples to draw."))
    notes = []
    if not util:
        notes.append(f"No {kind} utilization samples in this trace (profile with sample_hz > 0"
                     + (" and the gpu extra for NVML)." if kind == "SM" else ")."))
    elif gpu_run and kind == "CPU":
        notes.append("No SM utilization samples in this GPU run (NVML unavailable?): CPU utilization is shown.")
    dropped = (analysis.trace or {}).get("timeline_spans_dropped") or 0
    if dropped:
        notes.append(f"{dropped:,} shortest region calls are not drawn (the longest are kept; all calls are in the statistics).")
    intro = sec.note("Zoom or pan either panel: both share the time axis. Colours are the regions' bottleneck classes.")
    return sec.section("timeline", title, intro + "".join(sec.note(n) for n in notes) + sec.plot("timeline"))


def _compile(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    samplers = (analysis.trace or {}).get("samplers") or {}
    return runs.compile_section(analysis.compile or {}, samplers, "compile" in figures)


def _histograms(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    title = "Latency histograms of the top regions"
    if "histograms" not in figures:
        return sec.section("histograms", title, sec.note("No region call latencies recorded."))
    busy = ((analysis.trace or {}).get("contention") or {}).get("contended_fraction") or 0.0
    warn = sec.note(f"Other processes saturated the CPU in {busy:.0%} of this run's utilisation samples: "
                    "a second mode or a long tail here can be time spent waiting for the CPU, not the "
                    "program's own latency.", warn=True) if busy >= 0.2 else ""
    return sec.section("histograms", title, warn + sec.plot("histograms"))


def _roofline(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    title = "Roofline"
    if "roofline" not in figures:
        return sec.section("roofline", title, sec.note("No machine roofs and no region with known FLOPs and bytes."))
    from cuvil_pgc.analyze.roofline import roofline_data

    data = roofline_data(analysis)
    intro = ("Achieved FLOP/s against arithmetic intensity; lines are the machine model's roofs "
             "(bandwidth slope, then the peak per dtype). Marker size: region total time.")
    extra = [] if data["regions"] else ["No region has both FLOPs and bytes known: record operators with "
                                        "shapes (profile with ops=True, record_shapes=True) to place regions here."]
    if any(r.get("source") == "fallback" for r in data["roofs"]):
        extra.append("Roofs are uncalibrated fallback figures: run `cuvil-pgc calibrate` for measured ones.")
    return sec.section("roofline", title, sec.note(intro) + "".join(sec.note(e, warn=True) for e in extra)
                       + sec.plot("roofline"))


def _fusion(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    return sec.fusion_section(analysis)


def _ranks(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    return sec.ranks_section(analysis.ranks or {}, "ranks" in figures)


def _plan(analysis: Analysis, plan: Plan | None, build: Any, figures: dict[str, Any]) -> str:
    return runs.plan_section(plan, build, "plan" in figures)


SECTION_RENDERERS: list[Callable[[Any, Any, Any, dict[str, Any]], str]] = [
    _summary, _hot, _gpu, _operators, _timeline, _compile, _histograms, _roofline, _fusion, _ranks, _plan]


# ------------------------------------------------------------------ writing

def write_report(analysis: Analysis, path: str | os.PathLike[str], **options: Any) -> Path:
    """Render and write the report atomically (a reader never sees half a file); returns the path.

    ``options`` are those of :func:`render_html`.
    """
    target = Path(path)
    document = render_html(analysis, **options)
    directory = target.parent if str(target.parent) else Path(".")
    if not directory.is_dir():
        raise ConfigError(f"cannot write the report: folder {directory} does not exist", path=target,
                          fix="create the folder or pick another -o path")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    except OSError as exc:
        raise ConfigError(f"cannot write the report ({exc.strerror})", path=target,
                          fix="pick a folder you can write to with -o") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(document)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise ConfigError(f"cannot write the report ({exc.strerror or exc})", path=target,
                          fix="check the free space and that -o names a file, not a folder") from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target
