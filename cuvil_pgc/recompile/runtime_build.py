"""Building a region for a runtime backend, and loading it back from a verified build.

ONNX Runtime and OpenVINO candidates share one export per scope and program (rewritten or not):
``torch.onnx.export(..., dynamo=True)`` writes a self-contained ``.onnx``, which ONNX Runtime runs
and ``openvino.convert_model`` turns into OpenVINO IR (``.xml`` + ``.bin``, weights kept in fp32).
Torch-TensorRT compiles the region (``ir="dynamo"``) into an exported program with TensorRT
engines (``.ep``). The files live in the artifact cache keyed like AOTInductor packages (module
structure, weights, program, inputs, machine, torch and runtime versions), so the knobs of one
runtime cost no second export. A failing export raises :class:`~.apply.ExportError` naming the
exporter, so the search rejects that exporter's other candidates of the scope without building
them.

In a build the files are members ``<backend>/<n><suffix>`` of the signed package; the plan's
choice names the first one and records the runtime (its version) and the output structure. An
engine runs only on the GPU and TensorRT version it was built for: a build with TensorRT regions
records them in its manifest (:func:`engine_target`; builds of plan format 1 in the choice's
``runtime``), and :func:`check_engines` refuses another GPU or TensorRT before any engine is read.
It reads the files only after the package was verified (an ONNX protobuf from an unverified file
is untrusted input).
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import io
import logging
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cuvil_pgc._eval_mode import eval_mode
from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile._stderr import first_line
from cuvil_pgc.recompile.compile_apart import openvino_compiles
from cuvil_pgc.recompile.index_bounds import IndexBounds, index_bounds, onnx_index_bounds, with_shapes
from cuvil_pgc.recompile.onnx_index_checks import UncheckableIndex, add_index_checks
from cuvil_pgc.recompile.openvino_runner import OpenVinoRunner, openvino_config
from cuvil_pgc.recompile.ort_runner import OrtRunner
from cuvil_pgc.recompile.output_template import OutputTemplate
from cuvil_pgc.recompile.output_values import check_constant_outputs
from cuvil_pgc.recompile.runtime_region import TensorRTRunner
from cuvil_pgc.recompile.torchscript_onnx import (
    export_torchscript,
    export_traced,
    returns_mapping,
    scripted_submodule,
)

log = logging.getLogger(__name__)

#: the files of each runtime's artifact, the first one named in the plan
ARTIFACT_SUFFIXES = {"ort": (".onnx",), "openvino": (".xml", ".bin"), "tensorrt": (".ep",)}
#: bump when the ONNX export's program changes (exporter options, the index checks it gets; 5: the
#: dimensions a module keeps static in a free-size export, a decoding step's; 6: a Hugging Face
#: model's ops translated as transformers' exporter translates them, :func:`library_translations`)
ONNX_EXPORT_VERSION = 6
OPSET = 18


def exporters(backend: str) -> tuple[str, ...]:
    """The exporters a backend's build runs, in order (a failure of any rejects its siblings)."""
    return {"aoti": ("torch.export",), "ort": ("torch.onnx.export",),
            "openvino": ("torch.onnx.export", "openvino.convert_model"),
            "tensorrt": ("torch_tensorrt.compile",)}.get(backend, ())


def knobs_of(cand: Any) -> dict[str, str]:
    """The runtime options of ``cand``: its knobs, and for an ONNX Runtime region inside the model
    (not the whole model) ``spin=run`` unless it sets ``spin``.

    ONNX Runtime's intra-op threads spin between runs by default; inside a model, the torch code
    around the region runs meanwhile on the same cores. Measured on this 2-core machine (a ViT
    at 2 threads, the model's eager forward timed right after an ONNX Runtime run of it): 6.0-7.4
    ms with the spinning, 1.84 ms with ``session.force_spinning_stop`` (1.2-2.0 ms alone). A whole
    model keeps the default: back to back, its runs took 199-219 µs spinning, 241-243 µs not."""
    knobs = dict(cand.knobs)
    if cand.backend == "ort" and cand.scope:
        knobs.setdefault("spin", "run")
    return knobs


