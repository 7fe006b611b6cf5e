"""Calls torch records rather than runs: a built region's call that torch.jit traces, torch.export
exports (torch.onnx.export's dynamo=True too) or that holds tensor subclasses (make_fx's or a
FakeTensorMode's fakes) runs the original module, for torch to record it; the build's programs run
outside what either sees, and cannot read a subclass's memory. Also Dynamo's test, which a region's
call asks before its lean and direct calls (:meth:`~.realized.CompiledRegion.__call__`)."""

from __future__ import annotations

from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil_pgc.recompile.lean_call import is_tracing

# is_dynamo_compiling is one `return False` outside a trace (True inside one: Dynamo evaluates it
# as it traces); is_compiling also calls torch.jit.is_scripting() and reads a module global, which
# cost 2-4% of a 0.35 ms ONNX Runtime GRU call deployed. Export without Dynamo traces with
# FakeTensors, which the lean path's exact type check already sends to the checked path.
compiling = getattr(torch.compiler, "is_dynamo_compiling", None) or torch.compiler.is_compiling
_Tensor = torch.Tensor
#: the tensor types whose memory a build's program reads: a module's Parameter handed to a region
#: (DeBERTa's relative-position table, a Perceiver's latents, DETR's queries) is a plain tensor's
#: memory too; under autograd such a call runs the original module for its requires_grad, as any
#: input's (``CompiledRegion._eager_only``)
_PLAIN = (_Tensor, torch.nn.Parameter)
#: why a call torch.jit traces runs the original module: a runtime's outputs come from outside
#: torch, and the trace held them as constants (a traced ONNX Runtime or OpenVINO region answered
#: every input with the traced one's result; an AOTInductor one failed the trace)
TRACED = ("torch.jit is tracing it, and records the original module: the build's programs run outside what the "
          "tracer sees, and their outputs would be the trace's constants")
#: why a call torch.export exports (torch.onnx.export's dynamo=True too) runs the original module:
#: the build's programs cannot run on its FakeTensors (the export failed: ".numpy() is not supported
#: for tensor subclasses") and would be nothing the exporter can record
EXPORTED = ("torch.export is exporting it, and records the original module: the build's programs run outside "
            "what the exporter sees")
exporting = getattr(torch.compiler, "is_exporting", None) or (lambda: False)


def call_leaves(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A call's leaves in the order an export flattens them: positional plain tensors are their own."""
    return args if not kwargs and all(type(a) is _Tensor for a in args) else pytree.tree_leaves((args, kwargs))


def recorded(args: tuple[Any, ...], kwargs: dict[str, Any], leaves: Any = None) -> str | None:
    """Why a call must run the original module for torch to record it (torch.jit's tracer,
    torch.export, tensor subclasses such as make_fx's FakeTensors, which no program of the build can
    read), or None; ``leaves``: the call's (:func:`call_leaves`), where the caller has them."""
    if exporting():                    # first: Dynamo, exporting, answers it but cannot call the tracer's test
        return EXPORTED
    if not compiling() and is_tracing():
        return TRACED
    for t in (call_leaves(args, kwargs) if leaves is None else leaves):
        if isinstance(t, torch.Tensor) and type(t) not in _PLAIN:
            return (f"an input is a {type(t).__name__}, which the build's programs cannot read (they read a plain "
                    "tensor's memory), and which records what runs")
    return None
