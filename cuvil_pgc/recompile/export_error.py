"""Why an exporter cannot capture a module: :class:`ExportError`, which every exporting backend
raises (torch.export for AOTInductor, torch.onnx.export for the runtimes) and the search reads to
reject the candidate's siblings without building them."""

from __future__ import annotations


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