def build_region(module: nn.Module, prepared: nn.Module, cand: Any, inputs: Any, reference: Any, *,
                 device: str, key: str) -> tuple[Any, str, IndexBounds | None]:
    """The runner of ``cand`` for ``module``, the path of its (first) artifact file, and the inputs
    that index a tensor with its rows (:func:`~.index_bounds.index_bounds`; none for TensorRT).

    ``prepared`` is the module to export (rewrites applied), ``reference`` its output for
    ``inputs`` (the output structure), ``key`` the artifact cache key of the scope and program.
    """
    from cuvil_pgc.recompile.export_error import ExportError

    check_constant_outputs(prepared, inputs, reference, exporters(cand.backend)[0])
    template = OutputTemplate.of(reference)
    if cand.backend == "tensorrt":
        path = artifact_path(key, "tensorrt", cand, ".ep")
        if not path.exists():
            _compile_tensorrt(prepared, cand, inputs, path)
        return tensorrt_runner(str(path), template, module), str(path), None
    onnx_path = artifact_path(key, "onnx", None, ".onnx")
    if not onnx_path.exists():
        export_onnx(prepared, inputs, onnx_path, len(template.tensors))
    bounds = index_bounds(onnx_path)
    if cand.backend == "ort":
        if "fuse" in knobs_of(cand):
            onnx_path = _fused(onnx_path, prepared, cand, key)
        return OrtRunner(str(onnx_path), knobs_of(cand), template, module), str(onnx_path), bounds
    xml = artifact_path(key, "openvino", None, ".xml")
    if not xml.exists():
        try:
            convert_openvino(onnx_path, xml)
        except Exception as exc:
            raise ExportError(f"openvino.convert_model failed: {_why(exc)}") from exc
    openvino_compiles(str(xml), openvino_config(knobs_of(cand), cand.precision))
    return OpenVinoRunner(str(xml), knobs_of(cand), cand.precision, template, module), str(xml), bounds


def _fused(onnx_path: Path, prepared: nn.Module, cand: Any, key: str) -> Path:
    """The region's ONNX file fused by ONNX Runtime's transformer optimizer (see :mod:`.ort_fusion`);
    a failure raises FusionError, which rejects this candidate only."""
    from cuvil_pgc.recompile.ort_fusion import attention_shape, fuse_transformer

    shape = attention_shape(prepared) or {}
    shape["model_type"] = knobs_of(cand)["fuse"]
    fused = artifact_path(key, f"onnx-fused-{shape['model_type']}", None, ".onnx")
    if not fused.exists():
        fuse_transformer(onnx_path, fused, shape)
    return fused


def export_onnx(prepared: nn.Module, inputs: Any, path: Path, outputs: int, *, free_sizes: bool = False) -> None:
    """``torch.onnx.export(dynamo=True)`` of ``prepared`` for ``inputs`` into one ``.onnx`` file;
    with ``free_sizes`` every dimension of the positional tensor inputs is left to the exporter
    (``Dim.AUTO``: free where the program allows other sizes, fixed where it does not)."""
    from cuvil_pgc.recompile.aoti_outputs import TensorOutputs
    from cuvil_pgc.recompile.export_error import ExportError, data_dependent_note, quantized_note

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    chatter = io.StringIO()
    try:
        with torch.no_grad(), contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter):
            # a trailing dict in args is read as the keyword arguments unless kwargs are given: a
            # region taking a dict as its last positional argument gets an empty dict after it
            args = inputs.args + ({},) if not inputs.kwargs and inputs.args and isinstance(inputs.args[-1], dict) \
                else inputs.args
            # keyed by the wrapper's parameter: TensorOutputs.forward takes the region's arguments as *args
            dynamic = {"args": _free_dimensions(prepared, args)} if free_sizes else None
            # TorchScript: torch.export refuses a scripted module and fails inside a scripted block; a
            # trace keeps the block's call and reads a scripted module's dict output in Python
            scripted = isinstance(prepared, torch.jit.ScriptModule)
            traced = not inputs.kwargs and (returns_mapping(prepared) if scripted
                                            else scripted_submodule(prepared) is not None)
            if traced:
                export_traced(eval_mode(TensorOutputs(prepared)), args, tmp, OPSET, free_sizes=free_sizes)
            elif scripted:
                export_torchscript(prepared, args, inputs.kwargs, tmp, OPSET, free_sizes=free_sizes)
            else:
                program = torch.onnx.export(eval_mode(TensorOutputs(prepared)), args, kwargs=inputs.kwargs or None,
                                            dynamo=True, opset_version=OPSET, optimize=True, verbose=False,
                                            report=False, dynamic_shapes=dynamic,
                                            custom_translation_table=None if _plain.get()
                                            else library_translations(prepared))
                program.save(str(tmp), external_data=False)
        import onnx

        graph = onnx.load(str(tmp), load_external_data=False).graph
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"torch.onnx.export failed{quantized_note(prepared)}{data_dependent_note(exc)}: "
                          f"{_why(exc)}") from exc
    initializers = {i.name for i in graph.initializer}
    graph_inputs = [i for i in graph.input if i.name not in initializers]
    from cuvil_pgc.recompile.runtime_region import tensor_leaves

    expected = len(tensor_leaves(inputs.args, inputs.kwargs))
    if len(graph_inputs) != expected or len(graph.output) != outputs:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"torch.onnx.export failed: the ONNX graph has {len(graph_inputs)} inputs and "
                          f"{len(graph.output)} outputs, the region {expected} input and {outputs} output tensors")
    if not _plain.get():
        try:
            _add_index_checks(tmp)
        except UncheckableIndex as exc:
            tmp.unlink(missing_ok=True)
            raise ExportError(f"torch.onnx.export made a program whose indices cannot be checked: {exc}") from None
    os.replace(tmp, path)


