"""plan.json: the human- and machine-readable record of what the search chose and why.

:class:`Plan` is the one object search, build, ``load_build``, the viewer and the CLI pass around;
``plan.json`` is its :meth:`Plan.to_json`. Shape (``format`` 2)::

    {"format": 2, "device", "machine", "model_hash", "tolerances": {"rtol", "atol"},
     "choices": [{"scope", "candidate": {...}, "config", "structure", "weights", "settings" (absent in
                  older builds), "input_signature", "input_spec", "artifact": member name | null,
                  "runtime": {"name", "version", "outputs"} (runtime backends only)}],
     "regions": [{"path", "scope", "chosen", "bottleneck", "labels", "evidence", "predicted_ms",
                  "measured_ms", "baseline_ms", "alternatives": [{"config", "scope", "predicted_ms",
                  "measured_ms", "status", "reason", "reused_record"}]}],
     "stale": [{"path", "reason"}], "unmatched": [...],
     "measured_candidates", "reused_records", "space_size", "baseline_ms", "plan_ms", "speedup_vs_eager",
     "final_medians_ms", "deployed_medians_ms",
     "runtime_defaults": [{"config", "measured_ms", "status", "reason"}],
     "unloadable": {plan: why a fresh process could not load and run it} (absent when empty),
     "stopped": why the search stopped before its budget, e.g. its time budget (absent when it did not)}

Format 1 (still read) is the same without ``runtime_defaults``, and its TensorRT choices carry the
engine's GPU and TensorRT version in ``runtime`` (format 2 records them in the manifest, see
:mod:`.manifest`). Format 3 is format 2 with an AOTInductor choice whose package returns the
region's output tensors, ``"runtime": {"name": "aoti", "version", "outputs", "tensor_outputs": true}``
(see :data:`TENSOR_OUTPUTS_FORMAT`); plans without one are still written as format 2. Format 4 is
format 3 with a program for other sizes that checks indices against the call's sizes (see
:data:`SIZE_BOUNDS_FORMAT`); format 5, with a runtime program that checks the indices it computes
(see :data:`PROGRAM_CHECKS_FORMAT`); format 6, for a decoding step, ``"cache_step": {"count", "tensors",
"cache", "constants", "skeleton"}`` (see :data:`CACHE_STEP_FORMAT`); format 7, for one over a
sliding-window cache, with ``"longest"`` in it (see :data:`SLIDING_CACHE_FORMAT`); format 8, for one
whose call holds objects opened into tensors, ``"objects"`` (see :data:`OPENED_INPUTS_FORMAT`); format 9,
for a prefill (the call with the cache still empty), ``"prefill": true`` (see :data:`PREFILL_FORMAT`). Fields this
version does not know, at any level, are kept in ``extra`` and written back by
:meth:`Plan.to_json`: a plan read by an older cuvil-pgc and written again keeps a newer one's
fields (the candidate's own, see :meth:`Candidate.from_json`, too).

``regions`` has one entry per searched scope (the whole model first); "chosen" says what runs
there, including ``merged into <model>: CONFIG`` when the whole model is one compile boundary.
The whole model's ``measured_ms`` and ``baseline_ms`` come from the final interleaved race (the
same figures as ``plan_ms`` and ``baseline_ms``), so its speedup is one race's: the race in
processes of their own where eager ran there too (``deployed_medians_ms`` then holds "eager"; see
``recompile``'s ``model_ref``), else the searching process's (``final_medians_ms``); a region's
come from the search batch that measured it. ``runtime_defaults`` are the whole model on each runtime
backend at its default settings, measured as baselines outside the budget (what a user would
deploy instead of the build). ``deployed_medians_ms`` are the whole-model plans that were raced
again each in processes of their own (:mod:`.standalone`; empty where none was): where they
ran, they chose the plan.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from cuvil_pgc.recompile.candidates import RUNTIME_BACKENDS, Candidate

PLAN_FORMAT = 2
#: the format of a plan with an AOTInductor package returning the region's output tensors (a
#: choice's ``runtime`` {"name": "aoti", "tensor_outputs": true, "outputs"}, see
#: :func:`~.aoti_outputs.aoti_output_template`): a version that reads only format 2 would return that
#: tuple of tensors in place of the region's own structure, so such a plan is format 3, which it
#: refuses; every other plan stays format 2
TENSOR_OUTPUTS_FORMAT = 3
#: the format of a plan whose program for other sizes checks indices against the call's own sizes
#: (a choice's ``other_shapes`` with ``index_bounds``, a graph network's edge list against its nodes,
#: see :class:`~.other_shapes.OtherShapes`): a version that reads only up to format 3 would run that
#: program without the check, where an index past the call's nodes aborts the process or answers with
#: numbers, so such a plan is format 4, which it refuses
SIZE_BOUNDS_FORMAT = 4
#: the format of a plan with a runtime program that checks the indices it computes in one more
#: output (``index_checks`` in a choice's ``runtime`` or ``other_shapes``, see
#: :mod:`.onnx_index_checks`): a version that reads only up to format 4 would hand that output back
#: as one more element of a tuple the region returns, so such a plan is format 5, which it refuses
PROGRAM_CHECKS_FORMAT = 5
#: the format of a plan for a decoding step (``cache_step``, see :mod:`.cache_step`): a version that
#: reads only up to format 5 would apply it to the model's call as it is, whose inputs are not the
#: step's, so such a plan is format 6, which it refuses with "upgrade cuvil-pgc"
CACHE_STEP_FORMAT = 6
#: the format of a plan for a decoding step over a sliding-window cache (``cache_step`` with
#: ``longest``, the longest cache its window keeps whole): a version that reads only up to format 6
#: would never match its cache (it counts the window's tokens as a constant) and run every step on
#: the original module without a word, so such a plan is format 7, which it refuses
SLIDING_CACHE_FORMAT = 7
#: the format of a plan for a decoding step whose call holds objects it opens into tensors
#: (``cache_step`` with ``objects``: an encoder-decoder's encoder outputs): a version that reads only
#: up to format 7 would never match such a call and run every step on the original module without a
#: word, so such a plan is format 8, which it refuses
OPENED_INPUTS_FORMAT = 8
#: the format of a plan for a prefill (``cache_step`` with ``prefill``: the call whose cache is still
#: empty, which the step fills): a version that reads only up to format 8 would refuse its empty
#: cache as a structure it never matches, and run every prefill on the original module without a
#: word, so such a plan is format 9, which it refuses
PREFILL_FORMAT = 9
#: plan.json formats this version reads
READ_FORMATS = (1, 2, 3, 4, 5, 6, 7, 8, 9)
PLAN_MEMBER = "plan.json"      # the plan's name inside a build


class PlanFormatError(ValueError):
    """plan.json is not a plan this version reads (its loaders turn this into a BuildError)."""


def _number(value: Any) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return value if ok else None


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def _texts(value: Any) -> list[str] | None:
    """A list of strings, or None where ``value`` is not one (or is empty)."""
    ok = isinstance(value, list) and value and all(isinstance(v, str) for v in value)
    return list(value) if ok else None


def _text_map(value: Any) -> dict[str, str] | None:
    """A dict of strings to strings, or None where ``value`` is not one (or is empty)."""
    ok = isinstance(value, dict) and value and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
    return dict(value) if ok else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _dict(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def _split(cls: Any, doc: Any, what: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(known fields, the others) of a JSON object decoding into dataclass ``cls``."""
    if not isinstance(doc, dict):
        raise PlanFormatError(f"{what} is a JSON {type(doc).__name__}, not an object")
    names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
    return ({k: v for k, v in doc.items() if k in names},
            {k: v for k, v in doc.items() if k not in names})


