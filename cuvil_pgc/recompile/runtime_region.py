"""Running an exported region on a runtime behind the module's own call: the runners' common part.

A runner takes the region's positional and keyword arguments, hands the tensors among them to the
runtime without copying them (contiguous CPU tensors as NumPy views, which ONNX Runtime's CPU
provider and OpenVINO's shared-memory inputs read in place), wraps the runtime's result arrays as
torch tensors without copying them, and returns them in the structure the original module
returned (:class:`~.output_template.OutputTemplate`). The runtimes' own runners:
:mod:`.ort_runner`, :mod:`.openvino_runner`, and :class:`TensorRTRunner` here (torch tensors in
and out). A runner is wrapped in :class:`~.realized.CompiledRegion`, which runs the original
module for inputs of another signature (the exports are shape-specialized).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil_pgc.recompile.object_outputs import output_tensors
from cuvil_pgc.recompile.onnx_index_checks import OUT_OF_RANGE, IndexCheckFailed
from cuvil_pgc.recompile.output_template import OutputTemplate


def tensor_leaves(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors among a call's arguments in the order an export flattens them."""
    return [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]


class RuntimeRunner:
    """Calls a runtime with a region's arguments; subclasses implement :meth:`run`.

    Without a template (a loaded build whose output structure could not be serialized) the first
    call runs ``original`` and learns the structure from its output.
    """

    def __init__(self, template: OutputTemplate | None, original: Callable[..., Any] | None = None) -> None:
        self.template = template
        self._original = original

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.template is None:
            out = self._original(*args, **kwargs)
            self.template = OutputTemplate.of(out)
            return out
        inputs = [t if t.is_contiguous() else t.contiguous() for t in tensor_leaves(args, kwargs)]
        return self.template.build(self.run(inputs))

    @property
    def learns_template(self) -> bool:
        """Whether the next call runs ``original`` to learn the output's structure (then it must
        get the region's whole call, not its tensors alone)."""
        return self.template is None

    def call_positional(self, args: tuple[Any, ...]) -> Any:
        """The call for exactly the captured positional tensors (:class:`~.realized.CompiledRegion`
        checked them): no flattening of the arguments. Measured on the zoo transformer under ONNX
        Runtime: the generic call cost 35% over a bare ``session.run`` with NumPy feeds."""
        if self.template is None:
            return self(*args)
        return self.template.build(self.run([t if t.is_contiguous() else t.contiguous() for t in args]))

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        raise NotImplementedError

    def lean_parts(self, spec: list[tuple[Any, ...]]) -> tuple[int, list[tuple[Any, ...]], Callable[..., Any], bool,
                                                              Any] | None:
        """What :meth:`~.realized.CompiledRegion.__call__` needs to hand the captured CPU inputs'
        NumPy views straight to the runtime: the input count, each input's (shape, dtype), the
        array call (:attr:`_arrays`), whether the output is the runtime's one tensor, and the
        template's build for any other output (:attr:`~.output_template.OutputTemplate.lean_build`).
        None where that does not apply (CUDA, bf16 inputs, no template yet, a runtime without an
        array call)."""
        template = self.template
        if template is None or not spec or any(dev.type != "cpu" or dtype == torch.bfloat16
                                               for _, dtype, dev, _ in spec):
            return None
        run = self._arrays
        if run is None:
            return None
        return len(spec), [(shape, dtype) for shape, dtype, _, _ in spec], run, template.is_single, template.lean_build

    #: NumPy input arrays -> output tensors: the runtime's own CPU call, which :meth:`run` and
    #: :meth:`lean_parts` hand out, made on first use (None: a runtime without one has no lean call)
    _arrays: Callable[[list[Any]], list[torch.Tensor]] | None = None


def index_checked(call: Callable[[list[Any]], list[torch.Tensor]],
                  runtime: str) -> Callable[[list[Any]], list[torch.Tensor]]:
    """The array call of a program with index checks (its last output counts the indices out of
    range: :mod:`.onnx_index_checks`): its other outputs, or :class:`~.onnx_index_checks.IndexCheckFailed`
    where that count is not 0 or the runtime failed (ONNX Runtime refuses some indices past the
    end itself), for the region to run the original module."""

    def checked(arrays: list[Any]) -> list[torch.Tensor]:
        try:
            outputs = call(arrays)
        except Exception as exc:
            raise IndexCheckFailed(f"{runtime} failed on it ({type(exc).__name__}: "
                                   f"{str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}), "
                                   "in a program that computes indices from its inputs") from exc
        if outputs.pop().item():
            raise IndexCheckFailed(OUT_OF_RANGE)
        return outputs
    return checked


def runtime_threads(knobs: dict[str, str]) -> int:
    """The runtime's intra-op threads: the ``threads`` knob, else torch's (the deployment's count)."""
    return int(knobs["threads"]) if "threads" in knobs else torch.get_num_threads()



def numpy_view(t: torch.Tensor) -> Any:
    """A NumPy view of a CPU tensor (bf16, which NumPy lacks, as its raw 16-bit words); detached: a
    runtime's result carries no autograd history, so an input that requires grad is read as data."""
    t = t.detach()
    return t.view(torch.int16).numpy().view("uint16") if t.dtype == torch.bfloat16 else t.numpy()



# ----------------------------------------------------------------------------- TensorRT

class TensorRTRunner(RuntimeRunner):
    """A Torch-TensorRT program (an exported program whose engines run the graph): torch tensors in
    and out, so no conversion at all; the template only restores the original output structure."""

    def __init__(self, program: Callable[..., Any], template: OutputTemplate | None,
                 original: Callable[..., Any] | None = None) -> None:
        super().__init__(template, original)
        self.program = program

    def call_positional(self, args: tuple[Any, ...]) -> Any:
        return self(*args)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.template is None:
            return super().__call__(*args, **kwargs)
        out = self.program(*args, **kwargs)
        return self.template.build(output_tensors(out))
