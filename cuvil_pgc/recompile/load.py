"""load_build(): verify a .cuvilpkg, check it fits this environment and the model, apply its plan.

:func:`load_build` opens the package through :func:`~cuvil_pgc.recompile.trust.open_trusted`: a build
no trusted key signed is refused unless the caller opts in, and the signature and every member's
digest are verified before anything is read. It then refuses a build made for another torch,
Python, platform, CPU ISA or device with a :class:`BuildError` that lists the differences, and one
made for another model (:func:`check_model`); ``fallback="eager"`` turns any failure of loading
into the plain model with a warning. Regions whose module changed since the build, or whose
AOTInductor package holds other weights than the model's now (fine-tuned since), run eagerly: they
are listed in the report and one RuntimeWarning names them (``stale="error"`` refuses such a build
instead, before any region of the model is replaced). A build measured at another torch thread
count than the process runs is loaded with a warning.
The returned module carries
``cuvil_load_report`` (a :class:`LoadReport`): with ``example_inputs`` it runs one warm-up call
and counts Inductor cache hits and misses, so a warm load is checkable and a miss is explained.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuvil_pgc._eval_mode import eval_mode
from cuvil_pgc.errors import BuildError, ConfigError, CuvilError, one_line
from cuvil_pgc.recompile.build import CACHE_MEMBER
from cuvil_pgc.recompile.plan_doc import PLAN_MEMBER

if TYPE_CHECKING:
    from cuvil_pgc.recompile.plan_doc import Plan

FALLBACKS = ("error", "eager")
#: what load_build does with regions that changed since the build
STALE_POLICIES = ("eager", "error")
#: said of changed weights where the model came in training mode, in which every call moves batch
#: norm's running statistics (a service whose model forgot ``.eval()`` warmed it up before loading)
TRAINED = ("; the model came in training mode, in which each call updates batch norm's running statistics: "
           "call model.eval() before its first call")


@dataclass
class LoadReport:
    path: str
    applied: list[str] = field(default_factory=list)      # "scope: config"
    skipped: list[str] = field(default_factory=list)      # stale regions, with the reason
    aoti_packages: int = 0
    runtime_regions: int = 0      # regions on ONNX Runtime, OpenVINO or TensorRT
    compiled_regions: int = 0
    cache_artifacts: str = "none"     # none | loaded | unusable: reason
    cache_hits: int | None = None
    cache_misses: int | None = None
    warm: bool | None = None
    notes: list[str] = field(default_factory=list)
    threads: int = 0                  # what the build was measured at (0: not recorded)
    #: per region with programs for single sizes, after ``size_examples``: "label: sizes, ..."
    size_programs: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def load_build(path_or_ref: str | os.PathLike[str], model: Any, *, fallback: str = "error", store: Any = None,
               pubkey: Any = None, allow_unsigned: bool | None = None, require_signature: bool = False,
               example_inputs: tuple[Any, ...] | None = None, stale: str = "eager",
               size_programs: int | None = None, size_examples: Any = None) -> Any:
    """Verify a build, check it fits this environment and ``model``, and return the optimized model.

    Args:
        path_or_ref: a .cuvilpkg path or ``store://NAME[@VERSION|@TAG]`` (with ``store=DIR``).
        fallback: "error" raises BuildError on any problem; "eager" warns and returns ``model``
            whatever went wrong while loading (a refused build, a library that does not load ...).
        stale: regions whose module or weights changed since the build: "eager" runs them eagerly
            (listed in the report, one warning); "error" makes that a problem (see ``fallback``).
        pubkey: the signer's public key (object or file). Without it, ``$CUVIL_TRUSTED_KEY`` or the
            store's ``trusted.pub``; with none of them the build is refused (see :mod:`.trust`).
        allow_unsigned: opt in to builds no trusted key vouches for (default ``$CUVIL_ALLOW_UNSIGNED``);
            logged. Never weakens a key that is configured.
        require_signature: refuse unsigned builds even where ``allow_unsigned`` says otherwise.
        example_inputs: run one warm-up call and report compile-cache hits in ``cuvil_load_report``.
        size_programs: per region with a program for other input sizes (``recompile --dynamic``),
            the most sizes called often that get a program compiled for them alone, in the
            background (see :mod:`.size_programs`); 0 runs every other size on the free-size
            program. Default: 8, fewer where their copies of the region's weights would pass 1 GiB;
            0 for a decoding step's build, whose cache grows by a token every call.
        size_examples: inputs (each as ``example_inputs``) at the sizes the service will be called
            at: each region compiles and checks its program for each of their sizes now, not after
            a few calls at it, and ``cuvil_load_report.size_programs`` lists what each region has.
    """
    if fallback not in FALLBACKS:
        raise BuildError(f"fallback={fallback!r} is not one of {FALLBACKS}")
    if stale not in STALE_POLICIES:
        raise BuildError(f"stale={stale!r} is not one of {STALE_POLICIES}")
    if require_signature:
        allow_unsigned = False
    if size_programs is not None and (type(size_programs) is not int or size_programs < 0):
        raise BuildError(f"size_programs={size_programs!r} is not a count of programs (0 or more, or None)")
    if size_examples is not None and not isinstance(size_examples, (list, tuple)):
        raise BuildError(f"size_examples is a {type(size_examples).__name__}: give a list of example inputs, "
                         "one per size")
    try:
        return _load(path_or_ref, model, store, pubkey, allow_unsigned, example_inputs, stale, size_programs,
                     size_examples)
    except Exception as exc:      # every failure of loading: refused builds, dlopen, deep JSON ...
        if fallback == "error":
            if isinstance(exc, CuvilError):
                exc.located(path_or_ref)      # one raised about a member of the package: named by it
                raise
            raise BuildError(f"the build could not be loaded ({type(exc).__name__}: {one_line(exc)})",
                             path=os.fspath(path_or_ref),
                             fix="rebuild it here with `cuvil-pgc recompile`, or load it with fallback='eager'"
                             ) from exc
        warnings.warn(f"cuvil-pgc: running the model in eager mode: {one_line(exc)}", RuntimeWarning,
                      stacklevel=2)
        model.cuvil_load_report = LoadReport(path=os.fspath(path_or_ref),
                                             notes=[f"fell back to eager: {one_line(exc)}"])
        return model


def _load(source: Any, model: Any, store: Any, pubkey: Any, allow_unsigned: bool | None,
          example_inputs: tuple[Any, ...] | None, stale: str, size_programs: int | None,
          size_examples: list[Any] | tuple[Any, ...] | None = None) -> Any:
    from cuvil_pgc.recompile.decoding_forward import own_model
    from cuvil_pgc.recompile.encoder_build import encoder_of
    from cuvil_pgc.recompile.runtime_build import check_engines
    from cuvil_pgc.recompile.trust import open_trusted

    given, model = model, own_model(model)    # what a build returned: the model it was made from
    _check_materialized(model, source)
    with open_trusted(source, store=store, pubkey=pubkey, allow_unsigned=allow_unsigned) as vb:
        path = vb.path
        _check_environment(vb.manifest, path)
        plan = _read_plan(vb, path)
        check_engines(vb.manifest, plan, path)
        step = _decoding_step(plan, model, path)
        encoder = encoder_of(given, vb.manifest.model_class) if step is None else None
        target = step if step is not None else encoder if encoder is not None else model
        check_model(vb.manifest, plan, target, path)
        report = LoadReport(path=path, threads=vb.manifest.threads)
        _check_threads(vb.manifest.threads, report, path)
        report.cache_artifacts = _load_cache_artifacts(vb) if CACHE_MEMBER in vb.members() else "none"
        if step is not None and size_programs is None:
            # a decoding step's cache is a token longer every call: no length is called more than
            # once per generation, and a program of its own per length would only take the cores
            # from the steps while it compiles
            size_programs = 0
        module = loaded = _apply_choices(vb, plan, target, report, path, stale, size_programs)
        if step is not None:
            module = _installed(model, step, module, report, given)
        elif encoder is not None:
            module = _with_encoder(given, encoder, module, report, path)
    # what example_inputs and size_examples are the inputs of: the encoder's, for its build
    served, served_model = (loaded, encoder) if encoder is not None else (module, model)
    if report.skipped:
        warnings.warn(f"cuvil-pgc: {path}: {len(report.skipped)} region(s) run eagerly: "
                      + "; ".join(report.skipped), RuntimeWarning, stacklevel=3)
    if example_inputs is not None:
        from cuvil_pgc._example_inputs import positional_inputs

        _warm_up(served, positional_inputs(served_model, example_inputs), report)
    if size_examples is not None:
        _compile_sizes(served, served_model, size_examples, report)
    module.cuvil_load_report = report
    return module


def _decoding_step(plan: Plan, model: Any, path: str) -> Any:
    """The :class:`~.cache_step.CacheStep` of ``model`` a decoding step's plan is for, or None."""
    from cuvil_pgc.recompile.cache_step import CacheStep, StepLayout

    if not plan.cache_step:
        return None
    return CacheStep(model, StepLayout.from_json(plan.cache_step, path))


