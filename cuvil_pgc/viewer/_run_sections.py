"""Markup of the compile and recompile-plan sections (their figures come from ``figures``).

Input shapes: ``analysis.compile`` as ``analyze.compile_summary`` writes it, and a plan.json
:class:`~cuvil_pgc.recompile.plan_doc.Plan` with optional build facts. The analysis is read
defensively (a key that is missing shows as "-", never as an error); the plan is typed, its
reader already gave missing or mistyped fields their defaults.
"""

from __future__ import annotations

from typing import Any

from cuvil_pgc.recompile.plan_doc import Plan, PlanRegion, region_speedup
from cuvil_pgc.trace.schema import display_path
from cuvil_pgc.viewer._sections import (
    MAX_LIST_ITEMS,
    MAX_TABLE_ROWS,
    badge,
    cell,
    facts,
    note,
    path_text,
    plot,
    section,
    table,
)
from cuvil_pgc.viewer.formats import clip, fastest_first, fmt_ms
from cuvil_pgc.viewer.template import text

NO_COMPILE = "No torch.compile activity recorded in this trace."


# ------------------------------------------------------------------ compile

def compile_section(compile_doc: dict[str, Any], samplers: dict[str, Any], has_figure: bool) -> str:
    graphs = compile_doc.get("graphs") or []
    if not graphs and not has_figure:
        status = samplers.get("compile") if isinstance(samplers.get("compile"), dict) else {}
        why = status.get("reason") or ""
        extra = f" (compile sampler: {status.get('status')}{': ' + why if why else ''})" if status else ""
        return section("compile", "Compile timeline", note(NO_COMPILE + extra))
    body = facts(_compile_totals(compile_doc.get("totals") or {}))
    phases = compile_doc.get("phases") or {}
    if phases:
        body += "<p>" + text("Phases (self time, all graphs): " + ", ".join(
            f"{p} {fmt_ms(ms)}" for p, ms in list(phases.items())[:12])) + "</p>"
    body += plot("compile") if has_figure else note("No timed compile phases to draw.")
    if graphs:
        body += "<h3>Graphs</h3>" + _graph_table(graphs)
    return section("compile", "Compile timeline", body)


def _compile_totals(t: dict[str, Any]) -> list[tuple[str, str]]:
    def rate(x: Any) -> str:
        return "-" if not isinstance(x, (int, float)) else f"{x:.0%}"

    return [("Compile time", text(fmt_ms(t.get("compile_ms")))),
            ("Compiled code ran", text(fmt_ms(t.get("run_ms")))),
            ("Compiles / graphs", text(f"{t.get('compiles', '-')} / {t.get('graphs', '-')}")),
            ("Recompiles", text(t.get("recompiles", "-"))),
            ("Graph breaks", text(t.get("graph_breaks", "-"))),
            ("FX graph cache", text(f"hit rate {rate(t.get('cache_hit_rate'))} {clip(t.get('fx_cache') or {})}")),
            ("AOTAutograd cache", text(f"hit rate {rate(t.get('aot_cache_hit_rate'))} {clip(t.get('aot_cache') or {})}")),
            ("Outside any graph", text(fmt_ms(t.get("unattributed_ms"))))]


