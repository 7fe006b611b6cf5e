"""The free-size programs of :mod:`.other_shapes`: each region's export with its input sizes left
free (``Dim.AUTO``), on ONNX Runtime, OpenVINO or as an AOTInductor package, and its runner.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cuvil_pgc.recompile.apply import ScopeInputs
from cuvil_pgc.recompile.compile_apart import openvino_compiles
from cuvil_pgc.recompile.index_bounds import index_bounds
from cuvil_pgc.recompile.openvino_runner import OpenVinoRunner, openvino_config
from cuvil_pgc.recompile.ort_runner import OrtRunner
from cuvil_pgc.recompile.output_template import OutputTemplate
from cuvil_pgc.recompile.program_index_bounds import program_index_bounds
from cuvil_pgc.recompile.runtime_build import artifact_path, convert_openvino, export_onnx, knobs_of


def batch_of_two(inputs: ScopeInputs) -> ScopeInputs | None:
    """``inputs`` with their batch of one (the first dimension of every tensor input but numbers,
    where all are 1: one request) doubled, which the program for other sizes is exported at;
    None where there is none. ``torch.export`` fixes a size of 1 that the program computes with:
    GPT-2's program exported at one request took its ids at any batch and fixed the batch of its
    logits at 1, so ONNX Runtime failed at a batch of two and the program ran batch 1 only."""
    tensors = [a for a in inputs.args if isinstance(a, torch.Tensor) and a.dim() > 0]
    if not tensors or any(t.shape[0] != 1 for t in tensors):
        return None
    return ScopeInputs(tuple(torch.cat([a, a]) if isinstance(a, torch.Tensor) and a.dim() > 0 else a
                             for a in inputs.args))


def runtime_program(module: nn.Module, prepared: nn.Module, cand: Any, inputs: Any, example: Any, key: str
                    ) -> tuple[Any, str, list[list[str]], dict[int, frozenset[str]], dict[str, tuple[int, int | None]]]:
    """(runner, first file, free dimensions, named index bounds, no limits: the runtime checks the
    sizes it is given itself, see :func:`aoti_program`) of the free-size ONNX export (at
    ``example``) on ONNX Runtime or OpenVINO."""
    with torch.no_grad():
        template = OutputTemplate.of(prepared(*inputs.args))
    onnx_path = artifact_path(key, "onnx-shapes", None, ".onnx")
    if not onnx_path.exists():
        export_onnx(prepared, example, onnx_path, len(template.tensors), free_sizes=True)
    free = free_dimensions(str(onnx_path), sum(isinstance(a, torch.Tensor) for a in inputs.args))
    first = onnx_path
    if cand.backend == "openvino":
        first = artifact_path(key, "openvino-shapes", None, ".xml")
        if not first.exists():
            convert_openvino(onnx_path, first)
        openvino_compiles(str(first), openvino_config(knobs_of(cand), cand.precision))
    return program_runner(cand, str(first), template, module), str(first), free, index_bounds(str(onnx_path)).named, {}


def aoti_program(prepared: nn.Module, cand: Any, inputs: Any, example: Any, key: str
                 ) -> tuple[Any, str, list[list[str]], dict[int, frozenset[str]], dict[str, tuple[int, int | None]]]:
    """(runner, package, free dimensions, named index bounds, the sizes the program was exported
    for: :func:`export_limits`) of the free-size ``torch.export`` (at ``example``) as an
    AOTInductor package with the candidate's Inductor options (exporting again is seconds;
    compiling is cached)."""
    from cuvil_pgc.recompile.aoti_outputs import TENSOR_OUTPUTS_KEY, TensorOutputs, aoti_output_template
    from cuvil_pgc.recompile.apply import export_program, package_aoti, program_key

    template = aoti_output_template(prepared, inputs)   # as the region's own package
    with torch.no_grad():
        exported = export_program(prepared if template is None else TensorOutputs(prepared), example, free_sizes=True)
    from torch.export.graph_signature import InputKind, TensorArgument

    limits = export_limits(exported)
    placeholders = {n.name: n for n in exported.graph.nodes if n.op == "placeholder"}
    free = [[size_name(d) for d in placeholders[spec.arg.name].meta["val"].shape]
            for spec in exported.graph_signature.input_specs     # not an input captured as None or a constant
            if spec.kind == InputKind.USER_INPUT and isinstance(spec.arg, TensorArgument)]
    tensors = "" if template is None else f"|{TENSOR_OUTPUTS_KEY}"
    path = artifact_path(f"{key}|{program_key(cand)}{tensors}", "aoti-shapes", None, ".pt2")
    if not path.exists():
        package_aoti(exported, cand, str(path))
    runner = AotiRunner(str(path), template is not None, template)
    return runner, str(path), free, program_index_bounds(exported).named, limits


def export_limits(exported: Any) -> dict[str, tuple[int, int | None]]:
    """The smallest and largest size (None: no largest) an exported program's free sizes were
    exported for, by name, where the export found tighter ones than its own: a lower bound of 2 is
    ``torch.export``'s for every free size (0 and 1 it would specialize), not the model's, and the
    probes check 1 as before (a program exported at a batch of two runs one request)."""
    limits: dict[str, tuple[int, int | None]] = {}
    for symbol, bounds in getattr(exported, "range_constraints", {}).items():
        lo, hi = _finite(bounds.lower) or 0, _finite(bounds.upper)
        if lo > 2 or hi is not None:
            limits[str(symbol)] = (lo if lo > 2 else 0, hi)
    return limits


def _finite(bound: Any) -> int | None:
    """A range bound as an int; None for an infinite one (``int_oo``, which ``int()`` cannot take)."""
    if getattr(bound, "is_finite", True) is False:
        return None
    try:
        return int(bound)
    except (TypeError, ValueError, OverflowError, AttributeError):
        return None


def size_name(dimension: Any) -> str:
    """The name of an exported program's free dimension, "" where it is fixed: a number, or a SymInt
    whose expression is its number (a Qwen2 decoding step's key-value heads, "2", which was taken for
    a name and tied to the batch, captured at 2 too: the batch stayed fixed)."""
    return "" if isinstance(dimension, int) or str(dimension).isdigit() else str(dimension)


def program_runner(cand: Any, first: str, template: OutputTemplate | None, original: nn.Module | None,
                   tensor_outputs: bool = False) -> Any:
    """The runner of a program for other sizes whose first file is ``first``: the candidate's
    runtime with its knobs, but not the transformer fusions, which need fixed shapes (an
    AOTInductor package of the region's output tensors, as its region's: ``tensor_outputs``)."""
    if cand.backend == "aoti":
        return AotiRunner(first, tensor_outputs, template, original)
    knobs = {k: v for k, v in knobs_of(cand).items() if k != "fuse"}
    if cand.backend == "ort":
        return OrtRunner(first, knobs, template, original)
    return OpenVinoRunner(first, knobs, cand.precision, template, original)


class AotiRunner:
    """An AOTInductor package called with positional tensors (the runner interface of
    :class:`~.other_shapes.OtherShapes`); one of the region's output tensors (``tensor_outputs``) returns them in
    the structure of ``template``, or of the original's first output where there is none yet."""

    def __init__(self, path: str, tensor_outputs: bool = False, template: OutputTemplate | None = None,
                 original: nn.Module | None = None) -> None:
        from cuvil_pgc.recompile.aoti_loader import FastAOTI
        from cuvil_pgc.recompile.aoti_outputs import aoti_runner

        runner = aoti_runner(path, tensor_outputs, template, original)
        self._call = runner.call_positional if tensor_outputs else FastAOTI(runner)
        self._learning = runner if tensor_outputs else None      # learns its template on its first call

    @property
    def learns_template(self) -> bool:
        """Whether the next call runs the original module to learn the output's structure."""
        return self._learning is not None and self._learning.template is None

    def __call__(self, *args: Any) -> Any:
        if self.learns_template:
            return self._learning(*args)
        return self.call_positional(args)

    def call_positional(self, args: tuple[Any, ...]) -> Any:
        # the package reads its inputs at the captured strides: another layout is copied first
        return self._call(tuple(a if a.is_contiguous() else a.contiguous() for a in args
                                if isinstance(a, torch.Tensor)))


def free_dimensions(onnx_path: str, count: int) -> list[list[str]]:
    """Per graph input (the first ``count``), each dimension's symbol ("" where it is fixed)."""
    import onnx

    graph = onnx.load(onnx_path, load_external_data=False).graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers][:count]
    return [[d.dim_param if d.HasField("dim_param") else "" for d in i.type.tensor_type.shape.dim] for i in inputs]
