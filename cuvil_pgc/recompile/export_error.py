"""Why an exporter cannot capture a module: :class:`ExportError`, which every exporting backend
raises (torch.export for AOTInductor, torch.onnx.export for the runtimes) and the search reads to
reject the candidate's siblings without building them."""

from __future__ import annotations

import os
import re
import sys
from typing import Any


class ExportError(RuntimeError):
    """An exporter cannot capture a module (data-dependent control flow, unsupported Python or
    operators): every build of that module through the same exporter fails the same way, whatever
    its options. The message starts with the exporter's name (``torch.export failed: ...``,
    ``torch.onnx.export failed: ...``; see :func:`~.runtime_build.exporters`)."""

    @property
    def exporter(self) -> str:
        return exporter_of_reason(str(self))


def exporter_of_reason(reason: str) -> str:
    """The exporter named at the start of an ExportError's message (or of a rejection reason)."""
    return reason.removeprefix(f"{ExportError.__name__}: ").split(" failed", 1)[0]


#: where torch keeps the modules of its eager and FX quantization (torch.ao.quantization's
#: ``convert``, ``convert_fx``, ``quantize_dynamic``), whose weights are packed into TorchScript
#: objects that neither torch.export nor torch.onnx.export takes
_PACKED_QUANTIZED = ("torch.ao.nn.quantized.", "torch.ao.nn.intrinsic.quantized.", "torch.nn.quantized.",
                     "torch.nn.intrinsic.quantized.")


def quantized_note(module: Any) -> str:
    """What to add to an export failure of ``module`` where it holds torch.ao's packed quantized
    modules: the cause, which the exporters' own messages (``Conv2dPackedParamsBase ... does not
    have a field with name '__obj_flatten__'``) do not name, and the quantization flow whose
    programs export. Empty for any other module."""
    names = sorted({type(m).__name__ for m in module.modules()
                    if type(m).__module__.startswith(_PACKED_QUANTIZED) and not type(m).__name__.endswith("Params")})
    if not names:
        return ""
    listed = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
    return (f" (the region holds torch.ao quantized modules ({listed}), whose packed weights no exporter takes: "
            "quantize it with the PT2E flow (torchao's prepare_pt2e/convert_pt2e), whose quantize and dequantize "
            "ops torch.export and torch.onnx.export capture)")


#: torch.export's account of the user's line whose call raised (after "The following call raised this error:")
_RAISING_CALL = re.compile(r'The following call raised this error:\s*\n\s*File "([^"]+)", line (\d+), in \S+\s*\n\s*(.+)')


class TracedDecision(RuntimeError):
    """torch.jit.trace saw Python code turn a tensor into a Python value (a bool, a number, a
    list) at ``where`` (``path:line (`code`)``): its trace keeps the one path that value took as a
    constant, which answers the captured inputs right and others wrong."""

    def __init__(self, where: str):
        super().__init__(f"torch.jit.trace would keep the path the captured inputs took at {where.split(' (')[0]} "
                         "as a constant")
        self.where = where


#: torch.export's suggested fixes for a guard on an unbacked size ("insert one of the following checks")
_SUGGESTED_CHECK = re.compile(r"^\s*\d+\. (torch\._check\(.+\))\s*$", re.M)


def data_dependent_note(exc: BaseException) -> str:
    """What to add to an export failure where the module's Python code decides on a tensor's value
    (``if h.mean() > 0.25:``, ``int(n)`` as a size): torch.export's own first line reads "Could not
    guard on data-dependent expression Eq(u0, 1)", which names neither the line nor the fix. The
    line is the one torch.export says raised, where it says so (or the :class:`TracedDecision`'s).
    Empty for any other failure."""
    seen: list[BaseException] = []
    while exc is not None and exc not in seen:          # the ONNX exporter wraps torch.export's error
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    traced = next((e for e in seen if isinstance(e, TracedDecision)), None)
    found = [e for e in seen if type(e).__name__ == "GuardOnDataDependentSymNode"
             or "Could not guard on data-dependent expression" in str(e)]
    if traced is None and not found:
        return ""
    match = None if traced is not None else _RAISING_CALL.search(str(found[0]))
    if match and _not_the_users(match.group(1)):    # a wrapper of ours calling torch's code (an LSTM on a packed sequence)
        match = None
    where = f"at {traced.where} " if traced is not None else \
        f"at {match.group(1)}:{match.group(2)} (`{' '.join(match.group(3).split())}`) " if match else ""
    checks = [] if traced is not None else _SUGGESTED_CHECK.findall(str(found[0]))
    if checks:          # torch.export asks for a fact about a size the data decides (the rows torch.unique keeps)
        listed = " or ".join(f"`{c.strip()}`" for c in checks[:2])
        return (f" (the code {where}needs a fact about a size its data decides, which the exporter cannot assume: "
                f"state it before that line with torch.export's suggestion, {listed}, or move that code out of the "
                "region)")
    return (f" (the code {where}decides on a tensor's value in Python, which an exporter cannot capture as "
            "one program: keep the decision in tensors (torch.where, torch.cond), or move that code out of the region)")


def _not_the_users(path: str) -> bool:
    """Whether ``path`` is torch's or cuvil-pgc's own code, which a user cannot change."""
    import torch

    own = [os.path.dirname(os.path.realpath(m.__file__)) + os.sep for m in (torch, sys.modules["cuvil_pgc"])]
    return os.path.realpath(path).startswith(tuple(own))