def _installed(model: Any, step: Any, region: Any, report: LoadReport, given: Any) -> Any:
    """A copy of ``given`` (what the build was loaded onto: ``model``, or a copy of it a build
    returned) running ``region`` (the loaded build of ``model``'s decoding ``step``, or of its
    prefill) for those calls; where ``given`` runs the other kind's build, the copy keeps it for the
    other calls, and an encoder's build it runs stays (:mod:`.encoder_build`)."""
    from cuvil_pgc.recompile.decoding_forward import install, other_kind, without_forward

    other = other_kind(given, step.layout.prefill)
    if region is step:          # nothing of the step's call was replaced: the model as it was given, less its build of this kind
        return given if other is not None or given is model else without_forward(given)
    kind = ("a prefill's build: generate()'s first call, with the cache still empty, runs the build"
            if step.layout.prefill else
            "a decoding step's build: a call passing a cache of the built structure (generate()'s steps after the "
            "first) runs the build")
    rest = ("the decoding steps run the build it was loaded onto" if step.layout.prefill else
            "the prefill runs the build it was loaded onto") if other is not None else \
        "other calls run the model's own forward"
    report.notes.append(f"{kind}; {rest}")
    return install(given, step, region, other)


def _with_encoder(given: Any, encoder: Any, loaded: Any, report: LoadReport, path: str) -> Any:
    """A copy of ``given`` (an encoder-decoder) whose encoder is ``loaded``, the build of its
    ``encoder`` (see :mod:`.encoder_build`)."""
    from cuvil_pgc.recompile.encoder_build import with_encoder

    report.notes.append(f"an encoder's build ({type(encoder).__name__}): generate() runs it on the source, the "
                        "decoder runs as it did (its own forward, or the decoding builds it was loaded onto)")
    return with_encoder(given, loaded, path)


