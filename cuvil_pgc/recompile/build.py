"""recompile() → Build → .cuvilpkg (:mod:`.load` reads one back: ``load_build``).

A :class:`Build` holds the optimized module, plan.json (see :mod:`.plan_doc`), the AOTInductor
packages of the regions that chose them, and Inductor cache artifacts
(``torch.compiler.save_cache_artifacts``) so ``torch.compile`` regions load warm. ``Build.save``
writes them with the package helper's :class:`BuildWriter` (manifest with the environment
fingerprint, the model's structural hash and the traces' sha256; optionally signed).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cuvil_pgc._eval_mode import eval_mode
from cuvil_pgc.errors import CuvilError, RecompileError, one_line
from cuvil_pgc.recompile.plan_doc import PLAN_MEMBER

if TYPE_CHECKING:
    from cuvil_pgc.analyze.analysis import Analysis
    from cuvil_pgc.recompile.plan_doc import Plan

log = logging.getLogger(__name__)

CACHE_MEMBER = "inductor_cache.bin"


@dataclass
class Build:
    module: Any
    plan: Plan
    artifacts: dict[str, str]                 # member name -> local file (AOTInductor packages)
    cache_artifacts: bytes | None
    fingerprint: Any
    model_hash: str
    trace_hashes: list[str]
    result: Any = None
    path: str | None = None
    threads: int = 0                          # torch threads the search measured at (0: unknown)
    model_class: str = ""                     # the model's class __qualname__
    model_tree: str = ""                      # digest of its module tree (_structure.module_tree_digest)
    tensorrt: Any = None                      # manifest.EngineTarget of its TensorRT engines (None: none)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def save(self, path: str | os.PathLike[str], *, name: str = "model", version: int = 1,
             signing_key: Any = None) -> str:
        """Write the .cuvilpkg (signed when ``signing_key`` is a key or a key file path)."""
        from cuvil_pgc.recompile.package import BuildWriter

        writer = BuildWriter(path, name, version, fingerprint=self.fingerprint, model_hash=self.model_hash,
                             trace_hashes=self.trace_hashes, threads=self.threads,
                             model_class=self.model_class, model_tree=self.model_tree, tensorrt=self.tensorrt)
        try:
            writer.add_bytes(PLAN_MEMBER, json.dumps(self.plan.to_json(), indent=2, sort_keys=True).encode())
            for member, local in sorted(self.artifacts.items()):
                writer.add_file(member, local)
            if self.cache_artifacts:
                writer.add_bytes(CACHE_MEMBER, self.cache_artifacts)
            writer.close(signing_key)
        except BaseException:
            writer.abort()
            raise
        self.path = os.fspath(path)
        return self.path

    def to_json(self) -> dict[str, Any]:
        """The ``recompile --json`` document (DESIGN.md)."""
        plan = self.plan
        regions = [{k: getattr(r, k) for k in ("path", "chosen", "predicted_ms", "measured_ms", "baseline_ms",
                                               "alternatives", "bottleneck", "scope")} for r in plan.regions]
        return {"build": self.path, "regions": regions, "measured_candidates": plan.measured_candidates,
                "reused_records": plan.reused_records, "space_size": plan.space_size,
                "speedup_vs_eager": plan.speedup_vs_eager, "baseline_ms": plan.baseline_ms,
                "plan_ms": plan.plan_ms, "stale": plan.stale, "runtime_defaults": plan.runtime_defaults,
                "unloadable": plan.unloadable, "final_medians_ms": plan.final_medians_ms,
                "deployed_medians_ms": plan.deployed_medians_ms, "threads": self.threads,
                **({"stopped": plan.stopped} if plan.stopped else {})}


# ----------------------------------------------------------------------------- recompile

def recompile(model: Any, example_inputs: tuple[Any, ...], traces: Any = None, *, analysis: Analysis | None = None,
              budget: int | None = None, exhaustive: bool = False, rtol: float | None = None,
              atol: float | None = None, device: str = "cpu", records: Any = None, machine: Any = None,
              progress: Any = None, rounds: int = 25, backends: tuple[str, ...] | None = None,
              plan: Plan | dict[str, Any] | None = None, calibrate: bool = True, threads: int | None = None,
              deployed_race: bool = True, dynamic: bool = False, model_ref: str | None = None,
              time_budget: float | None = None) -> Build:
    """Search a plan for ``model`` guided by the profile in ``traces`` and build it.

    ``model`` is put in eval mode and moved to ``device`` in place; its weights are shared with the
    returned build's module (AOTInductor packages hold their own copy).

    Args:
        example_inputs: the positional inputs of one call, as a tuple; also one input, or a mapping
            of the forward's parameter names (a tokenizer's output), see :mod:`cuvil_pgc._example_inputs`.
        traces: trace file paths (or an :class:`Analysis` via ``analysis=``).
        budget: most candidates to measure, eager references and records of earlier searches of
            this model included (default: a quarter of the space, at least 2).
        exhaustive: measure every candidate (for comparisons; slow).
        time_budget: seconds from now after which no candidate's build begins (the one being built
            is finished, the runtimes' baselines are measured whatever it says); the plan is chosen
            from what was measured by then, then raced and built as always, which takes longer.
        rtol, atol: accuracy-guard tolerances (default: per dtype, see :mod:`.accuracy`).
        records: a RecordDB, or False to neither read nor write records.
        backends: restrict the plan space to these backends (eager always stays).
        plan: pin a plan instead of searching: ``{scope: Candidate}``, a :class:`~.plan_doc.Plan` or
            a plan.json document (e.g. to rebuild a known plan on a new machine).
        calibrate: measure the backends' fixed costs once per machine into the record database
            (see :mod:`.calibrate`) before the first search there.
        threads: torch intra-op threads to measure at, the deployment's (default: what torch uses
            in this process); recorded in the build, see :mod:`cuvil_pgc._threads`.
        deployed_race: where the final race's winner is a whole-model plan that runs without the
            model's code (one ONNX Runtime, OpenVINO or AOTInductor artifact on the CPU), decide
            between such plans again each in worker processes of their own, as deployed (see
            :mod:`.plan`); False keeps the decision of the searching process.
        model_ref: the ``MODULE:FACTORY`` reference ``model`` and its inputs came from (``recompile
            --model``): that race then runs eager too, on a model the factory makes in a worker of
            its own, and the build's figures (``baseline_ms``, ``plan_ms``) come from it. In the
            searching process every backend's thread pools share the cores: at 2 threads on 2
            cores a GRU tagger's ONNX Runtime plan measured 3.4 ms there and 0.34 ms in processes
            of their own, and the build's speedup over eager read 0.54x; raced as deployed, 4.9x.
        dynamic: also ship each ONNX Runtime, OpenVINO and AOTInductor region (CPU) exported with its input
            sizes left free, for calls at other batch sizes or sequence lengths, where it passes the
            accuracy guard at other sizes (see :mod:`.other_shapes`); without it such calls run
            the original module.
    """
    import torch

    from cuvil_pgc._threads import torch_threads
    from cuvil_pgc.recompile.ort_runner import measuring_in_process
    from cuvil_pgc.recompile.search_policy import TimeBudget

    if time_budget is not None and not time_budget > 0:
        raise RecompileError(f"time_budget={time_budget!r} is not a positive number of seconds")
    spend = TimeBudget(time_budget) if time_budget is not None else None

    # The search draws random inputs and Inductor's autotuning random tensors from torch's global
    # generator: a caller that seeded torch gets the same random numbers after a recompile as before.
    cuda = [torch.cuda.current_device()] if str(device).startswith("cuda") and torch.cuda.is_available() else []
    with torch_threads(threads) as count, torch.random.fork_rng(devices=cuda), measuring_in_process():
        build = _recompile(model, example_inputs, traces, analysis=analysis, budget=budget, exhaustive=exhaustive,
                           rtol=rtol, atol=atol, device=device, records=records, machine=machine,
                           progress=progress, rounds=rounds, backends=backends, plan=plan, calibrate=calibrate,
                           deployed_race=deployed_race, dynamic=dynamic, model_ref=model_ref, time_budget=spend)
    build.threads = count
    return build


def _recompile(model: Any, example_inputs: tuple[Any, ...], traces: Any, *, analysis: Analysis | None, budget: int | None,
               exhaustive: bool, rtol: float | None, atol: float | None, device: str, records: Any,
               machine: Any, progress: Any, rounds: int, backends: tuple[str, ...] | None, plan: Plan | dict[str, Any] | None,
               calibrate: bool, deployed_race: bool, dynamic: bool, model_ref: str | None,
               time_budget: Any) -> Build:
    import torch

    from cuvil_pgc._example_inputs import SizesVary, inputs_hint, number_inputs, positional_inputs
    from cuvil_pgc._structure import module_tree_digest
    from cuvil_pgc.recompile.manifest import current_fingerprint
    from cuvil_pgc.recompile.matching import structural_hash
    from cuvil_pgc.recompile.plan_doc import plan_document
    from cuvil_pgc.recompile.records import RecordDB, machine_key
    from cuvil_pgc.recompile.search import search
    from cuvil_pgc.recompile.trials import SearchOptions

    if not isinstance(model, torch.nn.Module):
        raise RecompileError(f"recompile needs a torch.nn.Module, got {type(model).__name__}")
    given, example_inputs = example_inputs, positional_inputs(model, example_inputs)
    if model.training:
        log.warning("cuvil-pgc: the model is in training mode: the recompile puts it in eval mode, which builds "
                    "compute in (no dropout, batch norm's running statistics); a profile recorded in training "
                    "mode timed work the build does not do: call model.eval() before profiling")
    numbers = number_inputs(model, example_inputs)
    if numbers:
        shown = ", ".join(f"{name}={value!r}" for name, value in numbers)
        log.warning("cuvil-pgc: the example inputs pass %s as a Python number, which the build's programs hold as "
                    "a constant: calls with another value run the original module. Where the forward computes with "
                    "it as with a tensor (t * freqs, logits / temperature), pass it as a 0-d tensor (%s) in the "
                    "example inputs and in the calls, and every value runs the program; a number that sets sizes "
                    "or steers control flow stays a number", shown,
                    ", ".join(f"torch.tensor({value!r})" for _, value in numbers))
    model = eval_mode(model).to(device)
    example_inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in example_inputs)
    from cuvil_pgc._progress import stage
    from cuvil_pgc.recompile.cache_step import around_cache
    from cuvil_pgc.recompile.stateless import check_stateless, holding

    try:
        model, example_inputs, step = around_cache(model, example_inputs)
        held = check_stateless(model, example_inputs, rtol=rtol, atol=atol)
    except CuvilError:
        raise
    except Exception as exc:          # the user's model on their inputs, reported as such
        raise RecompileError(f"the model raised on its example inputs: {type(exc).__name__}: {one_line(exc, 300)}",
                             fix=inputs_hint(given, model, exc)) from exc
    source = isinstance(given, SizesVary)
    if (step is not None or source) and not dynamic:
        log.warning("cuvil-pgc: the example call is %s: its regions get programs for other sizes (as --dynamic)",
                    "an encoder's, whose source's length varies from call to call" if source else
                    "a prefill, whose prompt's length varies from call to call" if step.prefill else
                    "a decoding step, whose cache grows by a token every call")
        dynamic = True

    paths = _trace_paths(traces)
    if analysis is None and paths:
        stage(progress, "analysing the traces")
        analysis = _analyze(paths, machine)
    fingerprint = current_fingerprint(device)
    db = None if records is False else (records if records is not None else RecordDB())
    options = SearchOptions(budget=budget, exhaustive=exhaustive, rtol=rtol, atol=atol, device=device,
                            rounds=rounds, use_records=db is not None,
                            backends=tuple(backends) if backends else None, fixed=_pinned(plan),
                            deployed_race=deployed_race, model_ref=model_ref, sizes_vary=step is not None or source,
                            time_budget=time_budget, eager_scopes=held.modules if held else frozenset())
    if calibrate and db is not None and plan is None:
        from cuvil_pgc.recompile.calibrate import calibrate_backends

        stage(progress, "calibrating the backends")
        calibrate_backends(db, machine_key(fingerprint), device)
    _clear_cache_artifacts()
    with holding(model, held):     # a forward changing its buffers computes from the same state at each call
        result = search(model, example_inputs, analysis, options=options, records=db,
                        machine_key=machine_key(fingerprint), progress=progress)
        if dynamic:
            stage(progress, "exporting the runtime regions for other input sizes")
            _add_other_shapes(result, device, rtol, atol)
    stage(progress, "writing the plan")
    artifacts, files, other_shapes = _artifact_members(result)
    model_hash = structural_hash(model)
    plan = plan_document(result, device=device, model_hash=model_hash, rtol=rtol, atol=atol, artifacts=artifacts,
                         other_shapes=other_shapes, cache_step=step.to_json() if step is not None else None,
                         model=model)
    cache = _save_cache_artifacts() if any(c.backend in ("compile", "cudagraphs") for c in result.choices.values()) \
        else None
    return Build(module=result.module, plan=plan, artifacts=files,
                 cache_artifacts=cache, fingerprint=fingerprint, model_hash=model_hash,
                 trace_hashes=[_sha256_file(p) for p in paths], result=result,
                 model_class=type(model).__qualname__, model_tree=module_tree_digest(model),
                 tensorrt=_engine_target(result))


def _engine_target(result: Any) -> Any:
    """The GPU and TensorRT version the plan's TensorRT engines are tied to (None without any)."""
    if not any(c.backend == "tensorrt" for c in result.choices.values()):
        return None
    from cuvil_pgc.recompile.runtime_build import engine_target

    return engine_target()


