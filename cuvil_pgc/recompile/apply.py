"""Plan → optimized model: turn candidates into runnable modules and splice them into the model.

:func:`realize` builds one candidate for one scope: rewrites, layout and precision wrap a copy of
the submodule, then the backend compiles it (``torch.compile`` with the mode's options plus
freezing / cpp_wrapper, an AOTInductor package exported for the captured inputs and loaded with
``aoti_load_package``, or CUDA graphs via ``reduce-overhead``). The result is a
:class:`CompiledRegion`: it runs the compiled code for inputs of the captured signature and the
original module for anything else (AOTInductor packages are shape-specialized), so a plan never
breaks a call it was not built for. :func:`apply_plan` replaces the chosen submodules (or the
whole model) in a copy of the model. AOTInductor packages live in an artifact cache keyed by
module structure, configuration, input signature and machine, so a repeated search or build
reuses them instead of compiling again.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from cuvil_pgc._cache import enforce_limit, touch
from cuvil_pgc._eval_mode import eval_mode
from cuvil_pgc._structure import settings_digest, weights_digest
from cuvil_pgc.recompile._stderr import exception_line
from cuvil_pgc.recompile.aoti_outputs import (
    TENSOR_OUTPUTS_KEY,
    TensorOutputs,
    aoti_output_template,
    aoti_runner,
)
from cuvil_pgc.recompile.candidates import RUNTIME_BACKENDS, Candidate
from cuvil_pgc.recompile.cxx_runtime import share_cxx_runtime
from cuvil_pgc.recompile.export_error import ExportError, data_dependent_note, quantized_note
from cuvil_pgc.recompile.index_bounds import IndexBounds
from cuvil_pgc.recompile.matching import input_signature, structural_hash
from cuvil_pgc.recompile.object_outputs import OUTPUTS_VERSION
from cuvil_pgc.recompile.program_index_bounds import program_index_bounds, unchecked_reason
from cuvil_pgc.recompile.realized import CALL_VERSION, CompiledRegion, Realized
from cuvil_pgc.recompile.records import cache_dir
from cuvil_pgc.recompile.rewrites import REWRITES_VERSION, apply_rewrites
from cuvil_pgc.recompile.runtime_region import tensor_leaves
from cuvil_pgc.recompile.stateless import object_state, tensor_versions
from cuvil_pgc.recompile.torchscript_onnx import torch_export_note

log = logging.getLogger(__name__)

LOW_PRECISION_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: bump when what :mod:`.index_bounds` checks in AOTInductor and torch.compile regions changes
INDEX_CHECKS_VERSION = 2
#: bump when the channels_last program changes (see :class:`_ChannelsLast`)
LAYOUT_VERSION = 2
#: CPU convolutions with fewer input channels keep NCHW under channels_last: oneDNN's NHWC kernels
#: lose there (a 3-channel 3x3 stem took 110 µs NHWC against 52 µs NCHW on a 2-core AVX2 CPU, while
#: from 16 channels up NHWC was as fast or faster)
MIN_NHWC_CHANNELS = 8


@dataclass
class ScopeInputs:
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def signature(self) -> str:
        return input_signature((self.args, self.kwargs))

    @property
    def spec(self) -> list[list[Any]] | None:
        """JSON-able [shape, dtype, device, strides] per positional tensor; None unless all are tensors."""
        if self.kwargs or not all(isinstance(a, torch.Tensor) for a in self.args):
            return None
        return [[list(a.shape), str(a.dtype).removeprefix("torch."), str(a.device), list(a.stride())]
                for a in self.args]


def capture_scope_inputs(model: nn.Module, example_inputs: tuple[Any, ...],
                         scopes: list[str]) -> dict[str, ScopeInputs]:
    """Inputs each scope receives during one forward of ``model`` (the first call of each). A
    TorchScript module (``torch.jit.script``, and each module inside one) is not a scope: it refuses
    hooks, and its code is compiled already. Nor is a module called with a nested tensor: the
    layers of ``nn.TransformerEncoder`` in inference with a padding mask get one, which has no
    sizes to export for, and which they take only on the fast path that the census turns off. Nor
    is a module whose call changes an object it is given (a Hugging Face decoder layer appending
    to the cache; :func:`~.stateless.object_state`), or a tensor it is given in place (an activation
    with ``inplace=True``; :func:`~.stateless.tensor_versions`): no program reproduces that, and
    replaying its captured call would append again, or apply itself again to a tensor that other
    scopes captured as their input (timm's stem SiLU ran again on the stages' input, and every
    candidate of the stages failed the accuracy guard, off by up to 2). Nor is a module its caller
    runs under ``torch.autocast``: its call alone, replayed or exported, computes without the
    autocast (a bf16 input met a float32 weight, and the search ended in an internal error)."""
    modules = dict(model.named_modules())
    captured: dict[str, ScopeInputs] = {"": ScopeInputs(tuple(example_inputs))}
    before: dict[str, dict[str, Any]] = {}      # scope -> its input objects' state as its first call began
    changes: dict[str, str] = {}                # scope -> the input object its first call changed
    in_place: dict[str, str] = {}               # scope -> the input tensor its first call changed in place
    autocast: dict[str, str] = {}               # scope -> the autocast its first call ran under
    hooks = []
    for scope in scopes:
        if scope and scope in modules and not isinstance(modules[scope], torch.jit.ScriptModule):
            def pre(_m, args, kwargs, scope=scope):
                if scope not in captured:
                    captured[scope] = ScopeInputs(_as_called(tuple(args)), _as_called(dict(kwargs)))
                    before[scope] = object_state(args, kwargs), tensor_versions(args, kwargs)
                    if (on := _autocast_on()) is not None:
                        autocast[scope] = on

            def post(_m, args, kwargs, _out, scope=scope):
                if scope not in before:
                    return
                state, versions = before.pop(scope)
                now = object_state(args, kwargs) if state else {}
                changed = [name for name, held in state.items() if now.get(name) != held]
                if changed:
                    changes[scope] = changed[0]
                overwritten = [name for name, version in tensor_versions(args, kwargs).items()
                               if versions.get(name, version) != version]
                if overwritten:
                    in_place[scope] = overwritten[0]
            hooks.append(modules[scope].register_forward_pre_hook(pre, with_kwargs=True))
            hooks.append(modules[scope].register_forward_hook(post, with_kwargs=True))
    try:
        with torch.no_grad():
            model(*example_inputs)
    finally:
        for h in hooks:
            h.remove()
    if changes:
        names = sorted(changes)
        log.warning("cuvil-pgc: %s change%s an object %s given (%s), which no program captured from one call "
                    "does: searched only as part of the module that makes the object", _listed(names),
                    "s" if len(names) == 1 else "", "it is" if len(names) == 1 else "they are", changes[names[0]])
    if in_place:     # mostly an activation with inplace=True, which no program would speed up alone
        names = sorted(in_place)
        log.info("cuvil-pgc: %s change%s the tensor %s given in place (%s): searched only as part of a module "
                 "around %s", _listed(names), "s" if len(names) == 1 else "", "it is" if len(names) == 1 else
                 "they are", in_place[names[0]], "it" if len(names) == 1 else "them")
    if autocast:
        names = sorted(autocast)
        log.warning("cuvil-pgc: %s run%s under the %s its caller turns on, which a program of %s alone does not: "
                    "searched only as part of the module that turns it on", _listed(names),
                    "s" if len(names) == 1 else "", autocast[names[0]], "it" if len(names) == 1 else "each")
    return {scope: inputs for scope, inputs in captured.items()
            if not scope or scope not in changes and scope not in in_place and scope not in autocast
            and not any(t.is_nested for t in tensor_leaves(inputs.args, inputs.kwargs))}


def _as_called(value: Any) -> Any:
    """``value`` with its plain lists, tuples and dicts copied (their items are not): what a call
    was given, whatever its caller adds to them afterwards. torchvision's DenseNet hands each layer
    the list of the features so far, then appends the layer's own: the captured call, replayed,
    concatenated one more and the search ended in an internal error ("running_mean should contain
    256 elements not 64")."""
    if type(value) is list:
        return [_as_called(v) for v in value]
    if type(value) is tuple:
        return tuple(_as_called(v) for v in value)
    if type(value) is dict:
        return {k: _as_called(v) for k, v in value.items()}
    return value


def _listed(names: list[str]) -> str:
    """"a, b, c and 2 more": the first three of ``names``."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _autocast_on() -> str | None:
    """The autocast in effect (``"bf16 autocast on cpu"``), or None."""
    for device in ("cpu", "cuda"):
        if torch.is_autocast_enabled(device):
            dtype = str(torch.get_autocast_dtype(device)).removeprefix("torch.")
            return f"{ {'bfloat16': 'bf16', 'float16': 'fp16'}.get(dtype, dtype)} autocast on {device}"
    return None


class _Autocast(nn.Module):
    def __init__(self, inner: nn.Module, dtype: torch.dtype, device_type: str) -> None:
        super().__init__()
        self.inner, self.dtype, self.device_type = inner, dtype, device_type

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with torch.autocast(self.device_type, dtype=self.dtype):
            out = self.inner(*args, **kwargs)
        return torch.utils._pytree.tree_map(
            lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == self.dtype else t, out)


class _ChannelsLast(nn.Module):
    """NHWC weights and 4-D inputs, NCHW outputs. On the CPU, convolutions with fewer than
    :data:`MIN_NHWC_CHANNELS` input channels (an image stem) keep NCHW weights, and inputs with as
    few channels stay NCHW, so such a convolution runs NCHW and its output turns NHWC at the next."""

    def __init__(self, inner: nn.Module, device: str) -> None:
        super().__init__()
        self.inner = inner.to(memory_format=torch.channels_last)
        self.min_channels = MIN_NHWC_CHANNELS if device.split(":")[0] == "cpu" else 0
        for m in self.inner.modules():
            if isinstance(m, nn.Conv2d) and m.in_channels < self.min_channels:
                m.to(memory_format=torch.contiguous_format)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        args = tuple(a.contiguous(memory_format=torch.channels_last)
                     if isinstance(a, torch.Tensor) and a.dim() == 4 and a.shape[1] >= self.min_channels else a
                     for a in args)
        out = self.inner(*args, **kwargs)
        return torch.utils._pytree.tree_map(
            lambda t: t.contiguous() if isinstance(t, torch.Tensor) and t.dim() == 4 else t, out)


def prepare_module(module: nn.Module, cand: Candidate, device: str) -> tuple[nn.Module, list[str]]:
    """The eager module a candidate compiles: rewritten, re-laid-out and autocast as configured."""
    applied: list[str] = []
    if cand.rewrite:
        module, applied = apply_rewrites(module)
    elif cand.channels_last or cand.reduced:
        module = copy.deepcopy(module)
    if cand.channels_last:
        module = _ChannelsLast(module, device)
    if cand.reduced and cand.backend not in RUNTIME_BACKENDS:   # runtimes set their own precision
        module = _Autocast(module, LOW_PRECISION_DTYPES[cand.precision], device.split(":")[0])
    return eval_mode(module), applied


def realize(module: nn.Module, cand: Candidate, inputs: ScopeInputs | None, *, device: str = "cpu",
            machine: str = "", artifact: str | None = None, signature: str | None = None,
            spec: list[list[Any]] | None = None, weights: str | None = None,
            tensor_outputs: bool = False, template: Any = None, index_bounds: IndexBounds | None = None) -> Realized:
    """Build ``cand`` for ``module``; raises whatever the backend raises (the search records it).

    ``artifact`` (with ``signature``) loads an existing AOTInductor package instead of compiling
    (``tensor_outputs``: one returning the region's output tensors, restored by ``template`` or
    learned from the first call, see :func:`~.aoti_outputs.aoti_output_template`; ``index_bounds``: the
    package's, recorded in the plan); for torch.compile,
    which needs no inputs to build, ``signature``, ``spec`` and ``index_bounds`` (see
    :func:`compile_bounds`) stand in for the captured inputs' where ``inputs`` has none (a loaded build).
    ``weights`` is the module's :func:`weights_digest` where the caller already has it (hashing a
    large model's weights again for every candidate costs seconds).
    """
    if cand.backend == "aoti" and artifact is not None:
        runner = aoti_runner(artifact, tensor_outputs, template, module)
        return Realized(CompiledRegion(module, runner, signature, cand.config, spec, index_bounds), artifact)
    if inputs is None:
        raise ValueError(f"{cand.key} needs example inputs or an artifact")
    prepared, applied = prepare_module(module, cand, device)
    if cand.backend == "eager":
        return Realized(prepared, rewrites=applied)
    if cand.backend in RUNTIME_BACKENDS:
        return _realize_runtime(module, prepared, applied, cand, inputs, device, machine, weights)
    if cand.backend == "aoti":
        template = aoti_output_template(prepared, inputs)
        path = str(_aoti_path(module, cand, inputs, machine, weights, tensor_outputs=template is not None))
        bounds = _cached_bounds(path)
        if bounds is not None:
            touch(path)                       # least recently used goes first (cuvil_pgc._cache)
        else:
            bounds = _compile_aoti(prepared if template is None else TensorOutputs(prepared), cand, inputs, path)
            enforce_limit()
        runner = aoti_runner(path, template is not None, template, module)
        return Realized(CompiledRegion(module, runner, inputs.signature, cand.config, inputs.spec, bounds), path,
                        applied)
    if cand.cpp_wrapper:     # its wrapper is Inductor-compiled C++ loaded into this process, as a package is
        share_cxx_runtime()
    compiled = torch.compile(prepared, **_compile_kwargs(cand))
    # the captured signature: torch.compile would recompile for any other call (see CompiledRegion)
    if inputs.signature is not None:
        signature, spec = inputs.signature, inputs.spec
        index_bounds = compile_bounds(module, inputs) if device == "cpu" else None
        if index_bounds is not None and (why := unchecked_reason(index_bounds)):
            raise ExportError(why)
    return Realized(CompiledRegion(module, compiled, signature, cand.config, spec, index_bounds), rewrites=applied)


#: module -> captured input signature -> the index bounds of its program (:func:`compile_bounds`)
_COMPILE_BOUNDS: weakref.WeakKeyDictionary[nn.Module, dict[str, IndexBounds]] = weakref.WeakKeyDictionary()


def compile_bounds(module: nn.Module, inputs: ScopeInputs) -> IndexBounds:
    """The index bounds of a torch.compile region on CPU, from a ``torch.export`` of the original
    module at the captured inputs (its rewrites and precision do not change what it indexes), once
    per module and inputs: Inductor's C++ kernels check indices as AOTInductor's do, inside
    OpenMP's threads, so an id out of range aborted the process (``terminate called after throwing
    an instance of 'std::runtime_error'``, measured with torch.compile itself on a graph network
    and an embedding of ``ids + offsets``). None found where the module does not export: the
    region runs unchecked, as before."""
    known = _COMPILE_BOUNDS.setdefault(module, {})
    if inputs.signature not in known:
        try:
            with torch.no_grad():
                known[inputs.signature] = program_index_bounds(export_program(eval_mode(module), inputs))
        except ExportError as exc:
            log.debug("no index bounds for a torch.compile region: %s", exc)
            known[inputs.signature] = IndexBounds({})
    return known[inputs.signature]


def _realize_runtime(module: nn.Module, prepared: nn.Module, applied: list[str], cand: Candidate,
                     inputs: ScopeInputs, device: str, machine: str, weights: str | None) -> Realized:
    """A region exported to ONNX Runtime, OpenVINO or TensorRT (see :mod:`.runtime_build`)."""
    from cuvil_pgc.recompile.runtime_build import build_region

    with torch.no_grad():
        reference = prepared(*inputs.args, **inputs.kwargs)
    key = runtime_key(module, cand, inputs, machine, weights)
    runner, artifact, bounds = build_region(module, prepared, cand, inputs, reference, device=device, key=key)
    return Realized(CompiledRegion(module, runner, inputs.signature, cand.config, inputs.spec, bounds), artifact,
                    applied)


def runtime_key(module: nn.Module, cand: Candidate, inputs: ScopeInputs, machine: str, weights: str | None = None) -> str:
    """The artifact cache key of a runtime region's exported files: the module's structure,
    settings and weights, its program (rewritten or not), the captured inputs, the machine and torch."""
    program = f"rewrites-v{REWRITES_VERSION}" if cand.rewrite else "original"
    return "|".join([structural_hash(module), settings_digest(module), weights or weights_digest(module), program,
                     inputs.signature, machine, torch.__version__])


def inductor_options(cand: Candidate) -> dict[str, Any]:
    """Inductor config patches of a torch.compile or AOTInductor candidate."""
    options = dict(torch._inductor.list_mode_options(cand.mode)) if cand.mode != "default" else {}
    if cand.freezing:
        options["freezing"] = True
    if cand.channels_last:     # the candidate chose each conv's layout; Inductor's pass would make all NHWC
        options["layout_optimization"] = False
    return options


def _compile_kwargs(cand: Candidate) -> dict[str, Any]:
    if cand.backend == "cudagraphs":
        return {"mode": "reduce-overhead"}
    options = inductor_options(cand)
    if cand.cpp_wrapper:
        options["cpp_wrapper"] = True
    return {"options": options} if options else {}


def _compile_aoti(prepared: nn.Module, cand: Candidate, inputs: ScopeInputs, path: str) -> IndexBounds:
    """Export and package; the program's index bounds are kept beside the package (a cached package
    is not exported again)."""
    with torch.no_grad():
        exported = export_program(prepared, inputs)
        bounds = program_index_bounds(exported)
        if why := unchecked_reason(bounds):
            raise ExportError(why)
        if cand.freezing and cand.mode.startswith("max-autotune") and data_dependent_sizes(exported):
            raise RuntimeError("AOTInductor's max-autotune with freezing corrupts memory on a program whose sizes "
                               "depend on the data (a boolean mask, torch.nonzero): with torch 2.13 and 2.14 the "
                               "process died building it (\"corrupted size vs. prev_size\") or its program returned "
                               "the wrong number of rows; the same program without freezing is built")
        package_aoti(exported, cand, path)
    Path(_bounds_path(path)).write_text(json.dumps(bounds.to_record()))
    return bounds


def data_dependent_sizes(exported: Any) -> bool:
    """Whether a value of the exported program has a size only its data decides (an unbacked
    symbol: the rows a boolean mask keeps, ``torch.nonzero``)."""
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

    return any(free_unbacked_symbols(leaf) for node in exported.graph.nodes
               for leaf in torch.utils._pytree.tree_leaves(node.meta.get("val"))
               if isinstance(leaf, (torch.Tensor, torch.SymInt)))


def _bounds_path(package: str) -> str:
    return f"{package}.bounds.json"


def _cached_bounds(package: str) -> IndexBounds | None:
    """The index bounds kept beside a cached package, or None when the package (or, for one cached
    by an older cuvil-pgc, they) must be made again."""
    try:
        if not os.path.exists(package):
            return None
        record = json.loads(Path(_bounds_path(package)).read_text())
        return IndexBounds.from_record(record) or IndexBounds({})
    except (OSError, ValueError, AttributeError):        # AttributeError: JSON that is not an object
        return None


def export_program(prepared: nn.Module, inputs: ScopeInputs, *, free_sizes: bool = False) -> Any:
    """``torch.export`` of ``prepared`` for ``inputs``; with ``free_sizes`` every dimension of the
    positional tensor inputs is left to the exporter (``Dim.AUTO``, see :mod:`.other_shapes`)."""
    try:
        if not free_sizes:
            return torch.export.export(prepared, inputs.args, inputs.kwargs or None)
        dynamic = {"args": tuple({i: torch.export.Dim.AUTO for i in range(a.dim())} if isinstance(a, torch.Tensor)
                                 else None for a in inputs.args)}
        # sizes 0 and 1 stay fixed (torch.export's own rule): exported size-obliviously, as
        # torch.onnx.export does, AOTInductor's code for the zoo MLP captured at batch 1 answered
        # wrongly at batch 2, and the LSTM step's corrupted the heap ("double free or corruption")
        return torch.export.export(_Positional(prepared), inputs.args, dynamic_shapes=dynamic)
    except Exception as exc:
        raise ExportError(f"torch.export failed{quantized_note(prepared)}{data_dependent_note(exc)}: {exception_line(exc)}"
                          f"{torch_export_note(prepared)}") from exc


def package_aoti(exported: Any, cand: Candidate, path: str) -> None:
    """The AOTInductor package of an exported program with ``cand``'s Inductor options, at ``path``.

    AOTInductor writes the package's metadata into the process-wide ``aot_inductor.metadata``
    config dict in place; that dict is part of every later compile's FX graph cache key, so the
    user's own ``torch.compile`` calls after a recompile missed the cache their earlier runs had
    filled. The compile gets a copy, and the process keeps its own."""
    configs: dict[str, Any] = {"freezing": False, **inductor_options(cand)}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp.pt2"
    metadata = dict(torch._inductor.config.aot_inductor.metadata)
    with torch.no_grad(), torch._inductor.config.patch({"aot_inductor.metadata": metadata}):
        torch._inductor.aoti_compile_and_package(exported, package_path=tmp, inductor_configs=configs)
    os.replace(tmp, path)


class _Positional(nn.Module):
    """A module called with positional arguments only, under one parameter (``*args``) that
    ``dynamic_shapes`` can name whatever the wrapped forward's signature."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any) -> Any:
        return self.inner(*args)