def _check_threads(built: int, report: LoadReport, path: str) -> None:
    """Warn when this process runs torch at another thread count than the build was measured at."""
    import torch

    here = torch.get_num_threads()
    if built and built != here:
        note = (f"built and measured at {built} torch thread(s), this process runs {here}: its plan may not be "
                f"the fastest here (torch.set_num_threads({built}), or recompile with --threads {here})")
        report.notes.append(note)
        warnings.warn(f"cuvil-pgc: {path}: {note}", RuntimeWarning, stacklevel=4)


def check_model(manifest: Any, plan: Plan, model: Any, path: str) -> None:
    """Refuse a build made for another model: another class, another module tree, or none of its
    planned regions in this one.

    A build of an earlier version of this model passes (same class and module tree, the planned
    submodules exist): regions that changed since run eagerly (``stale``). A build for another model
    would only time the eager model against itself.
    """
    from cuvil_pgc._structure import module_tree_digest
    from cuvil_pgc.recompile.matching import structural_hash

    if not manifest.model_hash or structural_hash(model) == manifest.model_hash:
        return
    here = type(model).__qualname__
    scopes = [c.scope for c in plan.choices]
    names = {name for name, _ in model.named_modules()}
    if manifest.model_class and manifest.model_class != here:
        problem = f"it was recompiled from a {manifest.model_class}, this model is a {here}"
    elif manifest.model_tree and manifest.model_tree != module_tree_digest(model):
        problem = (f"its submodules (names and classes) are not those of the {manifest.model_class or here} "
                   f"it was recompiled from, though the class names agree")
    elif scopes and not any(s and s in names for s in scopes) and "" not in scopes:
        shown = ", ".join(scopes[:5]) + (", ..." if len(scopes) > 5 else "")
        problem = f"none of the submodules its plan optimizes ({shown}) exists in this {here}"
    else:
        return
    raise BuildError(f"build was made for another model: {problem}", path=path,
                     fix="load it with the model it was recompiled from, or recompile this model "
                         "with `cuvil-pgc recompile`")


def _check_environment(manifest: Any, path: str) -> None:
    from cuvil_pgc.recompile.manifest import current_fingerprint

    built = manifest.fingerprint
    device = "cuda" if built.device.startswith("cuda") else built.device
    here = current_fingerprint(device)
    problems = built.mismatches(here)
    if problems:
        raise BuildError("build was made for another environment (" + "; ".join(problems) + ")", path=path,
                         fix="rebuild it here with `cuvil-pgc recompile`, or load it with fallback='eager'")