def _with_extra(doc: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    return {**{k: v for k, v in extra.items() if k not in doc}, **doc}


@dataclass
class PlanChoice:
    """What runs in one scope of the built model, and what the loader needs to rebuild it."""

    scope: str
    candidate: Candidate
    structure: str = ""                    # structural hash of the scope's module at build time
    weights: str | None = None             # weights digest (artifact backends refuse other weights)
    settings: str | None = None            # settings digest (artifact backends refuse other settings; older builds: None)
    #: the attributes the settings digest leaves out: those the region's forward writes on a call
    #: (None: none; older versions ignore it, and a model whose forward writes them runs eagerly there)
    settings_skip: list[str] | None = None
    #: the settings by attribute name, each a short digest (:func:`~cuvil_pgc._structure.settings_by_name`):
    #: a load whose settings differ names which (None: older builds; older versions ignore it)
    settings_by_name: dict[str, str] | None = None
    input_signature: Any = None
    input_spec: Any = None
    artifact: str | None = None            # the member holding its AOTInductor package / runtime file
    runtime: dict[str, Any] | None = None  # {"name", "version", "outputs"} (runtime backends)
    #: its program for other input sizes, {"artifact": member, "inputs": [[dtype, [size | null, ...]], ...]}
    #: (see .other_shapes; None: other sizes run the original module; older versions ignore it)
    other_shapes: dict[str, Any] | None = None
    #: why a build made for other sizes (``--dynamic``) has no program for them in this scope
    #: (None: made without, or it has one; older versions ignore it)
    other_sizes_refused: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> str:
        return self.candidate.config

    @property
    def label(self) -> str:
        return self.scope or "<model>"

    @property
    def format(self) -> int:
        """The oldest plan.json format that can hold this choice."""
        if (self.runtime or {}).get("index_checks") or (self.other_shapes or {}).get("index_checks"):
            return PROGRAM_CHECKS_FORMAT
        if (self.other_shapes or {}).get("index_bounds"):
            return SIZE_BOUNDS_FORMAT
        return TENSOR_OUTPUTS_FORMAT if (self.runtime or {}).get("tensor_outputs") else PLAN_FORMAT

    def to_json(self) -> dict[str, Any]:
        doc = {"scope": self.scope, "candidate": self.candidate.to_json(),
               "config": self.extra.get("config", self.config),   # a newer version's spelling, kept
               "structure": self.structure, "weights": self.weights, "input_signature": self.input_signature,
               "input_spec": self.input_spec, "artifact": self.artifact}
        if self.settings is not None:
            doc["settings"] = self.settings
        if self.settings_skip:
            doc["settings_skip"] = self.settings_skip
        if self.settings_by_name:
            doc["settings_by_name"] = self.settings_by_name
        if self.runtime is not None:
            doc["runtime"] = self.runtime
        if self.other_shapes is not None:
            doc["other_shapes"] = self.other_shapes
        if self.other_sizes_refused is not None:
            doc["other_sizes_refused"] = self.other_sizes_refused
        return _with_extra(doc, self.extra)

    @classmethod
    def from_json(cls, doc: Any) -> PlanChoice:
        known, extra = _split(cls, doc, "a plan choice")
        if not isinstance(known.get("candidate"), dict):
            raise PlanFormatError(f"the choice for {known.get('scope')!r} has no candidate object")
        try:
            candidate = Candidate.from_json(known["candidate"])
        except (TypeError, ValueError) as exc:    # a field of the wrong type (knobs not pairs ...)
            raise PlanFormatError(f"the choice for {known.get('scope')!r} has a malformed candidate ({exc})") from None
        if extra.get("config") == candidate.config:
            del extra["config"]            # derived from the candidate
        runtime = known.get("runtime")
        return cls(scope=_text(known.get("scope")), candidate=candidate,
                   structure=_text(known.get("structure")), weights=known.get("weights"),
                   settings=known.get("settings") if isinstance(known.get("settings"), str) else None,
                   settings_skip=_texts(known.get("settings_skip")),
                   settings_by_name=_text_map(known.get("settings_by_name")),
                   input_signature=known.get("input_signature"), input_spec=known.get("input_spec"),
                   artifact=known.get("artifact") if isinstance(known.get("artifact"), str) else None,
                   runtime=runtime if isinstance(runtime, dict) else None,
                   other_shapes=known.get("other_shapes") if isinstance(known.get("other_shapes"), dict) else None,
                   other_sizes_refused=known.get("other_sizes_refused")
                   if isinstance(known.get("other_sizes_refused"), str) else None,
                   extra=extra)


@dataclass
class PlanRegion:
    """One searched scope: what was chosen there, the profile's evidence and the alternatives."""

    path: str
    scope: str
    chosen: str
    bottleneck: str = ""
    labels: list[str] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    predicted_ms: float | None = None
    measured_ms: float | None = None
    baseline_ms: float | None = None
    alternatives: list[dict[str, Any]] = field(default_factory=list)   # Trial.to_json documents
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        return _with_extra(doc, self.extra)

    @classmethod
    def from_json(cls, doc: Any) -> PlanRegion:
        known, extra = _split(cls, doc, "a plan region")
        alternatives = [a if isinstance(a, dict) else {"config": _text(a)} for a in _list(known.get("alternatives"))]
        return cls(path=_text(known.get("path")), scope=_text(known.get("scope")), chosen=_text(known.get("chosen")),
                   bottleneck=_text(known.get("bottleneck")), labels=[_text(x) for x in _list(known.get("labels"))],
                   evidence=_dict(known.get("evidence")), predicted_ms=_number(known.get("predicted_ms")),
                   measured_ms=_number(known.get("measured_ms")), baseline_ms=_number(known.get("baseline_ms")),
                   alternatives=alternatives, extra=extra)

    def tried_counts(self) -> tuple[int, int]:
        """(measured, rejected) alternatives: the counts the CLI and the report show
        (alternatives ranked out by the budget were not tried)."""
        tried = [a for a in self.alternatives if a.get("status") != "not_measured"]
        return len(tried), sum(1 for a in tried if a.get("status") != "ok")


@dataclass
class Plan:
    """A build's plan: the choices per scope, the searched regions and the search's figures."""

    device: str = "cpu"
    machine: str = ""
    model_hash: str = ""
    tolerances: dict[str, Any] = field(default_factory=lambda: {"rtol": None, "atol": None})
    choices: list[PlanChoice] = field(default_factory=list)
    regions: list[PlanRegion] = field(default_factory=list)
    stale: list[dict[str, Any]] = field(default_factory=list)      # {"path", "reason"}
    unmatched: list[Any] = field(default_factory=list)
    measured_candidates: int = 0
    reused_records: int = 0
    space_size: int = 0
    baseline_ms: float | None = None
    plan_ms: float | None = None
    speedup_vs_eager: float | None = None
    final_medians_ms: dict[str, float | None] = field(default_factory=dict)
    #: the whole-model plans raced again in processes of their own (empty: no such race)
    deployed_medians_ms: dict[str, float | None] = field(default_factory=dict)
    #: the whole model on each runtime at its defaults, measured as baselines outside the budget
    runtime_defaults: list[dict[str, Any]] = field(default_factory=list)
    #: plans that won a race but did not ship: why a fresh process could not load and run them
    unloadable: dict[str, str] = field(default_factory=dict)
    #: why the search stopped before its budget of measurements ("": it did not; ``recompile --time-budget``)
    stopped: str = ""
    #: a decoding step's layout (:class:`~.cache_step.StepLayout`): the plan is for the model's call
    #: with its cache opened (empty: for the model's call as it is)
    cache_step: dict[str, Any] = field(default_factory=dict)
    format: int = PLAN_FORMAT        # the format it was read in; to_json writes PLAN_FORMAT
    extra: dict[str, Any] = field(default_factory=dict)

    def choice(self, scope: str) -> PlanChoice | None:
        return next((c for c in self.choices if c.scope == scope), None)

    def candidates(self) -> dict[str, Candidate]:
        """scope -> the chosen candidate (what ``recompile(plan=...)`` pins)."""
        return {c.scope: c.candidate for c in self.choices}

    def to_json(self) -> dict[str, Any]:
        doc = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "extra"}
        doc["format"] = max([PLAN_FORMAT, *(c.format for c in self.choices),
                             *([CACHE_STEP_FORMAT] if self.cache_step else []),
                             *([SLIDING_CACHE_FORMAT] if (self.cache_step or {}).get("longest") is not None else []),
                             *([OPENED_INPUTS_FORMAT] if (self.cache_step or {}).get("objects") else []),
                             *([PREFILL_FORMAT] if (self.cache_step or {}).get("prefill") else [])])
        doc["choices"] = [c.to_json() for c in self.choices]
        doc["regions"] = [r.to_json() for r in self.regions]
        for name in ("deployed_medians_ms", "unloadable", "cache_step", "stopped"):    # added within format 2: absent when empty
            if not doc[name]:
                del doc[name]
        return _with_extra(doc, self.extra)

    @classmethod
    def from_json(cls, doc: Any) -> Plan:
        """The plan of a plan.json document of any format in :data:`READ_FORMATS`; missing fields
        take their defaults, fields of the wrong type are dropped, unknown ones go to ``extra``.
        Raises :class:`PlanFormatError` for another format or a malformed choice."""
        known, extra = _split(cls, doc, "plan.json")
        fmt = known.get("format", 1)
        if fmt not in READ_FORMATS or isinstance(fmt, bool):
            raise PlanFormatError(f"plan.json has format {fmt!r}; this cuvil-pgc reads formats "
                                  f"{', '.join(map(str, READ_FORMATS))}")
        if "choices" in known and not isinstance(known["choices"], list):
            raise PlanFormatError("plan.json's choices are not a list")
        tolerances = _dict(known.get("tolerances")) or {"rtol": None, "atol": None}
        medians = {_text(k): _number(v) for k, v in _dict(known.get("final_medians_ms")).items()}
        deployed = {_text(k): _number(v) for k, v in _dict(known.get("deployed_medians_ms")).items()}
        return cls(device=_text(known.get("device")) or "cpu", machine=_text(known.get("machine")),
                   model_hash=_text(known.get("model_hash")), tolerances=tolerances,
                   choices=[PlanChoice.from_json(c) for c in _list(known.get("choices"))],
                   regions=[PlanRegion.from_json(r) for r in _list(known.get("regions")) if isinstance(r, dict)],
                   stale=[s if isinstance(s, dict) else {"path": _text(s), "reason": ""}
                          for s in _list(known.get("stale"))],
                   unmatched=_list(known.get("unmatched")), measured_candidates=_count(known.get("measured_candidates")),
                   reused_records=_count(known.get("reused_records")), space_size=_count(known.get("space_size")),
                   baseline_ms=_number(known.get("baseline_ms")), plan_ms=_number(known.get("plan_ms")),
                   speedup_vs_eager=_number(known.get("speedup_vs_eager")), final_medians_ms=medians,
                   deployed_medians_ms=deployed, runtime_defaults=[d for d in _list(known.get("runtime_defaults")) if isinstance(d, dict)],
                   unloadable={_text(k): _text(v) for k, v in _dict(known.get("unloadable")).items()},
                   stopped=_text(known.get("stopped")), cache_step=_dict(known.get("cache_step")), format=fmt,
                   extra=extra)