def library_translations(module: nn.Module) -> dict[Any, Any] | None:
    """The ONNX translations a model's library ships for its own ops that ``torch.onnx.export``
    cannot lower, where ``module`` holds a Hugging Face model: transformers' exporter passes them as
    ``custom_translation_table`` (its MoE experts' ``transformers.grouped_mm_fallback``, which no
    ONNX function translated: Mixtral's, Qwen-MoE's, OLMoE's steps had no ONNX Runtime or OpenVINO
    candidate; and its fixes of aten ops torchlib lowers wrongly for ONNX Runtime). None where the
    module holds none, or this transformers has no such table (the export runs as torch's)."""
    if "transformers" not in sys.modules or not any(
            type(m).__module__.startswith("transformers.") for m in module.modules()):
        return None
    try:
        from transformers.exporters import exporter_onnx
    except Exception:          # an older transformers, or onnxscript missing: torch's own lowering
        return None
    table = getattr(exporter_onnx, "_ONNX_TRANSLATION_TABLE", None)   # transformers' own, as its exporter passes it
    return dict(table) if isinstance(table, dict) and table else None


def _free_dimensions(prepared: nn.Module, args: tuple[Any, ...]) -> tuple[dict[int, Any] | None, ...]:
    """Per positional argument, its dimensions left to the exporter (``Dim.AUTO``), but those the
    module names static for these arguments (``static_dimensions(args)``: a decoding step's new-token
    count, which Hugging Face's attention tests as a Python bool, and its cache's heads and head size;
    see :meth:`~.cache_step.CacheStep.static_dimensions`)."""
    static = prepared.static_dimensions(args) if hasattr(prepared, "static_dimensions") else {}
    return tuple({i: torch.export.Dim.STATIC if i in static.get(k, ()) else torch.export.Dim.AUTO
                  for i in range(a.dim())} if isinstance(a, torch.Tensor) else None for k, a in enumerate(args))


_plain = contextvars.ContextVar("cuvil_pgc_plain_exports", default=False)


@contextlib.contextmanager
def plain_exports() -> Iterator[None]:
    """ONNX exports made inside are the plain ``torch.onnx.export``, as a user makes one, without the
    index checks cuvil-pgc adds (:mod:`.onnx_index_checks`) or a library's translations
    (:func:`library_translations`), and cached apart: the runtimes'
    baselines in the benchmarks, which race the build against what a user would deploy."""
    token = _plain.set(True)
    try:
        yield
    finally:
        _plain.reset(token)