def _add_other_shapes(result: Any, device: str, rtol: float | None, atol: float | None) -> None:
    """Give each chosen ONNX Runtime, OpenVINO and AOTInductor region on the CPU its program for
    other input sizes (:mod:`.other_shapes`); a region that cannot have one keeps running the original module
    for them, and the reason is logged."""
    from cuvil_pgc.recompile import other_shapes
    from cuvil_pgc.recompile.apply import prepare_module, runtime_key
    from cuvil_pgc.recompile.export_error import ExportError

    if device != "cpu":
        log.warning("cuvil-pgc: dynamic=True exports programs for other input sizes on the CPU only; the %s "
                    "regions run the original module for them", device)
        return
    for scope, cand in sorted(result.choices.items()):
        region = getattr(result.realized.get(scope), "module", None)
        if region is not None and cand.backend in ("compile", "cudagraphs"):
            region.other_sizes_refused = (f"a {cand.backend} region runs its captured sizes only (--dynamic makes "
                                          "programs for other sizes for ONNX Runtime, OpenVINO and AOTInductor "
                                          "regions)")
            log.warning("cuvil-pgc: %s (%s) runs only its captured input sizes, other sizes run the original "
                        "module: %s", scope or "<model>", cand.config, region.other_sizes_refused)
        if cand.backend not in other_shapes.BACKENDS or region is None:
            continue
        inputs = result.scope_inputs[scope]
        prepared, _ = prepare_module(region.original, cand, device)
        key = runtime_key(region.original, cand, inputs, result.machine, result.weights.get(scope))
        try:
            other = other_shapes.build_other_shapes(region.original, prepared, cand, inputs, key=key,
                                                    rtol=rtol, atol=atol, sized=region.sized_bounds)
            other.compile_sizes(region.original, rtol, atol, label=f"{scope or '<model>'} ({cand.config})")
            region.other_shapes = other
            if other.fixed:
                log.warning("cuvil-pgc: %s (%s) runs other input sizes on its program, with some sizes fixed at "
                            "the captured ones or bounded (calls at others run the original module): %s",
                            scope or "<model>", cand.config, "; ".join(other.fixed))
        except (other_shapes.OtherShapesError, ExportError) as exc:
            region.other_sizes_refused = str(exc)
            log.warning("cuvil-pgc: %s (%s) runs only its captured input sizes, other sizes run the original "
                        "module: %s", scope or "<model>", cand.config, exc)


