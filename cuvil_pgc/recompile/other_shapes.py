"""Runtime regions for input sizes other than the captured ones (``recompile(..., dynamic=True)``).

A region's exported program is specialized to the captured input shapes: that is what runs
fastest (with every size known, the exporters fold the shape arithmetic away; the same zoo
transformer ran 108 µs static against 122 µs with free sizes under ONNX Runtime). A service that
calls with other batch sizes or sequence lengths ran the original module for each of those calls.
With ``dynamic=True`` the build also ships, for each ONNX Runtime, OpenVINO and AOTInductor region
on the CPU, a second export of the region whose input dimensions the exporter left free
(``Dim.AUTO``: free where the program allows other sizes, fixed where it does not, such as a hidden
size tied to a weight; exported at a batch of two where the captured call is one request, see
:func:`~.free_size_programs.batch_of_two`): the same ONNX file's runtime, or an AOTInductor package compiled with the
region's Inductor options. The captured shapes keep the specialized program; calls that differ only in free
dimensions run the second one; any other call runs the original module.

The second program passes the accuracy guard at the captured inputs and at probes of other sizes
(the captured inputs tiled or cropped along the free dimensions, so token ids stay valid ids)
before it ships (:mod:`.size_probes`), and runs the sizes up to where it stops being faster than the
original module (:mod:`.size_speed`); a dimension it gets wrong stays fixed, and a program that gets
every one wrong is left out with the reason. In a build its files are the members ``<backend>/<n>-shapes<suffix>``, covered by the manifest and the signature like every other member,
and the plan's choice records them in ``other_shapes``: ``{"artifact": member, "inputs": [[dtype,
[size or null, ...]], ...]}`` (null: a free dimension; an input that is null itself was captured
as None, as a tokenizer's mapping that skips GPT-2's ``past_key_values`` leaves it, and the
program does not take it; ``{"value": v}``, an input captured as a number, string or bool, such as
a Hugging Face model's ``use_cache=False``, which the program holds and a call must repeat), and ``index_bounds``, ``{position: [size or size name, ...]}``, where an
input's indices address a tensor sized by the inputs (see :class:`OtherShapes`; plan.json format
4). A cuvil-pgc that
predates them ignores the record and runs the original module for other sizes, as before (one that
predates the null inputs warns that the record is malformed, and does the same).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from cuvil_pgc._example_inputs import forward_parameters
from cuvil_pgc.recompile._stderr import exception_line
from cuvil_pgc.recompile.apply import ScopeInputs
from cuvil_pgc.recompile.call_binding import CAPTURED_VALUES, bind_call, keyword_count
from cuvil_pgc.recompile.free_size_programs import aoti_program, batch_of_two, program_runner, runtime_program
from cuvil_pgc.recompile.index_bounds import describe, out_of_range
from cuvil_pgc.recompile.lean_call import FREE_NAMES, VALUE
from cuvil_pgc.recompile.runtime_build import ARTIFACT_SUFFIXES, IN_PROGRAM
from cuvil_pgc.recompile.size_probes import (
    OtherShapesError,
    ceilings_of,
    checked_sizes,
    compare,
    faster_ranges,
    shapes_text,
    within_limits,
)
from cuvil_pgc.recompile.size_programs import SizePrograms, default_capacity

log = logging.getLogger(__name__)

#: backends whose regions get a program for other sizes (CPU only)
BACKENDS = ("ort", "openvino", "aoti")


@dataclass(frozen=True)
class Constant:
    """A positional input captured as a value (:data:`~.call_binding.CAPTURED_VALUES`), which the program holds: a
    call must pass the same value, of the same type."""

    value: bool | int | float | str


def _constant(value: Any) -> Constant:
    """A recorded :class:`Constant` (ValueError for a value of another type)."""
    if type(value) not in CAPTURED_VALUES:
        raise ValueError(value)
    return Constant(value)


@dataclass
class OtherShapes:
    """A region's program for other input sizes, and which sizes it takes.

    Each input's dimensions are a fixed size or the name of a size that varies; dimensions with the
    same name must have the same size in a call (token ids and their attention mask share a batch
    and a length), and each name's sizes are bounded by the range the accuracy guard checked."""

    runner: Any       # calls a tuple of tensors (call_positional), or the whole call while it learns_template
    #: per positional input: dtype and dimensions, None for an input captured as None (a
    #: tokenizer's mapping that skips GPT-2's past_key_values), which the program does not take, or
    #: the :class:`Constant` it was captured as (``use_cache=False``), which the program holds
    inputs: list[tuple[torch.dtype, tuple[int | str, ...]] | Constant | None]
    ranges: dict[str, tuple[int, int]]                          # per size name: the smallest and largest checked
    artifact: str                                               # its first local file
    #: positional input -> the sizes (a number, or a size name of ``inputs``) of the tensors its
    #: indices address, where one is sized by the call (a graph's nodes: ``x[src]``); a call with an
    #: index outside one does not fit (see :mod:`.index_bounds`)
    index_bounds: dict[int, tuple[int | str, ...]] = field(default_factory=dict)
    #: programs of their own for the sizes called often (:class:`~.size_programs.SizePrograms`;
    #: None: every call runs ``runner``)
    size_programs: Any = None
    #: at build: why sizes the exporter left free stay fixed (the program failed or answered
    #: differently at them; the build warns), not recorded in the plan
    fixed: list[str] = field(default_factory=list)

    def fits(self, args: tuple[Any, ...]) -> bool:
        """Whether ``args`` are CPU tensors this program was checked for (see :meth:`misfit`)."""
        return self.misfit(args) is None

    def misfit(self, args: tuple[Any, ...]) -> str | None:
        """Why ``args`` do not fit: CPU tensors of the dtypes, fixed sizes, equal named sizes and
        ranges this program takes; None where they fit."""
        if len(args) != len(self.inputs):
            return f"{len(args)} positional inputs, built for {len(self.inputs)}"
        sizes: dict[str, int] = {}
        for i, (a, spec) in enumerate(zip(args, self.inputs, strict=True)):
            if spec is None:
                if a is not None:
                    return f"input {i} is a {type(a).__name__}, built for None"
                continue
            if isinstance(spec, Constant):
                if type(a) is not type(spec.value) or a != spec.value:
                    return f"input {i} is {a!r}, built for {spec.value!r}"
                continue
            dtype, dims = spec
            if not isinstance(a, torch.Tensor) or a.dtype != dtype or not a.is_cpu:
                return f"input {i} is not a {dtype} CPU tensor"
            if a.dim() != len(dims):
                return f"input {i} has {a.dim()} dimensions, built for {len(dims)}"
            for j, (d, n) in enumerate(zip(dims, a.shape, strict=True)):
                if type(d) is int:
                    if d != n:
                        return f"dimension {j} of input {i} is {n}, built for {d} only"
                elif sizes.setdefault(d, n) != n:
                    return f"dimension {j} of input {i} is {n} where an earlier input's is {sizes[d]} (built for them equal)"
        for name, n in sizes.items():
            lo, hi = self.ranges[name]
            if not lo <= n <= hi:
                return f"a size of {n} is outside the sizes {lo}-{hi} its program for other sizes was checked at"
        for i, bounds in self.index_bounds.items():
            for bound in bounds:
                rows = bound if type(bound) is int else sizes[bound]
                if out_of_range(args[i], rows):
                    return (f"input {i} holds an index outside {describe(rows)}, the rows of what it indexes in this "
                            "call: the program does not check indices as eager does, and the original module "
                            "raises eager's error")
        return None

    def __call__(self, args: tuple[Any, ...]) -> Any:
        """Run ``args`` (which :meth:`fits`: positional tensors and the captured Nones, which the
        program does not take, so no flattening of the call)."""
        tensors = tuple(a for a in args if isinstance(a, torch.Tensor))
        sizes = self.size_programs
        own = sizes.runner(tensors, args) if sizes is not None else None
        runner = self.runner if own is None else own
        if runner.learns_template:           # its first call runs the original module: called as the region is,
            return runner(*args)             # its Nones in place (a T5 given ids and decoder ids raised without)
        return runner.call_positional(tensors)

    def lean_positions(self) -> list[tuple[Any, ...] | None] | None:
        """Per positional input, what a lean call checks (see :meth:`~.realized.CompiledRegion._lean_call`):
        None, (:data:`~.lean_call.VALUE`, value), or (free shape, dtype, the CPU, None), the free
        shape a list of sizes and (name, smallest, largest) (:func:`~.lean_call.python_lean_arrays`);
        None where it has more named sizes than a lean call checks."""
        if len(self.ranges) > FREE_NAMES:
            return None
        names = {name: k for k, name in enumerate(self.ranges)}
        cpu = torch.device("cpu")
        return [None if spec is None else (VALUE, spec.value) if isinstance(spec, Constant)
                else ([d if type(d) is int else (names[d], *self.ranges[d]) for d in spec[1]], spec[0], cpu, None)
                for spec in self.inputs]

    def compile_sizes(self, module: nn.Module, rtol: float | None, atol: float | None, *,
                      capacity: int | None = None, label: str = "a region") -> None:
        """Give this program up to ``capacity`` programs of their own for the sizes called often
        (None: :func:`~.size_programs.default_capacity` of ``module``'s weights), where its runtime
        compiles them (``runner.size_compiler()``; :mod:`.size_programs`), each checked against
        ``module`` (the original) by the accuracy guard at ``rtol``/``atol`` (as at the probes)."""
        if capacity is None:
            capacity = default_capacity(sum(t.numel() * t.element_size()
                                            for t in (*module.parameters(), *module.buffers())),
                                        kept=getattr(self.runner, "SOURCE_COPIES", 0))
        size_compiler = getattr(self.runner, "size_compiler", None)
        compile = size_compiler() if size_compiler is not None and capacity > 0 else None
        if compile is None:
            return

        def check(runner: Any, args: tuple[Any, ...]) -> None:
            if not compare(runner, module, args, rtol, atol):
                raise OtherShapesError(f"the original module refuses sizes {shapes_text(args)}")
        self.size_programs = SizePrograms(compile, check, capacity=capacity, label=label)

    def to_json(self, member: str) -> dict[str, Any]:
        doc = {"artifact": member,
               "inputs": [None if spec is None else {"value": spec.value} if isinstance(spec, Constant)
                          else [str(spec[0]).removeprefix("torch."), list(spec[1])]
                          for spec in self.inputs],
               "ranges": {name: list(r) for name, r in self.ranges.items()}}
        if self.index_bounds:          # a plan holding them is format 4 (see plan_doc.SIZE_BOUNDS_FORMAT)
            doc["index_bounds"] = {str(i): list(b) for i, b in sorted(self.index_bounds.items())}
        if getattr(self.runner, "checks_indices", False):     # format 5 (plan_doc.PROGRAM_CHECKS_FORMAT)
            doc["index_checks"] = IN_PROGRAM
        return doc


