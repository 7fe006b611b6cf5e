"""Tables of the recompiler's results: the plan (``cuvil-pgc recompile``) and an A/B comparison
(``cuvil-pgc compare``), as TableViews (terminal, CSV, JSON alike) and fitted rich tables."""

from __future__ import annotations

from typing import Any

from cuvil_pgc.recompile.export_error import ExportError, exporter_of_reason
from cuvil_pgc.recompile.plan_doc import Plan, region_speedup
from cuvil_pgc.trace.schema import display_path
from cuvil_pgc.viewer.formats import fastest_first
from cuvil_pgc.viewer.tables import Column, TableView, fmt_speedup, render_view


def plan_view(plan: Plan, path: str | None = None) -> TableView:
    """The plan as a table view: per region, chosen config, predicted vs measured times and speedups."""
    ms = _ms
    columns = [Column("path", "region", display_path, identifier=True),
               Column("bottleneck", "bottleneck", drop=3),
               Column("chosen", "chosen", _chosen, identifier=True, stack_under="path"),
               Column("baseline_ms", "eager ms", ms, "right", drop=4),
               Column("predicted_ms", "pred. ms", ms, "right", drop=5),
               Column("measured_ms", "meas. ms", ms, "right"),
               Column("predicted_speedup", "pred.", fmt_speedup, "right", drop=2),
               Column("measured_speedup", "speedup", fmt_speedup, "right"),
               Column("tried", "tried/rej.", justify="right", drop=1)]
    rows = []
    for r in plan.regions:
        tried, rejected = r.tried_counts()
        rows.append({"path": r.path, "bottleneck": r.bottleneck, "chosen": r.chosen,
                     "baseline_ms": r.baseline_ms, "predicted_ms": r.predicted_ms, "measured_ms": r.measured_ms,
                     "predicted_speedup": region_speedup(r, "predicted_ms"),
                     "measured_speedup": region_speedup(r, "measured_ms"), "tried": f"{tried}/{rejected}"})
    stale = ", ".join(str(s.get("path")) for s in plan.stale) or "none"
    caption = (f"whole model: eager {_ms(plan.baseline_ms)} ms → {_ms(plan.plan_ms)} ms "
               f"({fmt_speedup(plan.speedup_vs_eager)}); measured {plan.measured_candidates} of "
               f"{plan.space_size} candidates, {plan.reused_records} from records"
               + (f" ({plan.stopped})" if plan.stopped else "") + f"; stale regions: {stale}"
               + _runtime_defaults(plan) + _final_race(plan) + _deployed(plan) + _unloadable(plan)
               + _kept_eager(plan))
    return TableView(f"recompile plan{f' → {path}' if path else ''}", columns, rows, caption)


def _final_race(plan: Plan) -> str:
    """``; final race: <model>::cudagraphs 0.16 ms, <model>::aoti 0.18 ms, eager 0.43 ms`` (fastest
    first) where it raced more than eager and the plan: a region's measured time comes from this race, its
    alternatives' from the search's trials, which can rank them otherwise."""
    parts = [f"{name} {_ms(v)} ms" for name, v in fastest_first(plan.final_medians_ms)]
    return f"; final race: {', '.join(parts)}" if len(parts) > 2 else ""


def _deployed(plan: Plan) -> str:
    """``; decided in processes of their own: model 0.19 ms, <model>::ort 0.24 ms`` (fastest first;
    empty without that race): the figures that chose the plan where they differ from the searching
    process's."""
    parts = [f"{name} {_ms(v)} ms" for name, v in fastest_first(plan.deployed_medians_ms)]
    return f"; decided in processes of their own: {', '.join(parts)}" if parts else ""


def _unloadable(plan: Plan) -> str:
    """``; not shipped: <model>::aoti+freezing (a process of its own that loaded it crashed ...)``."""
    parts = [f"{name} ({why})" for name, why in plan.unloadable.items()]
    return f"; not shipped, a fresh process could not load them: {', '.join(parts)}" if parts else ""


#: the most characters of one failure :func:`_kept_eager` shows (the plan and the report keep it whole)
FAILURE_CHARS = 300


