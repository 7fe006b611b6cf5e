"""plan.json: the human- and machine-readable record of what the search chose and why.

Shape (``format`` 1)::

    {"format": 1, "device", "machine", "model_hash", "tolerances": {"rtol", "atol"},
     "choices": [{"scope", "candidate": {...}, "config", "structure", "weights", "input_signature",
                  "input_spec", "artifact": member name | null,
                  "runtime": {"name", "version", "gpu" (TensorRT), "outputs"} (runtime backends only)}],
     "regions": [{"path", "scope", "chosen", "bottleneck", "evidence", "predicted_ms", "measured_ms",
                  "baseline_ms", "alternatives": [{"config", "scope", "predicted_ms", "measured_ms",
                  "status", "reason", "reused_record"}]}],
     "stale": [{"path", "reason"}], "unmatched": [...],
     "measured_candidates", "reused_records", "space_size", "baseline_ms", "plan_ms", "speedup_vs_eager"}

``regions`` has one entry per searched scope (the whole model first); "chosen" says what runs
there, including ``merged into <model>: CONFIG`` when the whole model is one compile boundary.
The whole model's ``measured_ms`` and ``baseline_ms`` come from the final interleaved race (the
same figures as ``plan_ms`` and ``baseline_ms``), so its speedup is one race's; a region's come
from the search batch that measured it.
"""

from __future__ import annotations

import math
from typing import Any

from cuvil_pgc.recompile.candidates import RUNTIME_BACKENDS, Candidate

PLAN_FORMAT = 1
PLAN_MEMBER = "plan.json"      # the plan's name inside a build


def _ms(us: float | None) -> float | None:
    return None if us is None or (isinstance(us, float) and math.isnan(us)) else round(us / 1e3, 6)


def plan_document(result: Any, *, device: str, model_hash: str, rtol: float | None, atol: float | None,
                  artifacts: dict[str, str]) -> dict[str, Any]:
    choices = [{"scope": scope, "candidate": cand.to_json(), "config": cand.config,
                "structure": result.structures[scope], "weights": result.weights.get(scope),
                "input_signature": result.scope_inputs[scope].signature,
                "input_spec": result.scope_inputs[scope].spec,
                "artifact": artifacts.get(scope), **_runtime(result, scope, cand)}
               for scope, cand in sorted(result.choices.items())]
    return {
        "format": PLAN_FORMAT, "device": device, "machine": result.machine, "model_hash": model_hash,
        "tolerances": {"rtol": rtol, "atol": atol}, "choices": choices,
        "regions": [_region(result, scope) for scope in result.features],
        "stale": [{"path": s.path, "reason": s.reason} for s in result.matches.stale],
        "unmatched": list(result.matches.unmatched),
        "measured_candidates": result.measured, "reused_records": result.reused, "space_size": result.space_size,
        "baseline_ms": _ms(result.baseline_us), "plan_ms": _ms(result.plan_us),
        "speedup_vs_eager": round(result.speedup, 4) if not math.isnan(result.speedup) else None,
        "final_medians_ms": {k: _ms(v) for k, v in result.final_medians_us.items()},
    }


def _runtime(result: Any, scope: str, cand: Candidate) -> dict[str, Any]:
    """``{"runtime": {...}}`` for a region exported to a runtime (see
    :func:`~.runtime_build.runtime_info`), else nothing."""
    if cand.backend not in RUNTIME_BACKENDS or scope not in result.realized:
        return {}
    from cuvil_pgc.recompile.runtime_build import runtime_info

    return {"runtime": runtime_info(cand.backend, result.realized[scope])}


