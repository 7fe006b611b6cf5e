"""A stand-in for ``torch_tensorrt`` with the real module's call shapes (compile / save / load), so the
TensorRT backend is tested on machines without a GPU. ``compile`` records its arguments and returns
the module exported by torch.export (a real Torch-TensorRT program is an exported program too,
whose graph calls the engines); ``save`` and ``load`` go through torch.export's own files."""

from __future__ import annotations

from typing import Any

import torch

__version__ = "2.9.0+fake"
calls: list[dict[str, Any]] = []


def compile(module: Any, ir: str = "default", inputs: Any = None, arg_inputs: Any = None,
            kwarg_inputs: Any = None, enabled_precisions: Any = None, **kwargs: Any) -> Any:
    calls.append({"ir": ir, "arg_inputs": arg_inputs, "kwarg_inputs": kwarg_inputs,
                  "enabled_precisions": set(enabled_precisions or ()), **kwargs})
    return torch.export.export(module, tuple(arg_inputs or inputs or ()), kwarg_inputs).module()


def save(module: Any, file_path: str, *, output_format: str = "exported_program", inputs: Any = None,
         arg_inputs: Any = None, kwarg_inputs: Any = None, retrace: bool = False) -> None:
    assert output_format == "exported_program"
    torch.export.save(torch.export.export(module, tuple(arg_inputs or inputs or ()), kwarg_inputs), file_path)


def load(file_path: str, extra_files: Any = None, **kwargs: Any) -> Any:
    return torch.export.load(file_path)
