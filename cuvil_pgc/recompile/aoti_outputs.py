"""AOTInductor packages of a region's output tensors, for output structures a package cannot record.

An AOTInductor package records its call's input and output structure with torch's pytree
serialization, which names only registered types: a namedtuple class of the user's failed the
packaging ("Can't serialize TreeSpec of namedtuple class"), and a package returns a number in the
output (``{"n": 3}``) as a tensor; no AOTInductor candidate of such a region was built. Such a
region is packaged as :class:`TensorOutputs` (the tensors of its output, as the ONNX export
flattens them too) and run behind :class:`TensorOutputsAOTI`, whose
:class:`~.output_template.OutputTemplate` puts them back; a build records it in its plan choice's
``runtime`` (plan.json format 3, see :data:`~.plan_doc.TENSOR_OUTPUTS_FORMAT`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils import _pytree as pytree

from cuvil_pgc.recompile.aoti_loader import FastAOTI, load_aoti_package
from cuvil_pgc.recompile.object_outputs import is_output_leaf, output_tensors
from cuvil_pgc.recompile.output_template import OutputTemplate
from cuvil_pgc.recompile.output_values import check_constant_outputs
from cuvil_pgc.recompile.runtime_region import RuntimeRunner

#: what a package of the region's output tensors adds to its cache key (the region's own package
#: and the one for other input sizes): a package cached by a version that packaged the whole output
#: is never taken for one
TENSOR_OUTPUTS_KEY = "tensor outputs"


class TensorOutputs(nn.Module):
    """The region with its output flattened to the tensors in it (those inside an object the
    pytree leaves whole too, see :mod:`.object_outputs`): what an ONNX graph can return,
    and what an AOTInductor package returns where its call spec cannot record the structure; the
    runner's :class:`~.output_template.OutputTemplate` puts them back into the original structure."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, ...]:
        return tuple(output_tensors(self.inner(*args, **kwargs)))


def aoti_output_template(prepared: nn.Module, inputs: Any) -> OutputTemplate | None:
    """None where an AOTInductor package returns the region's output as it is; else its
    structure, for a package of the region's output tensors (:class:`TensorOutputs`): where the
    call spec cannot record the structure, and where the output holds values other than tensors
    (a package returns ``{"n": 3}``'s 3 as a tensor, which the accuracy guard refused, so no
    AOTInductor candidate of such a region was built). ``inputs`` are the region's
    :class:`~.apply.ScopeInputs`.

    Such values are put back as the example call's: an output that changes with the input values
    (a number computed from them, a dataclass holding tensors that the pytree does not open) raises
    :class:`~.export_error.ExportError`, see :func:`~.output_values.check_constant_outputs` (a
    dataclass output's package returned the example's tensors for every input)."""
    with torch.no_grad():
        out = prepared(*inputs.args, **inputs.kwargs)
    leaves, spec = pytree.tree_flatten(out, is_leaf=is_output_leaf)
    if any(type(leaf) is not torch.Tensor for leaf in leaves):
        check_constant_outputs(prepared, inputs, out, "torch.export")
        return OutputTemplate.of(out)
    try:
        pytree.treespec_dumps(spec)
        return None
    except Exception:        # a type without a serialized name (torch raises NotImplementedError)
        return OutputTemplate.of(out)


def aoti_runner(path: str, tensor_outputs: bool, template: Any, original: nn.Module) -> Any:
    """The loaded AOTInductor package at ``path``: as torch loads it, or for a package of the
    region's output tensors (``tensor_outputs``), behind :class:`TensorOutputsAOTI`
    (:func:`~.aoti_loader.load_aoti_package` loads it)."""
    compiled = load_aoti_package(path)
    return TensorOutputsAOTI(compiled, template, original) if tensor_outputs else compiled


class TensorOutputsAOTI(RuntimeRunner):
    """An AOTInductor package returning the region's output tensors (see
    :func:`aoti_output_template`); the template rebuilds the original structure. Without one (a
    loaded build: a namedtuple's class cannot be written into plan.json) the first call runs the
    original module and learns it, as the runtime backends' runners do."""

    def __init__(self, compiled: Any, template: Any, original: nn.Module) -> None:
        super().__init__(template, original)
        self.package = compiled
        self._positional = FastAOTI(compiled)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.template is None:
            return super().__call__(*args, **kwargs)
        return self.template.build(list(self.package(*args, **kwargs)))

    def call_positional(self, args: tuple[Any, ...]) -> Any:
        if self.template is None:
            return super().__call__(*args)
        return self.template.build(list(self._positional(args)))