def _add_index_checks(path: Path) -> None:
    """Check in the program the indices it computes from its inputs (:mod:`.onnx_index_checks`)."""
    import onnx

    model = with_shapes(onnx.load(str(path), load_external_data=False))
    if add_index_checks(model, onnx_index_bounds(model)[1]):
        onnx.save(model, str(path))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def _why(exc: BaseException) -> str:
    """An exporter's failure in one line: the exception, and its root cause where it differs (the
    ONNX exporter wraps the real error in generic ones)."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    text = f"{type(exc).__name__}: {_line(str(exc))}"
    if root is not exc:
        text += f" (cause: {type(root).__name__}: {_line(str(root))})"
    return text


#: OpenVINO's summary of the operators it could not convert, after a log of each one's failure
_UNCONVERTED = re.compile(r"^-- (Conversion is failed for: .+)$", re.M)


def _line(message: str) -> str:
    """The line of an exporter's message that says what failed: OpenVINO's summary of the
    operators it could not convert where it wrote one (its first line is only a header,
    ``FrontEnd API failed with OpConversionFailure:``), else the first line."""
    message = _ANSI.sub("", message)
    summary = _UNCONVERTED.search(message)
    return first_line(summary.group(1) if summary else message)


@contextlib.contextmanager
def root_logger_kept() -> Iterator[None]:
    """The root logger's level, filters and handlers as they were, whatever the block does to them.

    ``openvino.convert_model`` sets the root logger to ERROR (``ovc.logger.init_logger``), adds a
    filter to it and, where it has no handler, a handler of its own, and puts them back only when
    the conversion succeeds: after one OpenVINO candidate it could not convert, every warning of
    the process (the user's, and ours saying why a pinned plan could not be built) went unseen."""
    root = logging.getLogger()
    level, filters, handlers = root.level, list(root.filters), list(root.handlers)
    try:
        yield
    finally:
        root.setLevel(level)
        root.filters[:] = filters
        root.handlers[:] = handlers


def convert_openvino(onnx_path: Path, xml: Path) -> None:
    """OpenVINO IR of the ONNX file, weights kept in fp32 (``save_model`` would halve them)."""
    import openvino as ov

    tmp = xml.with_name(f"{xml.stem}.{os.getpid()}.tmp.xml")
    with root_logger_kept():
        model = ov.convert_model(str(onnx_path))
    ov.save_model(model, str(tmp), compress_to_fp16=False)
    os.replace(tmp.with_suffix(".bin"), xml.with_suffix(".bin"))
    os.replace(tmp, xml)


def _compile_tensorrt(prepared: nn.Module, cand: Any, inputs: Any, path: Path) -> None:
    import torch_tensorrt

    from cuvil_pgc.recompile.export_error import ExportError

    precisions = {torch.float32} | ({torch.float16} if cand.precision == "fp16" else set())
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.ep")
    try:
        with torch.no_grad():
            program = torch_tensorrt.compile(prepared, ir="dynamo", arg_inputs=list(inputs.args),
                                             kwarg_inputs=inputs.kwargs or None, enabled_precisions=precisions)
        torch_tensorrt.save(program, str(tmp), output_format="exported_program", arg_inputs=list(inputs.args),
                            kwarg_inputs=inputs.kwargs or None)
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"torch_tensorrt.compile failed: {_why(exc)}") from exc
    os.replace(tmp, path)


def tensorrt_runner(path: str, template: OutputTemplate | None, original: nn.Module) -> TensorRTRunner:
    import torch_tensorrt

    program = torch_tensorrt.load(path)     # an ExportedProgram whose graph calls the engines
    return TensorRTRunner(program.module() if hasattr(program, "module") else program, template, original)


def artifact_path(key: str, kind: str, cand: Any, suffix: str) -> Path:
    """The artifact cache's file for a region's ``key`` and the ``kind`` of file (``onnx``,
    ``openvino``, ``onnx-shapes`` ...), keyed also by the exporter's and the runtime's versions."""
    from cuvil_pgc.recompile.records import cache_dir

    versions = [f"onnx-export-v{ONNX_EXPORT_VERSION}", f"opset-{OPSET}", *(["plain"] if _plain.get() else [])]
    if kind.startswith(("openvino", "onnx-fused")):
        runtime = "openvino" if kind.startswith("openvino") else "ort"
        versions.append(f"{kind.split('-')[0]}-{runtimes.version(runtime)}")
    if kind == "tensorrt":
        versions += [f"tensorrt-{runtimes.version('tensorrt')}", cand.config, _gpu_name()]
    digest = hashlib.sha256("|".join([key, kind, *versions]).encode()).hexdigest()[:32]
    return cache_dir() / "artifacts" / f"{digest}{suffix}"


def _gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else ""


# ----------------------------------------------------------------------------- packages

def artifact_files(backend: str, first: str) -> dict[str, str]:
    """suffix -> local file of a runtime artifact whose first file is ``first``."""
    base = Path(first)
    return {suffix: str(base.with_suffix(suffix)) for suffix in ARTIFACT_SUFFIXES[backend]}


def package_members(backend: str, index: int, first: str) -> dict[str, str]:
    """member name -> local file of one region's runtime artifact in a build (the first is the
    member the plan names)."""
    return {f"{backend}/{index}{suffix}": local for suffix, local in artifact_files(backend, first).items()}


def runtime_info(backend: str, realized: Any) -> dict[str, Any]:
    """What plan.json records about a region's runtime: its version and the output structure the
    runner rebuilds (None where it cannot be serialized)."""
    info: dict[str, Any] = {"name": backend, "version": runtimes.version(backend)}
    template = getattr(getattr(realized.module, "compiled", None), "template", None)
    info["outputs"] = template.to_json() if template is not None else None
    info.update(bounds_record(realized.module))
    if getattr(getattr(realized.module, "compiled", None), "checks_indices", False):
        info["index_checks"] = IN_PROGRAM          # a plan holding it is format 5 (plan_doc.PROGRAM_CHECKS_FORMAT)
    return info