def _kept_eager(plan: Plan) -> str:
    """``; kept eager: <model> (torch.export failed: ...; torch.onnx.export failed: ...)``: why a
    region whose plan is eager had no compiled program, one failure per exporter (or build) as its
    candidates record it (the rest of them say "not built: ... showed that"); a user saw ``eager
    1.00x`` and nine rejections with the reasons in plan.json alone. Regions that failed alike (a
    quantized model's every submodule) are named together before their reasons, told once."""
    regions_by_why: dict[str, list[str]] = {}
    for r in plan.regions:
        if r.chosen != "eager":
            continue
        seen: dict[str, str] = {}
        for a in r.alternatives:
            reason = str(a.get("reason") or "")
            if a.get("status") == "compile_error" and reason and not reason.startswith("not built:"):
                seen.setdefault(exporter_of_reason(reason), reason.removeprefix(f"{ExportError.__name__}: "))
        if seen:
            shown, notes = [], set()
            for why in seen.values():
                note = _cause_note(why)          # one cause told for every exporter: told once
                if note and note in notes:
                    why = why.replace(note, "(as above)", 1)
                notes.add(note)
                limit = FAILURE_CHARS + len(note if note in why else "")      # the cause is never cut
                shown.append(why if len(why) <= limit else why[:limit - 3] + "...")
            regions_by_why.setdefault("; ".join(shown), []).append(display_path(r.path))
    parts = [f"{', '.join(paths)} ({why})" for why, paths in regions_by_why.items()]
    return f"; kept eager: {', '.join(parts)}" if parts else ""


def _cause_note(reason: str) -> str:
    """The parenthesis right after ``... failed`` in a failure (the cause cuvil-pgc names before the
    exporter's own message, as :func:`~cuvil_pgc.recompile.export_error.quantized_note`), or ""."""
    start = reason.find(" failed (")
    if start < 0:
        return ""
    depth, i = 0, start + len(" failed ")
    for j in range(i, len(reason)):
        depth += {"(": 1, ")": -1}.get(reason[j], 0)
        if depth == 0:
            return reason[i:j + 1]
    return ""


def _runtime_defaults(plan: Plan) -> str:
    """``; runtimes at defaults: ort 1.2 ms, openvino failed`` (the baselines the search measured)."""
    parts = [f"{d.get('config')} {_ms(d.get('measured_ms'))} ms" if d.get("status") == "ok" else
             f"{d.get('config')} {d.get('status')}" for d in plan.runtime_defaults]
    return f"; runtimes at defaults: {', '.join(parts)}" if parts else ""


def _chosen(value: str) -> str:
    """``merged into <model>: CONFIG`` reads ``merged into <model>`` in the table: the <model> row
    above names CONFIG (JSON and CSV keep the whole value)."""
    merged = "merged into <model>"
    return merged if str(value).startswith(merged + ":") else str(value)


def plan_table(plan: Plan, path: str | None = None, width: int = 80) -> Any:
    """The plan as a rich table fitted to ``width``."""
    return render_view(plan_view(plan, path), width)[0]


def compare_view(result: dict[str, Any]) -> TableView:
    """A compare result as a table view (one row per side)."""
    title = (f"compare: B is {result['verdict']} than A" if result["verdict"] != "same"
             else "compare: no significant difference")
    ms = "{:.4f}".format
    columns = [Column("side", ""), Column("name", "name", identifier=True),
               Column("median_ms", "median ms", ms, "right"),
               Column("ci95_ms", "95% CI ms", lambda ci: f"{ci[0]:.4f} – {ci[1]:.4f}", "right")]
    rows = [{"side": side.upper(), "name": result[side]["name"], "median_ms": result[side]["median_ms"],
             "ci95_ms": tuple(result[side]["ci95_ms"])} for side in ("a", "b")]
    lo, hi = result["speedup_ci95"]
    caption = (f"speedup A/B = {fmt_speedup(result['speedup'])} (95% CI {fmt_speedup(lo)} – {fmt_speedup(hi)}), "
               f"{result['rounds']} interleaved rounds"
               + (f", {result['threads']} torch thread(s)" if result.get("threads") else ""))
    return TableView(title, columns, rows, caption)


def compare_table(result: dict[str, Any]) -> Any:
    """A rich table of a compare result."""
    return render_view(compare_view(result), 80)[0]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"