def _region(result: Any, scope: str) -> dict[str, Any]:
    feats = result.features[scope]
    trials = [t for t in result.trials.values() if t.candidate.scope == scope]
    chosen_cand = result.choices.get(scope)
    root = result.choices.get("")
    if chosen_cand is not None:
        chosen = chosen_cand.config
    elif root is not None and scope:
        chosen = f"merged into <model>: {root.config}"
    else:
        chosen = "eager"
    chosen_trial = next((t for t in trials if chosen_cand is not None and t.candidate == chosen_cand), None)
    eager = Candidate(scope)
    eager_trial = next((t for t in trials if t.candidate == eager), None)
    measured_us = chosen_trial.measured_us if chosen_trial else None
    baseline_us = eager_trial.measured_us if eager_trial and eager_trial.measured_us else feats.eager_us
    if not scope and result.final_medians_us:   # the whole model: both sides of the final race
        measured_us, baseline_us = result.plan_us, result.baseline_us
    return {
        "path": feats.path or (scope or "<model>"), "scope": scope or "<model>", "chosen": chosen,
        "bottleneck": feats.bottleneck, "labels": feats.labels, "evidence": _evidence(feats),
        "predicted_ms": _ms(chosen_trial.predicted_us) if chosen_trial else None,
        "measured_ms": _ms(measured_us), "baseline_ms": _ms(baseline_us),
        "alternatives": [t.to_json() for t in sorted(trials, key=_trial_order) if t.candidate != chosen_cand],
    }


def _trial_order(t: Any) -> tuple[int, float]:
    return ({"ok": 0, "accuracy_error": 1, "compile_error": 2}.get(t.status, 3),
            t.measured_us if t.measured_us is not None else t.predicted_us)


def _evidence(feats: Any) -> dict[str, Any]:
    return {"ops_per_forward": feats.ops, "pointwise_ops": feats.pointwise_ops, "flops": feats.flops,
            "bytes": feats.bytes, "calls_per_forward": feats.calls, "rewrites": feats.rewrites,
            **{k: v for k, v in feats.evidence.items() if k != "bottleneck_evidence"},
            "profile": feats.evidence.get("bottleneck_evidence", {})}


def region_speedup(region: dict[str, Any], key: str) -> float | None:
    """A plan region's ``baseline_ms`` over its ``key`` (``predicted_ms``, ``measured_ms``); None
    unless both are positive finite numbers."""
    base, t = region.get("baseline_ms"), region.get(key)
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in (base, t))
    return base / t if ok else None


def tried_counts(region: dict[str, Any]) -> tuple[int, int]:
    """(measured, rejected) alternatives of one plan region: the counts the CLI and the report show
    (alternatives ranked out by the budget were not tried)."""
    tried = [a for a in region.get("alternatives") or [] if isinstance(a, dict) and a.get("status") != "not_measured"]
    return len(tried), sum(1 for a in tried if a.get("status") != "ok")


def read_build_plan(source: str, *, store: str | None = None, pubkey: str | None = None,
                    allow_unsigned: bool | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """plan.json of a verified build (a path or ``store://`` reference, opened only through
    :func:`~cuvil_pgc.recompile.trust.open_trusted`) and facts about the build (path, name,
    version, signature), as ``report --build`` shows them."""
    import json

    from cuvil_pgc.errors import BuildError
    from cuvil_pgc.recompile._json_bounds import check_json_bounds
    from cuvil_pgc.recompile.trust import open_trusted

    with open_trusted(source, store=store, pubkey=pubkey, allow_unsigned=allow_unsigned) as vb:
        if PLAN_MEMBER not in vb.members():
            raise BuildError(f"the build has no {PLAN_MEMBER}", path=vb.path,
                             fix="pass a build written by `cuvil-pgc recompile`")
        try:
            data = vb.read_bytes(PLAN_MEMBER)
            check_json_bounds(data, what=PLAN_MEMBER, path=vb.path)    # no RecursionError from deep JSON
            plan = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BuildError(f"{PLAN_MEMBER} is not JSON ({exc})", path=vb.path,
                             fix="rebuild the package with `cuvil-pgc recompile`") from None
        if not isinstance(plan, dict):
            raise BuildError(f"{PLAN_MEMBER} holds a JSON {type(plan).__name__}, not an object", path=vb.path,
                             fix="rebuild the package with `cuvil-pgc recompile`")
        m = vb.manifest
        facts = {"path": vb.path, "name": m.name, "version": m.version, "created": m.created.isoformat(),
                 "signed": vb.signed, "signature_verified": vb.signature_verified}
    return plan, facts