def _read_plan(vb: Any, path: str) -> Plan:
    from cuvil_pgc.recompile._json_bounds import check_json_bounds
    from cuvil_pgc.recompile.plan_doc import Plan, PlanFormatError

    try:
        data = vb.read_bytes(PLAN_MEMBER)
        check_json_bounds(data, what=PLAN_MEMBER, path=path)
        plan = json.loads(data)
    except (KeyError, ValueError, BuildError) as exc:
        raise BuildError(f"{PLAN_MEMBER} is missing or unreadable ({exc})", path=path,
                         fix="rebuild the package with `cuvil-pgc recompile`") from None
    if not isinstance(plan, dict) or not isinstance(plan.get("choices"), list):
        raise BuildError(f"{PLAN_MEMBER} is not a plan (no list of choices)", path=path,
                         fix="rebuild the package with `cuvil-pgc recompile`")
    try:
        return Plan.from_json(plan)
    except PlanFormatError as exc:
        raise BuildError(f"{PLAN_MEMBER} has an unknown format or shape ({exc})", path=path,
                         fix="upgrade cuvil-pgc or rebuild the package") from None


def _load_cache_artifacts(vb: Any) -> str:
    import torch

    loader = getattr(torch.compiler, "load_cache_artifacts", None)
    if loader is None:
        return "unusable: this torch has no torch.compiler.load_cache_artifacts"
    try:   # only reached after the whole package (and its signature) was verified
        info = loader(vb.read_bytes(CACHE_MEMBER))
    except Exception as exc:
        return f"unusable: {type(exc).__name__}: {exc}"
    return "loaded" if info is not None else "unusable: torch could not deserialize them (other torch version?)"


def _check_materialized(model: Any, source: Any) -> None:
    """Refuse a model whose lazy modules (``nn.LazyLinear``, ``LazyConv2d``) have not been called
    yet: until its first call a lazy module has no weights (torch raised "Can't access the shape
    of an uninitialized parameter" from deep in the load, reported as a build that "could not be
    loaded", to be rebuilt), and one given its checkpoint still has its lazy class and no input
    size (``in_features`` 0), which the build, made from a called one, does not match."""
    import torch
    from torch.nn.modules.lazy import LazyModuleMixin

    if not isinstance(model, torch.nn.Module):
        return
    # a call removes the hook that finishes it (a lazy class of the user's without a class to
    # become stays lazy after it)
    lazy = [name or "<model>" for name, m in model.named_modules()
            if isinstance(m, LazyModuleMixin) and hasattr(m, "_initialize_hook")]
    if lazy:
        raise BuildError(f"the model's lazy modules have not been called yet ({', '.join(lazy[:3])}"
                         f"{', ...' if len(lazy) > 3 else ''}): a lazy module takes its weights' shapes, its "
                         "class and its input size from its first call, and the build was made from a model "
                         "that had been called", path=os.fspath(source),
                         fix="load the model's checkpoint into it and call it once on an example input, then "
                             "load_build")


def _apply_choices(vb: Any, plan: Plan, model: Any, report: LoadReport, path: str, stale: str,
                   size_programs: int | None) -> Any:
    from cuvil_pgc.recompile.apply import apply_plan

    training = bool(getattr(model, "training", False))
    if training:
        report.notes.append("the model was in training mode: load_build put it in eval mode, which the build's "
                            "programs compute in (no dropout, batch norm's running statistics); model.train() "
                            "runs the original module")
    model = eval_mode(model).to(plan.device)
    modules = dict(model.named_modules())
    realized: dict[str, Any] = {}
    with _unpacked() as extract_dir:
        _realize_choices(vb, plan, modules, realized, report, path, extract_dir, size_programs, training)
    if report.skipped and stale == "error":
        raise BuildError(f"{len(report.skipped)} region(s) changed since the build: " + "; ".join(report.skipped),
                         path=path, fix="recompile this model version with `cuvil-pgc recompile`, or load with "
                                        "stale='eager' to run the changed regions eagerly")
    return apply_plan(model, realized) if realized else model