def build_other_shapes(module: nn.Module, prepared: nn.Module, cand: Any, inputs: Any, *, key: str,
                       rtol: float | None, atol: float | None, sized: frozenset[int] = frozenset()) -> OtherShapes:
    """The program of ``cand`` (an ONNX Runtime, OpenVINO or AOTInductor candidate) for ``module`` at
    other input sizes, checked against ``module`` at probes of other sizes; raises
    :class:`OtherShapesError` (or :class:`~.export_error.ExportError`).

    ``prepared`` is the module the region exports (rewrites applied), ``key`` the region's
    artifact cache key (:func:`~.apply.runtime_key`), ``sized`` the tensor inputs whose indices
    address a tensor sized by the inputs (:attr:`~.index_bounds.IndexBounds.sized`): the program
    checks each against the size of the call's input that sizes it (a graph's nodes, the rows of
    ``x``), found in the program for other sizes, or is refused where no input's dimension is that size."""
    from cuvil_pgc.recompile.export_error import ExportError

    if cand.backend not in BACKENDS:
        raise OtherShapesError(f"only ONNX Runtime, OpenVINO and AOTInductor regions get one, not {cand.backend}")
    if inputs.kwargs:             # a parent's keyword call: the program takes it bound to the forward's positions
        inputs = _bound_positionally(module, inputs)
    if not any(isinstance(a, torch.Tensor) for a in inputs.args) \
            or not all(a is None or isinstance(a, torch.Tensor) and a.is_cpu or type(a) in CAPTURED_VALUES
                       for a in inputs.args):
        raise OtherShapesError("it is called with other than CPU tensors (and Nones, numbers, strings and bools)")
    batched = batch_of_two(inputs)
    if batched is not None:
        try:
            return _checked_program(module, prepared, cand, inputs, batched, f"{key}|batch of two", rtol, atol, sized)
        except (ExportError, OtherShapesError) as exc:
            log.debug("cuvil-pgc: the program for other sizes exported at a batch of two: %s; exporting it at "
                      "the captured batch of one", exc)
    return _checked_program(module, prepared, cand, inputs, inputs, key, rtol, atol, sized)