def _artifact_members(result: Any) -> tuple[dict[str, str], dict[str, str], dict[str, dict[str, Any]]]:
    """(scope -> the member its plan choice names, member -> local file, scope -> the record of
    its program for other input sizes) of the chosen regions' artifacts: AOTInductor packages, the
    runtime backends' files (see :mod:`.runtime_build`) and their programs for other sizes."""
    from cuvil_pgc.recompile import other_shapes
    from cuvil_pgc.recompile.runtime_build import ARTIFACT_SUFFIXES, package_members

    named: dict[str, str] = {}
    files: dict[str, str] = {}
    others: dict[str, dict[str, Any]] = {}
    for i, (scope, r) in enumerate(sorted(result.realized.items())):
        if not r.artifact:
            continue
        backend = result.choices[scope].backend
        members = package_members(backend, i, r.artifact) if backend in ARTIFACT_SUFFIXES else \
            {f"aoti/{i}.pt2": r.artifact}
        named[scope] = next(iter(members))
        files.update(members)
        other = getattr(r.module, "other_shapes", None)
        if other is not None:
            members = other_shapes.package_members(backend, i, other.artifact)
            others[scope] = other.to_json(next(iter(members)))
            files.update(members)
    return named, files, others


def _pinned(plan: Plan | dict[str, Any] | None) -> dict[str, Any] | None:
    """``{scope: Candidate}`` of a pinned plan; one naming fields this version does not know is
    refused (building it without them would build another configuration)."""
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.plan_doc import Plan, PlanFormatError

    if plan is None:
        return None
    if isinstance(plan, dict) and "choices" in plan:
        try:
            plan = Plan.from_json(plan)
        except PlanFormatError as exc:
            raise RecompileError(f"the pinned plan is not usable: {exc}", fix="pin a plan.json this version wrote, "
                                 "or {scope: Candidate}") from None
    pinned = plan.candidates() if isinstance(plan, Plan) else \
        {scope: c if isinstance(c, Candidate) else Candidate.from_json(c) for scope, c in plan.items()}
    for scope, cand in pinned.items():
        if cand.unknown:
            raise RecompileError(f"the pinned plan chooses for {scope or '<model>'} a configuration with fields this "
                                 f"cuvil-pgc does not know ({', '.join(cand.unknown)})",
                                 fix="upgrade cuvil-pgc to build that plan")
    return pinned


def _trace_paths(traces: Any) -> list[str]:
    if traces is None:
        return []
    if isinstance(traces, (str, os.PathLike)):
        traces = [traces]
    out = [os.fspath(t) for t in traces]
    for p in out:
        if not os.path.isfile(p):
            raise RecompileError("trace file does not exist", path=p, fix="pass the traces `cuvil-pgc profile` wrote")
    return out


def _analyze(paths: list[str], machine: Any) -> Any:
    from cuvil_pgc.analyze import analyze
    from cuvil_pgc.trace.reader import load_trace

    return analyze(load_trace(*paths), machine)


def _sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _clear_cache_artifacts() -> None:
    try:
        from torch.compiler._cache import CacheArtifactManager

        CacheArtifactManager.clear()
    except (ImportError, AttributeError):
        pass


def _save_cache_artifacts() -> bytes | None:
    import torch

    save = getattr(torch.compiler, "save_cache_artifacts", None)
    if save is None:
        return None
    saved = save()
    return saved[0] if saved else None