def _realize_choices(vb: Any, plan: Plan, modules: dict[str, Any], realized: dict[str, Any], report: LoadReport,
                     path: str, extract_dir: Path, size_programs: int | None, training: bool) -> None:
    """Each choice's region, its verified files unpacked into ``extract_dir`` (or skipped, with the
    reason in ``report``); ``training``: the model came in training mode."""
    from cuvil_pgc._structure import changed_settings, settings_by_name, settings_digest, weights_digest
    from cuvil_pgc.recompile.apply import realize
    from cuvil_pgc.recompile.candidates import RUNTIME_BACKENDS
    from cuvil_pgc.recompile.matching import structural_hash
    from cuvil_pgc.recompile.other_shapes import load_other_shapes
    from cuvil_pgc.recompile.output_template import OutputTemplate
    from cuvil_pgc.recompile.runtime_build import bounds_of, load_region

    artifact_backends = ("aoti", *RUNTIME_BACKENDS)
    for choice in plan.choices:
        scope, cand = choice.scope, choice.candidate
        if cand.unknown:
            raise BuildError(f"{PLAN_MEMBER} chooses for {choice.label} a configuration with fields "
                             f"this cuvil-pgc does not know ({', '.join(cand.unknown)}): a newer version made it, "
                             "and running it without them would run another configuration", path=path,
                             fix="upgrade cuvil-pgc, or rebuild the package with this version")
        module = modules.get(scope)
        if module is None or structural_hash(module) != choice.structure:
            report.skipped.append(f"{scope or '<model>'}: module {'missing' if module is None else 'changed'} "
                                  "since the build; running it eagerly")
            continue
        if cand.backend in artifact_backends and choice.weights not in (None, weights_digest(module)):
            report.skipped.append(f"{scope or '<model>'}: weights changed since the build (its {cand.backend} "
                                  "artifact holds the build's weights); running it eagerly (a checkpoint loaded "
                                  "after load_build is not seen here: load it into the model first, or recompile; "
                                  "a model whose first call rewrites its weights, as RWKV's does: call it once "
                                  "before load_build)" + (TRAINED if training else ""))
            continue
        if cand.backend in artifact_backends and choice.settings not in (None, settings_digest(module,
                                                                                         choice.settings_skip or ())):
            which = changed_settings(choice.settings_by_name, settings_by_name(module, choice.settings_skip or ())) \
                if choice.settings_by_name else []
            named = f" ({', '.join(which[:6])}{', ...' if len(which) > 6 else ''})" if which else ""
            report.skipped.append(f"{scope or '<model>'}: settings changed since the build{named} (attribute values "
                                  f"that are not weights, such as a temperature, an eps or a config flag: its "
                                  f"{cand.backend} artifact holds the build's); running it eagerly (recompile with "
                                  "the settings it runs with)")
            continue
        if cand.backend in RUNTIME_BACKENDS:
            realized[scope] = load_region(vb, choice, module, extract_dir, plan.device, path)
            load_other_shapes(vb, choice, realized[scope].module, extract_dir, plan.device, plan.tolerances,
                              size_programs)
            report.runtime_regions += 1
        elif cand.backend == "aoti":
            if not choice.artifact:
                raise BuildError(f"plan chooses AOTInductor for {choice.label} but names no package", path=path)
            local = str(vb.extract(choice.artifact, extract_dir))
            info = choice.runtime or {}
            outputs = info.get("outputs")
            realized[scope] = realize(module, cand, None, artifact=local, signature=choice.input_signature,
                                      spec=choice.input_spec, tensor_outputs=bool(info.get("tensor_outputs")),
                                      template=OutputTemplate.from_json(outputs) if outputs else None,
                                      index_bounds=bounds_of(info, path))
            load_other_shapes(vb, choice, realized[scope].module, extract_dir, plan.device, plan.tolerances,
                              size_programs)
            report.aoti_packages += 1
        else:
            realized[scope] = _realize_lazy(module, cand, plan.device, choice, path)
            report.compiled_regions += cand.backend != "eager"
        region = getattr(realized.get(scope), "module", None)
        if hasattr(region, "watch_settings"):      # a setting set after load runs the original module
            region.watch_settings(choice.settings_skip or ())
        other = getattr(region, "other_shapes", None)
        if choice.other_sizes_refused is not None and region is not None and other is None:
            region.other_sizes_refused = choice.other_sizes_refused
            report.notes.append(f"{choice.label} runs its captured input sizes only (other sizes run the original "
                                f"module): its program for other sizes was left out at build: "
                                f"{choice.other_sizes_refused}")
        report.applied.append(f"{scope or '<model>'}: {cand.config}" + (" (and other input sizes)" if other else ""))