# ----------------------------------------------------------------------------- from a search

def _ms(us: float | None) -> float | None:
    return None if us is None or (isinstance(us, float) and math.isnan(us)) else round(us / 1e3, 6)


def plan_document(result: Any, *, device: str, model_hash: str, rtol: float | None, atol: float | None,
                  artifacts: dict[str, str], other_shapes: dict[str, dict[str, Any]] | None = None,
                  cache_step: dict[str, Any] | None = None, model: Any = None) -> Plan:
    """The :class:`Plan` of a search result (``artifacts``: scope -> the member its choice names;
    ``other_shapes``: scope -> the record of its runtime program for other input sizes; ``model``:
    the searched model, whose chosen scopes' settings are recorded by name)."""
    from cuvil_pgc._structure import settings_by_name

    def by_name(scope: str) -> dict[str, str] | None:
        if model is None or result.settings.get(scope) is None:
            return None
        return settings_by_name(model.get_submodule(scope) if scope else model, result.settings_skip.get(scope) or ())
    choices = [PlanChoice(scope=scope, candidate=cand, structure=result.structures[scope],
                          weights=result.weights.get(scope), settings=result.settings.get(scope),
                          settings_skip=result.settings_skip.get(scope) or None, settings_by_name=by_name(scope),
                          input_signature=result.scope_inputs[scope].signature,
                          input_spec=result.scope_inputs[scope].spec, artifact=artifacts.get(scope),
                          runtime=_runtime(result, scope, cand), other_shapes=(other_shapes or {}).get(scope),
                          other_sizes_refused=getattr(getattr(result.realized.get(scope), "module", None),
                                                      "other_sizes_refused", None))
               for scope, cand in sorted(result.choices.items())]
    return Plan(
        device=device, machine=result.machine, model_hash=model_hash, tolerances={"rtol": rtol, "atol": atol},
        choices=choices, regions=[_region(result, scope) for scope in result.features],
        stale=[{"path": s.path, "reason": s.reason} for s in result.matches.stale],
        unmatched=list(result.matches.unmatched), measured_candidates=result.measured,
        reused_records=result.reused, space_size=result.space_size,
        baseline_ms=_ms(result.baseline_us), plan_ms=_ms(result.plan_us),
        speedup_vs_eager=round(result.speedup, 4) if not math.isnan(result.speedup) else None,
        final_medians_ms={k: _ms(v) for k, v in result.final_medians_us.items()},
        deployed_medians_ms={k: _ms(v) for k, v in getattr(result, "deployed_medians_us", {}).items()},
        runtime_defaults=[t.to_json() for t in getattr(result, "runtime_defaults", [])],
        unloadable=dict(getattr(result, "unloadable", {})),
        stopped=getattr(result, "stopped", ""),
        cache_step=cache_step or {},
    )