def program_key(cand: Candidate) -> str:
    """The candidate's configuration plus the versions of the programs cuvil-pgc generates for it
    (rewrites, layout): a cached package or a recorded measurement of an older program is not
    reused for a changed one."""
    versions = [f"rewrites-v{REWRITES_VERSION}"] * cand.rewrite + [f"layout-v{LAYOUT_VERSION}"] * cand.channels_last
    if cand.backend in ("aoti", "compile"):     # the index checks its region makes (or refuses it for)
        versions.append(f"index-checks-v{INDEX_CHECKS_VERSION}")
    if cand.backend == "aoti" or cand.backend in RUNTIME_BACKENDS:   # an export of the output's tensors
        versions.append(f"outputs-v{OUTPUTS_VERSION}")
    if cand.backend in RUNTIME_BACKENDS:   # a measurement of another runtime version is not this one's
        from cuvil_pgc.recompile import runtimes
        from cuvil_pgc.recompile.runtime_build import ONNX_EXPORT_VERSION

        versions += [f"{cand.backend}-{runtimes.version(cand.backend)}", f"onnx-export-v{ONNX_EXPORT_VERSION}"]
    return "|".join([cand.config, *versions])


def measurement_key(cand: Candidate) -> str:
    """What a recorded measurement of ``cand`` is keyed by: its :func:`program_key` and, for a
    built region, the version of the region's call (:data:`~.realized.CALL_VERSION`): a time
    measured through an older call, slower or faster, is not reused (a recommender's dict of
    features ran 74 µs on ONNX Runtime before its region had a lean call, 19 µs after, and the
    records kept eager, 40 µs). Cached programs are keyed by :func:`program_key` alone."""
    return program_key(cand) if cand.backend == "eager" else f"{program_key(cand)}|call-v{CALL_VERSION}"