def _realize_lazy(module: Any, cand: Any, device: str, choice: Any, path: str) -> Any:
    """torch.compile candidates need no inputs to build: compilation happens on the first call that
    fits the build's captured inputs (``choice.input_signature``, ``input_spec``), its ids checked
    against the bounds the plan records."""
    from cuvil_pgc.recompile.apply import prepare_module, realize
    from cuvil_pgc.recompile.realized import Realized
    from cuvil_pgc.recompile.runtime_build import bounds_of

    if cand.backend == "eager":
        prepared, applied = prepare_module(module, cand, device)
        return Realized(prepared, rewrites=applied)
    return realize(module, cand, _NoInputs(), device=device, signature=choice.input_signature,
                   spec=choice.input_spec, index_bounds=bounds_of(choice.runtime or {}, path))


class _NoInputs:
    """Stands in for captured inputs where a backend never looks at them (torch.compile)."""

    signature = None
    args: tuple = ()
    kwargs: dict = {}


@contextlib.contextmanager
def _unpacked() -> Iterator[Path]:
    """A directory of this process's own (``mkdtemp``: mode 0700, in the temp directory) that the
    build's verified members are unpacked into for the runtimes to read, removed once they have:
    each keeps its program in memory (ONNX Runtime sessions, OpenVINO compiled models,
    AOTInductor's own copy of its library). Not in the cache directory: another user who can write
    there could swap a verified file before a runtime reads it, and a cache clear or eviction
    could remove it mid-load."""
    try:
        path = Path(tempfile.mkdtemp(prefix="cuvil-load-"))
    except OSError as exc:
        raise ConfigError(f"cannot create a directory to unpack the build into under {tempfile.gettempdir()} "
                          f"({type(exc).__name__}: {exc})", fix="set TMPDIR to a writable directory") from exc
    try:
        yield path
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES):
            raise ConfigError(f"cannot unpack the build into {path} ({type(exc).__name__}: {exc})",
                              fix="free space there, or set TMPDIR to a writable directory with room") from exc
        raise
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _warm_up(module: Any, example_inputs: tuple[Any, ...], report: LoadReport) -> None:
    import torch
    from torch._dynamo.utils import counters

    before = _cache_counts(counters)
    with torch.no_grad():
        module(*example_inputs)
    after = _cache_counts(counters)
    report.cache_hits = after[0] - before[0]
    report.cache_misses = after[1] - before[1]
    report.warm = report.cache_misses == 0
    if report.cache_misses:
        reason = ("the packaged cache artifacts were not usable: " + report.cache_artifacts
                  if report.cache_artifacts.startswith("unusable") else
                  "no cache artifacts for these graphs (inputs or environment differ from the build's)")
        report.notes.append(f"{report.cache_misses} Inductor cache misses: {reason}")


def _compile_sizes(module: Any, model: Any, examples: list[Any] | tuple[Any, ...], report: LoadReport) -> None:
    """Call ``module`` at each of ``examples`` so that every region compiles its program for their
    sizes now (:func:`~.size_programs.compiling_now`), and report what each region has."""
    import torch

    from cuvil_pgc._example_inputs import positional_inputs
    from cuvil_pgc.recompile.realized import CompiledRegion
    from cuvil_pgc.recompile.size_programs import compiling_now

    with torch.no_grad(), compiling_now():
        for i, example in enumerate(examples):
            try:
                module(*positional_inputs(model, example))
            except Exception as exc:
                raise BuildError(f"the model raised on size_examples[{i}] ({type(exc).__name__}: {one_line(exc)})",
                                 fix="give inputs the model takes, each as example_inputs") from exc
    free = [m.other_shapes for m in module.modules() if isinstance(m, CompiledRegion) and m.other_shapes is not None]
    regions = [other.size_programs for other in free if other.size_programs is not None]
    report.size_programs = [f"{p.label}: " + ("; ".join(", ".join(map(str, key)) for key in p.sizes()) or "none")
                            + (f" ({p.refused} refused: {p.stopped or 'see the log'})" if p.refused else "")
                            for p in regions]
    if not free:
        report.notes.append("size_examples: no region of this build runs other input sizes on a program: it was made "
                            "without `recompile --dynamic`, or its regions cannot take other sizes (its warnings "
                            "at build time say why)")
    elif not regions:
        report.notes.append("size_examples: no region compiles programs for single sizes: loaded with "
                            "size_programs=0, or its runtimes compile none (AOTInductor)")


def _cache_counts(counters: Any) -> tuple[int, int]:
    ind = counters.get("inductor", {})
    return int(ind.get("fxgraph_cache_hit", 0)), int(ind.get("fxgraph_cache_miss", 0))