def _graph_table(graphs: list[dict[str, Any]]) -> str:
    rows = []
    several = len({g.get("process") for g in graphs}) > 1
    for g in graphs[:MAX_TABLE_ROWS]:
        graph = f"{g.get('compile_id')}" + (f" (source {g.get('process')})" if several else "")
        where = f"{g.get('frame') or '?'}" + (f" ({g.get('file')}:{g.get('line')})" if g.get("file") else "")
        if g.get("caller"):
            where += f", called from {g['caller']}"
        ran = "-" if g.get("run_ms") is None else f"{fmt_ms(g.get('run_ms'))} in {g.get('run_calls', 0)} calls"
        phases = ", ".join(f"{p} {fmt_ms(ms)}" for p, ms in list((g.get("phases") or {}).items())[:4])
        cache = g.get("cache") or {}
        rows.append("<tr>" + cell(text(graph), graph) + cell(path_text(where), where)
                    + cell(text(fmt_ms(g.get("start_ms"))), g.get("start_ms"), True)
                    + cell(text(fmt_ms(g.get("total_ms"))), g.get("total_ms"), True)
                    + cell(text(fmt_ms(g.get("worker_ms"))), g.get("worker_ms") or 0.0, True) + cell(text(phases))
                    + cell(text(ran), g.get("run_ms") or 0.0, True)
                    + cell(text(f"fx {cache.get('fx') or '-'}, aot {cache.get('aot') or '-'}"))
                    + cell(_reasons(g.get("cache_misses"))) + cell(_reasons(g.get("recompiles")))
                    + cell(_breaks(g.get("graph_breaks"))) + cell(text(g.get("fail_reason") or "")) + "</tr>")
    return table(["graph", "frame", "start", "total", "worker threads", "top phases", "compiled code ran", "cache",
                  "cache misses", "recompiles", "graph breaks", "failure"], rows, table_id="compile-table",
                 sortable=True, num_cols=(2, 3, 4, 6))


def _reasons(items: Any) -> str:
    items = [str(x) for x in (items or [])]
    if not items:
        return "-"
    lis = "".join(f"<li>{text(clip(x, 400))}</li>" for x in items[:MAX_LIST_ITEMS])
    return f"<ul>{lis}</ul>" + (text(f"… {len(items) - MAX_LIST_ITEMS} more") if len(items) > MAX_LIST_ITEMS else "")


def _breaks(items: Any) -> str:
    out = []
    for b in items or []:
        b = b if isinstance(b, dict) else {"reason": b}
        out.append(f"{b.get('reason') or '?'}" + (f" at {b['location']}" if b.get("location") else ""))
    return _reasons(out)


# ------------------------------------------------------------------ recompile plan

def plan_section(plan: Plan | None, build: dict[str, Any] | None, has_figure: bool) -> str:
    title = "Recompile plan"
    if plan is None:
        return section("plan", title, note("No recompile plan: pass --build BUILD (a .cuvilpkg or store://NAME) "
                                           "to show what `cuvil-pgc recompile` chose for each region."))
    body = facts(_plan_facts(plan, build or {}))
    body += plot("plan") if has_figure else note("No region has both a baseline and a predicted or measured time.")
    body += _plan_table(plan.regions) if plan.regions else note("The plan lists no regions.")
    if plan.runtime_defaults:
        body += "<h3>Runtimes at their defaults (whole model, measured as baselines)</h3>" + _reasons(
            [f"{d.get('config')}: " + (f"{fmt_ms(d.get('measured_ms'))}" if d.get("status") == "ok" else
                                       f"{d.get('status')} {d.get('reason') or ''}") for d in plan.runtime_defaults])
    if len(plan.final_medians_ms) > 2:       # more than eager and the plan
        body += ("<h3>The final race: plans side by side in the searching process (a region's measured time "
                 "comes from here, its alternatives' from the search)</h3>"
                 + _reasons([f"{name}: {fmt_ms(v)}" for name, v in fastest_first(plan.final_medians_ms)]))
    if plan.deployed_medians_ms:
        body += "<h3>Whole-model plans raced in processes of their own (this race chose the plan)</h3>" + _reasons(
            [f"{name}: {fmt_ms(v)}" for name, v in plan.deployed_medians_ms.items()])
    if plan.unloadable:
        body += "<h3>Plans that won a race but did not ship (a fresh process could not load and run them)</h3>" \
            + _reasons([f"{name}: {why}" for name, why in plan.unloadable.items()])
    if plan.stale:
        body += "<h3>Stale regions (changed since the build; skipped at load)</h3>" + _reasons(
            [f"{s.get('path')}: {s.get('reason')}" for s in plan.stale])
    if plan.unmatched:
        body += "<h3>Profiled regions not matched to a module</h3>" + _reasons(plan.unmatched)
    return section("plan", title, body)