def _aoti_path(module: nn.Module, cand: Candidate, inputs: ScopeInputs, machine: str,
               weights: str | None = None, tensor_outputs: bool = False) -> Path:
    """The cached package's path; one of the region's output tensors (:class:`TensorOutputs`) has
    its own (:data:`~.aoti_outputs.TENSOR_OUTPUTS_KEY`)."""
    key = "|".join([structural_hash(module), settings_digest(module), weights or weights_digest(module),
                    program_key(cand), inputs.signature, machine, torch.__version__]
                   + ([TENSOR_OUTPUTS_KEY] if tensor_outputs else []))
    return cache_dir() / "artifacts" / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pt2"


def apply_plan(model: nn.Module, realized: dict[str, Realized]) -> nn.Module:
    """A copy of ``model`` with each scope ("" = whole model) replaced by its realized module."""
    if "" in realized:
        return realized[""].module
    out = copy.copy(model)
    out._modules = dict(model._modules)
    for scope, item in sorted(realized.items()):
        replace_submodule(out, scope, item.module)
    return out


def replace_submodule(root: nn.Module, qualname: str, new: nn.Module) -> None:
    """Set ``root.<qualname>`` to ``new``, shallow-copying the modules on the way (others are shared)."""
    parts = qualname.split(".")
    parent = root
    for name in parts[:-1]:
        child = copy.copy(parent._modules[name])
        child._modules = dict(child._modules)
        parent._modules[name] = child
        parent = child
    parent._modules[parts[-1]] = new
