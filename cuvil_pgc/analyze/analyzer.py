"""``analyze(trace, machine=None, filter=None) -> Analysis``: the analyzer's orchestration.

The analysis is the editable list ``PASSES`` of plain functions ``pass_(prep, analysis) -> None``
run in order over one :class:`~cuvil_pgc.analyze._prepare.Prepared` view of the trace (built once,
vectorised with numpy). Each pass fills its part of the :class:`Analysis`; a pass that reads what
others write declares them (:func:`~cuvil_pgc.analyze.passes.requires`), and ``analyze`` runs
them first when ``passes=`` names a subset, so each pass can run alone. Inputs: a Trace, a path,
or a list of either (merged, each source keeping its rank and weight). The machine models are
those of the machine that recorded the trace (:mod:`~cuvil_pgc.analyze.trace_machines`): the given
one, the GPU the trace names, this machine's calibration for a trace recorded here, else the
documented fallback, in which case ``analysis.trace["warnings"]`` says so.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from cuvil_pgc.analyze._prepare import Prepared, prepare
from cuvil_pgc.analyze._roofs import roofs_of
from cuvil_pgc.analyze.analysis import Analysis
from cuvil_pgc.analyze.bottleneck import attribute_bottlenecks
from cuvil_pgc.analyze.compile_summary import summarize_compile
from cuvil_pgc.analyze.contention import contention_pass
from cuvil_pgc.analyze.fusion import mine_fusion
from cuvil_pgc.analyze.gpu_figures import gpu_figures
from cuvil_pgc.analyze.hot_regions import region_stats
from cuvil_pgc.analyze.hotness import score_hotness
from cuvil_pgc.analyze.operators import operator_table
from cuvil_pgc.analyze.passes import Pass, requires, with_prerequisites
from cuvil_pgc.analyze.ranks import rank_skew
from cuvil_pgc.analyze.timeline import build_timeline
from cuvil_pgc.analyze.trace_machines import trace_machines
from cuvil_pgc.errors import AnalysisError, ConfigError
from cuvil_pgc.trace.columns import Trace
from cuvil_pgc.trace.merge import merge_traces
from cuvil_pgc.trace.schema import STATUS_FAILED, Kind

TraceInput = Trace | str | os.PathLike | Sequence[Trace | str | os.PathLike]


@requires()
def trace_facts(prep: Prepared, analysis: Analysis) -> None:
    """Pass: what the trace is (sources, duration, event counts, drops, samplers, devices)."""
    trace = prep.trace
    kinds = np.bincount(trace.events["kind"], minlength=len(Kind))
    dropped: dict[str, float] = {}
    for s in trace.sources:
        for k, v in (s.metadata.get("dropped") or {}).items() if isinstance(s.metadata, dict) else ():
            if isinstance(v, (int, float)):
                dropped[k] = dropped.get(k, 0) + v
    meta = trace.metadata if isinstance(trace.metadata, dict) else {}
    analysis.trace.update({
        "sources": [{"path": s.path, "format": s.format, "rank": s.rank, "weight": s.weight,
                     "recovered": s.recovered, "notes": list(s.notes)} for s in trace.sources],
        "duration_us": float(trace.duration_us),
        "events": int(len(trace)),
        "counts": {k.name.lower(): int(kinds[k]) for k in Kind},
        "top_level_ops": int(len(prep.op_rows)),
        "dropped": dropped,
        "samplers": meta.get("samplers", {}),
        "devices": meta.get("devices", []),
        "filter": prep.extras.get("filter"),
    })
    warnings = analysis.trace.setdefault("warnings", [])
    for s in trace.sources:          # events the reader could not analyse, with their counts
        warnings.extend(f"{os.path.basename(s.path)}: {w}" for w in s.warnings)


@requires()
def compile_summary(prep: Prepared, analysis: Analysis) -> None:
    """Pass: ``analysis.compile``, the torch.compile summary (:mod:`.compile_summary`)."""
    analysis.compile = summarize_compile(prep.trace)


@requires(attribute_bottlenecks)  # regions, and the evidence it adds to
def region_identity(prep: Prepared, analysis: Analysis) -> None:
    """Pass: the module class and structural hash instrument_module recorded on a region go into its
    evidence (``module``, ``structure``), so the recompiler can tell a stale profile region."""
    rows = prep.region_rows
    if not len(rows):
        return
    pos = prep.path_pos[rows]
    order = np.argsort(pos, kind="stable")
    first = np.searchsorted(pos[order], np.arange(prep.n_paths))
    by_path = {r.path: r for r in analysis.regions}
    for i, path in enumerate(prep.paths):
        if first[i] >= len(order) or pos[order[first[i]]] != i or path not in by_path:
            continue
        args = prep.trace.args.get(int(rows[order[first[i]]])) or {}
        for key in ("module", "structure"):
            if isinstance(args.get(key), str):
                by_path[path].evidence.setdefault(key, args[key])


PASSES: list[Pass] = [trace_facts, region_stats, attribute_bottlenecks, score_hotness, region_identity, mine_fusion,
                      rank_skew, build_timeline, compile_summary, gpu_figures, operator_table, contention_pass]


def analyze(trace: TraceInput, machine: Any = None, filter: str | None = None,
            passes: Sequence[Pass] | None = None) -> Analysis:
    """Analyse one or several traces.

    Args:
        trace: a Trace, a trace file path, or a list of them (merged with their source weights).
        machine: a MachineModel; default: ``default_machine`` for the trace's devices.
        filter: a regular expression; only region paths it matches (``re.search``) are analysed.
        passes: replaces ``PASSES`` (advanced use); what they require runs first.
    Returns: the Analysis, regions sorted by hotness.
    """
    merged = as_trace(trace)
    if any(s.format == "summary" for s in merged.sources):
        return _analyze_summaries(merged, filter)
    check_usable(merged)
    models, warnings = trace_machines(merged, machine)
    prep = prepare(merged, roofs_of(*models), _compiled_filter(filter))
    prep.extras["filter"] = filter
    if filter is not None and not prep.paths:
        raise AnalysisError(f"no region path matches --filter {filter!r}",
                            fix=f"region paths in this trace include: {_some_paths(merged)}")
    analysis = Analysis(regions=[], machine=_machine_json(models),
                        trace={"warnings": warnings})
    for p in with_prerequisites(PASSES if passes is None else passes):
        p(prep, analysis)
    return analysis


def _analyze_summaries(trace: Trace, filter: str | None) -> Analysis:
    from cuvil_pgc.analyze.summary import analyze_summary, is_summary

    if not is_summary(trace):
        raise AnalysisError("aggregate summaries and event traces cannot be analysed together",
                            fix="analyse the .summary.json files and the .trace.json files separately")
    return analyze_summary(trace, _compiled_filter(filter))


def as_trace(trace: TraceInput) -> Trace:
    """One Trace of a Trace, a path, or a list of either (files read in one ``load_trace``, then merged)."""
    items = [trace] if isinstance(trace, (Trace, str, os.PathLike)) else list(trace)
    if not items:
        raise AnalysisError("no trace given", fix="pass a Trace or a trace file path")
    paths = [t for t in items if not isinstance(t, Trace)]
    loaded = [t for t in items if isinstance(t, Trace)]
    if paths:                          # one read: the reader aligns files on wall-clock time
        from cuvil_pgc.trace.reader import load_trace

        loaded.append(load_trace(*paths))
    return merge_traces(loaded)


def check_usable(trace: Trace) -> None:
    """Raise AnalysisError when the trace has no regions, operators or kernels to analyse."""
    kind = trace.events["kind"]
    useful = np.isin(kind, (Kind.REGION, Kind.CPU_OP, Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET))
    if not useful.any():
        paths = ", ".join(s.path for s in trace.sources) or "<trace>"
        if trace.sources and all(s.format == "kineto" for s in trace.sources):
            raise AnalysisError(
                f"{paths}: the trace has no regions, operators or kernels to analyse (it holds {_held(trace)})",
                fix="profile with activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] and let the "
                    "schedule's active steps cover the work (call prof.step() each iteration), then export again")
        failed = [f"{name}: {status.get('reason', 'failed')}" for s in trace.sources if isinstance(s.metadata, dict)
                  for name, status in (s.metadata.get("samplers") or {}).items()
                  if isinstance(status, dict) and status.get("status") == STATUS_FAILED]
        raise AnalysisError(f"{paths}: the trace has no regions, operators or kernels to analyse"
                            + (f" (samplers that failed while recording: {'; '.join(failed)})" if failed else ""),
                            fix="record with ProfileRegion around your code and/or ops=True "
                                "(cuvil-pgc profile --ops), or pass a torch.profiler trace")


def _held(trace: Trace) -> str:
    """What a trace without analysable rows does hold: rows by kind, and what the reader set aside."""
    kinds, counts = np.unique(trace.events["kind"], return_counts=True)
    held = [f"{int(n):,} {Kind(int(k)).name.lower()} event{'s' if n > 1 else ''}" for k, n in zip(kinds, counts, strict=True)]
    held += [w for s in trace.sources for w in s.warnings]
    return "; ".join(held) or "no events"


def _some_paths(trace: Trace, limit: int = 8) -> str:
    ids = np.unique(trace.events["region"][trace.events["kind"] == Kind.REGION])
    names = sorted(trace.strings[int(i)] for i in ids if i >= 0)
    return ", ".join(names[:limit]) + (", ..." if len(names) > limit else "") if names else "(none)"


def _compiled_filter(pattern: str | None) -> str | None:
    if pattern is None:
        return None
    import re

    try:
        re.compile(pattern)
    except re.error as exc:
        raise ConfigError(f"--filter {pattern!r} is not a valid regular expression ({exc})",
                          fix="quote it and escape special characters, e.g. 'decoder\\.layer'") from None
    return pattern


def _machine_json(models: tuple[Any, Any]) -> dict[str, Any]:
    cpu, gpu = models
    doc = {"cpu": cpu.to_json()}
    if gpu is not None:
        doc["cuda"] = gpu.to_json()
    return doc