def _plan_facts(plan: Plan, build: dict[str, Any]) -> list[tuple[str, str]]:
    pairs = []
    if build:
        signed = "signed, signature verified" if build.get("signature_verified") else (
            "signed (no key given: integrity checked only)" if build.get("signed") else "unsigned (integrity checked)")
        pairs += [("Build", path_text(build.get("path"))),
                  ("Name / version", text(f"{build.get('name', '-')} v{build.get('version', '-')}, "
                                          f"created {build.get('created', '-')}")),
                  ("Signature", text(signed))]
    speed = plan.speedup_vs_eager
    pairs += [("Device", text(plan.device)),
              ("Whole model", text(f"eager {fmt_ms(plan.baseline_ms)} → plan {fmt_ms(plan.plan_ms)}"
                                   + (f", speedup {speed:.2f}×" if speed is not None else ""))),
              ("Search", text(f"{plan.measured_candidates} candidates measured of a space of "
                              f"{plan.space_size}, {plan.reused_records} reused records"
                              + (f"; stopped: {plan.stopped}" if plan.stopped else ""))),
              ("Accuracy tolerances", text(_tolerances(plan.tolerances)))]
    return pairs


def _tolerances(tol: dict[str, Any]) -> str:
    """The accuracy guard's tolerances; when not given, the per-dtype defaults the guard used."""
    from cuvil_pgc.recompile.accuracy import DEFAULT_TOLERANCES

    if tol.get("rtol") is not None or tol.get("atol") is not None:
        return f"rtol {_or_dash(tol.get('rtol'))}, atol {_or_dash(tol.get('atol'))}"
    defaults = "; ".join(f"{dtype} rtol {r:g}, atol {a:g}" for dtype, (r, a) in DEFAULT_TOLERANCES.items())
    return f"defaults per output dtype ({defaults})"


def _or_dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _plan_table(regions: list[PlanRegion]) -> str:
    rows = []
    for r in regions[:MAX_TABLE_ROWS]:
        pred, meas = region_speedup(r, "predicted_ms"), region_speedup(r, "measured_ms")
        times = (r.baseline_ms, r.predicted_ms, r.measured_ms)
        rows.append("<tr>" + cell(path_text(display_path(r.path or r.scope or "-")), r.path)
                    + cell(text(r.chosen or "-"), r.chosen) + cell(badge(r.bottleneck), r.bottleneck)
                    + "".join(cell(text(fmt_ms(t)), t if t is not None else -1, True) for t in times)
                    + cell("-" if pred is None else f"{pred:.2f}×", pred if pred is not None else -1, True)
                    + cell("-" if meas is None else f"{meas:.2f}×", meas if meas is not None else -1, True)
                    + cell(_alternatives(r.alternatives, r), r.tried_counts()[0]) + "</tr>")
    return table(["region", "chosen", "bottleneck", "eager", "predicted", "measured", "predicted speedup",
                  "measured speedup", "tried / rejected"], rows, table_id="plan-table", sortable=True,
                 num_cols=(3, 4, 5, 6, 7))


#: the most characters of one alternative's reason the report shows: an export failure leads with the
#: cause cuvil-pgc names (a quantized module's note is about 230 characters) before the exporter's own
REASON_CHARS = 500


def _alternatives(alts: list[dict[str, Any]], region: PlanRegion) -> str:
    """``measured / rejected`` as the CLI counts them, with every alternative in a details list."""
    if not alts:
        return "-"
    tried, rejected = region.tried_counts()
    items = []
    for a in alts[:MAX_LIST_ITEMS]:
        line = (f"{a.get('config', '?')}: {a.get('status', '?')}, predicted {fmt_ms(a.get('predicted_ms'))}, "
                f"measured {fmt_ms(a.get('measured_ms'))}" + (f" — {clip(a['reason'], REASON_CHARS)}" if a.get("reason") else ""))
        items.append(f"<li>{text(line)}</li>")
    more = f"<li>{text(f'… {len(alts) - MAX_LIST_ITEMS} more')}</li>" if len(alts) > MAX_LIST_ITEMS else ""
    summary = f"{tried} / {rejected}" + (f" ({len(alts)} considered)" if len(alts) != tried else "")
    return f"<details><summary>{text(summary)}</summary><ul>{''.join(items)}{more}</ul></details>"