def _runtime(result: Any, scope: str, cand: Candidate) -> dict[str, Any] | None:
    """What a region exported to a runtime records (see :func:`~.runtime_build.runtime_info`), an
    AOTInductor package of the region's output tensors (see :data:`TENSOR_OUTPUTS_FORMAT`), and the
    index bounds an AOTInductor or torch.compile region checks."""
    if scope not in result.realized:
        return None
    from cuvil_pgc.recompile.runtime_build import bounds_record, runtime_info

    if cand.backend in ("aoti", "compile", "cudagraphs"):       # the index checks its region makes
        region = result.realized[scope].module
        template = getattr(getattr(region, "compiled", None), "template", None) if cand.backend == "aoti" else None
        bounds = bounds_record(region)
        if template is None and not bounds:        # torch's own package, which keeps the structure itself
            return None
        import torch

        info = {"name": "aoti" if cand.backend == "aoti" else "torch.compile", "version": torch.__version__, **bounds}
        if template is not None:
            info.update(outputs=template.to_json(), tensor_outputs=True)
        return info
    if cand.backend not in RUNTIME_BACKENDS:
        return None

    return runtime_info(cand.backend, result.realized[scope])


def _region(result: Any, scope: str) -> PlanRegion:
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
    return PlanRegion(
        path=feats.path or (scope or "<model>"), scope=scope or "<model>", chosen=chosen,
        bottleneck=feats.bottleneck, labels=list(feats.labels), evidence=_evidence(feats),
        predicted_ms=_ms(chosen_trial.predicted_us) if chosen_trial else None,
        measured_ms=_ms(measured_us), baseline_ms=_ms(baseline_us),
        alternatives=[t.to_json() for t in sorted(trials, key=_trial_order) if t.candidate != chosen_cand],
    )