def _checked_program(module: nn.Module, prepared: nn.Module, cand: Any, inputs: ScopeInputs, example: ScopeInputs,
                     key: str, rtol: float | None, atol: float | None, sized: frozenset[int]) -> OtherShapes:
    """:func:`build_other_shapes` with the program exported at ``example`` (``inputs``, or their
    batch doubled) under the cache key ``key``, and checked at ``inputs``."""
    from cuvil_pgc.recompile.export_error import ExportError

    try:
        if cand.backend == "aoti":
            runner, first, free, named, limits = aoti_program(prepared, cand, inputs, example, key)
        else:
            runner, first, free, named, limits = runtime_program(module, prepared, cand, inputs, example, key)
    except (ExportError, OtherShapesError):
        raise
    except Exception as exc:
        raise OtherShapesError(exception_line(exc, 200)) from exc
    if not any(name for sizes in free for name in sizes):
        raise OtherShapesError("the exporter fixed every input dimension (the program allows no other sizes)")
    free = _at_positions(inputs.args, free)
    where = _sized_at(inputs.args, free, named, sized)
    # an AOTInductor kernel checks its index arithmetic inside OpenMP's threads, where a failed
    # check ends the process (std::terminate): it is never probed with sizes it named apart
    # varying alone (a Llama returning its cache accepted token ids one longer than their mask in
    # eager; the package aborted the recompile)
    names, ranges, fixed = checked_sizes(within_limits(runner, free, limits), module, inputs.args, free, rtol, atol,
                                         alone_probes=cand.backend != "aoti", ceilings=ceilings_of(module, inputs.args))
    ranges, slower = faster_ranges(runner, module, inputs.args, names, ranges)
    bounds = {p: tuple(names[i][j] or int(inputs.args[i].shape[j]) for i, j in dims) for p, dims in where.items()}
    return OtherShapes(runner, [(a.dtype, tuple(name or n for name, n in zip(dims, a.shape, strict=True)))
                                if isinstance(a, torch.Tensor) else None if a is None else Constant(a)
                                for a, dims in zip(inputs.args, names, strict=True)], ranges, first, bounds,
                       fixed=fixed + slower)


