"""Why an exporter cannot capture a module: :class:`ExportError`, which every exporting backend
raises (torch.export for AOTInductor, torch.onnx.export for the runtimes) and the search reads to
reject the candidate's siblings without building them."""

from __future__ import annotations

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