#: a runtime record's ``index_checks``: its program counts the indices out of range in one more
#: output (:mod:`.onnx_index_checks`)
IN_PROGRAM = "in-program"


def bounds_record(region: Any) -> dict[str, Any]:
    """What plan.json records of a region's :class:`~.index_bounds.IndexBounds` (nothing when it
    has none; older versions ignore it and leave ids unchecked, as they did)."""
    rows = getattr(region, "index_bounds", None)
    return IndexBounds(rows, region.sized_bounds).to_record() if rows else {}


def engine_target() -> Any:
    """The :class:`~.manifest.EngineTarget` of TensorRT engines built here."""
    from cuvil_pgc.recompile.manifest import EngineTarget

    return EngineTarget(version=runtimes.version("tensorrt"), gpu=_gpu_name())


def load_region(vb: Any, choice: Any, module: nn.Module, extract_dir: Path, device: str, path: str) -> Any:
    """The :class:`~.realized.Realized` region of a verified build's runtime choice (a
    :class:`~.plan_doc.PlanChoice`); the loader ran :func:`check_engines` before."""
    cand = choice.candidate
    runtimes.require(cand.backend, device, path)
    member = choice.artifact
    if not member:
        raise BuildError(f"plan chooses {cand.backend} for {choice.label} but names no artifact",
                         path=path, fix="rebuild the package with `cuvil-pgc recompile`")
    info = choice.runtime or {}
    stem = member.rsplit(".", 1)[0]
    local = {}
    for suffix in ARTIFACT_SUFFIXES[cand.backend]:   # only members the manifest verified are extracted
        local[suffix] = str(vb.extract(stem + suffix, extract_dir))
    first = local[ARTIFACT_SUFFIXES[cand.backend][0]]
    outputs = info.get("outputs")
    template = OutputTemplate.from_json(outputs) if outputs else None
    return runtime_region(cand, first, template, module, choice.input_signature, choice.input_spec,
                          bounds_of(info, path))


def runtime_region(cand: Any, first: str, template: OutputTemplate | None, module: nn.Module,
                   signature: str | None, spec: list[list[Any]] | None, bounds: IndexBounds | None = None) -> Any:
    """The :class:`~.realized.Realized` region running ``cand``'s artifact (its first file at
    ``first``) for ``module``'s captured inputs: what a loaded build runs, and what a race worker
    (:mod:`.standalone`) times."""
    from cuvil_pgc.recompile.realized import CompiledRegion, Realized

    if cand.backend == "ort":
        runner: Any = OrtRunner(first, knobs_of(cand), template, module)
    elif cand.backend == "openvino":
        runner = OpenVinoRunner(first, knobs_of(cand), cand.precision, template, module)
    else:
        runner = tensorrt_runner(first, template, module)
    return Realized(CompiledRegion(module, runner, signature, cand.config, spec, bounds), first)


def bounds_of(info: dict[str, Any], path: str) -> IndexBounds | None:
    """The :class:`~.index_bounds.IndexBounds` a plan choice's runtime record holds (see
    :func:`bounds_record`), or None."""
    try:
        return IndexBounds.from_record(info)
    except ValueError as exc:
        raise BuildError(f"plan.json's {exc}", path=path, fix="rebuild the package with `cuvil-pgc recompile`") from exc


def check_engines(manifest: Any, plan: Any, path: str) -> None:
    """Refuse a build whose TensorRT engines were made for another GPU or TensorRT version, before
    the model moves or any engine is read: the manifest's ``tensorrt``
    (:class:`~.manifest.EngineTarget`), or in older builds without it each TensorRT choice's
    ``runtime`` record in plan.json. A build with TensorRT regions on a machine without
    torch_tensorrt is refused naming the pip extra (see :func:`.runtimes.require`)."""
    import msgspec

    from cuvil_pgc.recompile.manifest import EngineTarget

    chosen = [c for c in plan.choices if c.candidate.backend == "tensorrt"]
    if not chosen:
        return
    runtimes.require("tensorrt", plan.device, path)
    target = manifest.tensorrt
    targets = [target] if target is not msgspec.UNSET else \
        [EngineTarget(version=str((c.runtime or {}).get("version")), gpu=str((c.runtime or {}).get("gpu")))
         for c in chosen]
    for t in targets:
        _check_tensorrt(t, path)


def _check_tensorrt(target: Any, path: str) -> None:
    diffs = target.mismatches(engine_target())
    if diffs:
        raise BuildError("the build's TensorRT engines were made for another GPU or TensorRT (" + "; ".join(diffs)
                         + ")", path=path, fix="rebuild it on this machine with `cuvil-pgc recompile`, "
                                               "or load it with fallback='eager'")