def _bound_positionally(module: nn.Module, inputs: ScopeInputs) -> ScopeInputs:
    """A keyword call (a Hugging Face layer's ``attention_mask=...``) as the positional call a loaded
    region binds such a call to at other sizes (:meth:`~.realized.CompiledRegion._positional`);
    raises :class:`OtherShapesError` where it binds to none."""
    params = forward_parameters(module)
    bound = None if params is None else bind_call(params, module, inputs.args, inputs.kwargs,
                                                  keyword_count(params, inputs.args, inputs.kwargs))
    if bound is None:
        raise OtherShapesError(f"it is called with keyword arguments ({', '.join(sorted(inputs.kwargs))}) that do not "
                               "bind to its forward's positions")
    return ScopeInputs(bound)


def _sized_at(args: tuple[Any, ...], free: list[list[str]], named: dict[int, frozenset[str]],
              sized: frozenset[int]) -> dict[int, list[tuple[int, int]]]:
    """Positional input -> the (input, dimension) of each size its indices address, for the tensor
    inputs ``sized`` (counted among the tensors, as :class:`~.index_bounds.IndexBounds`); raises
    :class:`OtherShapesError` for one whose size is no input's dimension in the program."""
    tensors = [i for i, a in enumerate(args) if isinstance(a, torch.Tensor)]
    dims = {name: (i, j) for i in reversed(range(len(free))) for j, name in reversed(list(enumerate(free[i])))
            if name}
    where: dict[int, list[tuple[int, int]]] = {}
    for p in sorted(sized):
        sizes = named.get(p)
        missing = sorted(n for n in sizes or () if n not in dims)
        if p >= len(tensors) or not sizes or missing:
            raise OtherShapesError(f"input {p} indexes a tensor sized by the inputs (a graph's nodes, say), and in the "
                                   f"program for other sizes that size ({', '.join(missing) or 'unknown'}) is no "
                                   "input's dimension: no check before the call could bound it")
        where[tensors[p]] = [dims[n] for n in sorted(sizes)]
    return where