def _trial_order(t: Any) -> tuple[int, float]:
    return ({"ok": 0, "accuracy_error": 1, "compile_error": 2}.get(t.status, 3),
            t.measured_us if t.measured_us is not None else t.predicted_us)


def _evidence(feats: Any) -> dict[str, Any]:
    return {"ops_per_forward": feats.ops, "pointwise_ops": feats.pointwise_ops, "flops": feats.flops,
            "bytes": feats.bytes, "calls_per_forward": feats.calls, "rewrites": feats.rewrites,
            **{k: v for k, v in feats.evidence.items() if k != "bottleneck_evidence"},
            "profile": feats.evidence.get("bottleneck_evidence", {})}


def region_speedup(region: PlanRegion, key: str) -> float | None:
    """A plan region's ``baseline_ms`` over its ``key`` (``predicted_ms``, ``measured_ms``); None
    unless both are positive finite numbers."""
    base, t = region.baseline_ms, getattr(region, key)
    ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0 for v in (base, t))
    return base / t if ok else None


def tried_counts(region: PlanRegion) -> tuple[int, int]:
    """(measured, rejected) alternatives of one plan region (see :meth:`PlanRegion.tried_counts`)."""
    return region.tried_counts()


def read_build_plan(source: str, *, store: str | None = None, pubkey: str | None = None,
                    allow_unsigned: bool | None = None) -> tuple[Plan, dict[str, Any]]:
    """The plan of a verified build (a path or ``store://`` reference, opened only through
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
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BuildError(f"{PLAN_MEMBER} is not JSON ({exc})", path=vb.path,
                             fix="rebuild the package with `cuvil-pgc recompile`") from None
        try:
            plan = Plan.from_json(doc)
        except PlanFormatError as exc:
            raise BuildError(f"{PLAN_MEMBER} is not a plan this cuvil-pgc reads ({exc})", path=vb.path,
                             fix="upgrade cuvil-pgc or rebuild the package with `cuvil-pgc recompile`") from None
        m = vb.manifest
        facts = {"path": vb.path, "name": m.name, "version": m.version, "created": m.created.isoformat(),
                 "signed": vb.signed, "signature_verified": vb.signature_verified}
    return plan, facts
