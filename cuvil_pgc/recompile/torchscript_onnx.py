"""The ONNX export of a TorchScript region (``torch.jit.script``, or any model a service loads with
``torch.jit.load``), which ``torch.export`` refuses ("Exporting a ScriptModule is not supported").

The TorchScript exporter (``torch.onnx.export(dynamo=False)``) makes every argument of the
scripted ``forward`` a graph input, numbers included, whether the call passed them or left their
defaults: ``forward(self, x, scale: float = 2.0)`` becomes a graph of inputs ``x`` and ``scale``.
A runner feeds the region's tensors only, so such a graph was rejected and the model had no
runtime candidate. Each number argument is written into the graph as the constant the call had
(given or by default), as the dynamo exporter specializes numbers; a call with another value does
not match the region's captured signature and runs the original module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

#: schema types whose values become constants of the graph
_NUMBER_TYPES = {"float": float, "int": int, "bool": bool}


def export_torchscript(module: torch.jit.ScriptModule, args: tuple[Any, ...], kwargs: dict[str, Any],
                       path: Path, opset: int) -> None:
    """``module`` for ``args`` and ``kwargs`` as one ``.onnx`` file at fixed sizes (the program for
    other sizes needs the dynamo exporter's free dimensions), its outputs flattened by the exporter
    as :class:`~.aoti_outputs.TensorOutputs` flattens them, which the caller checks. The module
    itself is exported: a traced wrapper may not call TorchScript."""
    torch.onnx.export(module, args + ((kwargs,) if kwargs else ()), str(path), dynamo=False,
                      opset_version=opset, do_constant_folding=True)
    numbers = number_arguments(module, args, kwargs)
    if numbers is not None and any(v is not None for v in numbers):
        _write_constants(path, numbers)


def number_arguments(module: torch.jit.ScriptModule, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> list[Any] | None:
    """Per argument of the scripted ``forward`` past ``self``: its value where it is a number, else
    None; None for all when the schema cannot be read or an argument has no value to bind."""
    try:
        params = module.forward.schema.arguments[1:]           # past self
    except (AttributeError, RuntimeError):
        return None
    numbers = []
    for i, param in enumerate(params):
        if i < len(args):
            value = args[i]
        elif param.name in kwargs:
            value = kwargs[param.name]
        elif param.has_default_value():
            value = param.default_value
        else:
            return None
        kind = _NUMBER_TYPES.get(str(param.type))
        numbers.append(kind(value) if kind is not None and type(value) in (bool, int, float) else None)
    return numbers


def _write_constants(path: Path, numbers: list[Any]) -> None:
    """The graph inputs of the number arguments turned into initializers holding their values,
    where the graph has one input per argument (otherwise the caller's input count rejects it)."""
    import numpy as np
    import onnx
    from onnx import helper, numpy_helper

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    initializers = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in initializers]
    if len(inputs) != len(numbers):
        return
    for graph_input, value in zip(inputs, numbers, strict=True):
        if value is None or graph_input.type.tensor_type.shape.dim:       # not a number's 0-dim input
            continue
        dtype = helper.tensor_dtype_to_np_dtype(graph_input.type.tensor_type.elem_type)
        graph.initializer.append(numpy_helper.from_array(np.array(value, dtype=dtype), graph_input.name))
        graph.input.remove(graph_input)
    onnx.save(model, str(path))