def _at_positions(args: tuple[Any, ...], free: list[list[str]]) -> list[list[str]]:
    """The exported program's free dimensions per tensor input, placed at the positions of the
    call's arguments (none for an argument captured as None, which the program does not take)."""
    per_tensor = iter(free)
    return [next(per_tensor) if isinstance(a, torch.Tensor) else [] for a in args]


def package_members(backend: str, index: int, first: str) -> dict[str, str]:
    """member name -> local file of a region's program for other sizes (the first is the one the
    plan names)."""
    from pathlib import Path

    return {f"{backend}/{index}-shapes{suffix}": str(Path(first).with_suffix(suffix)) for suffix in _suffixes(backend)}


def _suffixes(backend: str) -> tuple[str, ...]:
    return ARTIFACT_SUFFIXES.get(backend, (".pt2",))        # AOTInductor: one package


def load_other_shapes(vb: Any, choice: Any, region: Any, extract_dir: Any, device: str,
                      tolerances: dict[str, Any] | None = None, size_programs: int | None = None) -> None:
    """Give a loaded build's ``region`` (a :class:`~.realized.CompiledRegion`) the program for other
    sizes its ``choice`` records in ``other_shapes``, from the verified build
    ``vb``, with up to ``size_programs`` programs of their own for sizes called often, checked at
    the build's ``tolerances`` (:meth:`OtherShapes.compile_sizes`). A malformed record is warned
    about and left out (the region then runs the original module for other sizes, as a build
    without one does)."""
    from cuvil_pgc.recompile.aoti_outputs import TensorOutputsAOTI
    from cuvil_pgc.recompile.output_template import TENSOR_DTYPES

    record = choice.other_shapes
    cand = choice.candidate
    if record is None or device != "cpu" or cand.backend not in BACKENDS:
        return
    try:
        stem = record["artifact"].rsplit(".", 1)[0]
        inputs = [None if spec is None else _constant(spec["value"]) if isinstance(spec, dict)
                  else (TENSOR_DTYPES[spec[0]], tuple(d if isinstance(d, str) else int(d) for d in spec[1]))
                  for spec in record["inputs"]]
        ranges = {str(name): (int(lo), int(hi)) for name, (lo, hi) in record["ranges"].items()}
        if any(isinstance(d, str) and d not in ranges for spec in inputs if isinstance(spec, tuple) for d in spec[1]):
            raise KeyError("a size without a range")
        bounds = {int(i): tuple(b if isinstance(b, str) else int(b) for b in sizes)
                  for i, sizes in record.get("index_bounds", {}).items()}
        if any(not 0 <= i < len(inputs) or not isinstance(inputs[i], tuple) or not sizes
               or any(isinstance(b, str) and b not in ranges or isinstance(b, int) and b < 1 for b in sizes)
               for i, sizes in bounds.items()):
            raise KeyError("an index bound that is not a size of the inputs")
    except (AttributeError, KeyError, TypeError, ValueError):
        log.warning("cuvil-pgc: the build's record of the program for other input sizes of %s is malformed; "
                    "other sizes run the original module", choice.label)
        return
    tensors = [i for i, spec in enumerate(inputs) if isinstance(spec, tuple)]
    if any(p >= len(tensors) or tensors[p] not in bounds for p in region.sized_bounds):
        log.warning("cuvil-pgc: the program for other input sizes of %s does not check the indices its region "
                    "bounds by the captured sizes; other sizes run the original module", choice.label)
        return
    local = {suffix: str(vb.extract(stem + suffix, extract_dir)) for suffix in _suffixes(cand.backend)}
    first = local[_suffixes(cand.backend)[0]]
    template = getattr(region.compiled, "template", None)     # runtimes rebuild the output's structure
    runner = program_runner(cand, first, template, region.original, isinstance(region.compiled, TensorOutputsAOTI))
    other = OtherShapes(runner, inputs, ranges, first, bounds)
    tolerances = tolerances or {}
    other.compile_sizes(region.original, tolerances.get("rtol"), tolerances.get("atol"), capacity=size_programs,
                        label=choice.label)
    region.other_shapes = other
