"""The ONNX export of a TorchScript region (``torch.jit.script``, or any model a service loads with
``torch.jit.load``), which ``torch.export`` refuses ("Exporting a ScriptModule is not supported").

The TorchScript exporter (``torch.onnx.export(dynamo=False)``) makes every argument of the
scripted ``forward`` a graph input, numbers included, whether the call passed them or left their
defaults: ``forward(self, x, scale: float = 2.0)`` becomes a graph of inputs ``x`` and ``scale``.
A runner feeds the region's tensors only, so such a graph was rejected and the model had no
runtime candidate. Each number argument is written into the graph as the constant the call had
(given or by default), as the dynamo exporter specializes numbers; a call with another value does
not match the region's captured signature and runs the original module.

An eager model that calls a scripted submodule (``self.block = torch.jit.script(...)``) fails
``torch.export`` at that call; it is traced with ``torch.jit.trace``, which keeps the call, and
the trace goes to the same exporter (:func:`export_traced`). So is a scripted module returning a
dict (:func:`returns_mapping`). Every export runs on a private copy
of the module, so the exporter's in-place passes never reach the user's model.
"""

from __future__ import annotations

import io
import linecache
import sys
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from cuvil_pgc.recompile.export_error import TracedDecision

#: schema types whose values become constants of the graph
_NUMBER_TYPES = {"float": float, "int": int, "bool": bool}


def export_torchscript(module: torch.jit.ScriptModule, args: tuple[Any, ...], kwargs: dict[str, Any],
                       path: Path, opset: int, *, free_sizes: bool = False) -> None:
    """``module`` for ``args`` and ``kwargs`` as one ``.onnx`` file, its outputs flattened by the
    exporter as :class:`~.aoti_outputs.TensorOutputs` flattens them, which the caller checks. The
    module itself is exported: a traced wrapper may not call TorchScript. At the captured sizes,
    or with ``free_sizes`` every dimension of every tensor input named a size of its own (the
    graph computes its shapes from its inputs; which sizes may really change, and which change
    together, the accuracy guard's probes find, as for the dynamo exporter's ``Dim.AUTO``).

    It is exported from a private copy (:func:`_private_copy`): the exporter's passes rewrite the
    graphs of the module it is given and of the scripted modules that one calls, in place. The
    copy has no Python signature to fill the defaults from, so every argument is passed, bound
    from the TorchScript schema (:func:`bound_arguments`)."""
    params = _schema(module)
    bound = None if params is None else bound_arguments(params, args, kwargs)
    call = args + ((kwargs,) if kwargs else ()) if bound is None else tuple(bound)
    names = dynamic = None
    if free_sizes:
        names = [f"input_{i}" for i in range(len(call))]
        dynamic = {name: {d: f"{name}_{d}" for d in range(value.dim())}
                   for name, value in zip(names, call, strict=True) if isinstance(value, torch.Tensor)}
    torch.onnx.export(_private_copy(module), call, str(path), dynamo=False, opset_version=opset,
                      do_constant_folding=True, input_names=names, dynamic_axes=dynamic)
    if bound is not None:
        numbers = [_number(param, value) for param, value in zip(params, bound, strict=True)]
        if any(v is not None for v in numbers):
            _write_constants(path, numbers)


def _private_copy(module: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """``module`` saved and loaded again: the same code and weights in types and graphs of its own.

    The TorchScript exporter inlines the calls in the graph it exports, and the graphs of the
    scripted modules called there, in place. On the user's module that changed its code
    (``module.code``) and so its structural hash: a build loaded onto the model it was just made
    from, in the same process, found the region "changed since the build" and ran it eagerly; and
    every other module of the same scripted type in the process (which share their graphs) changed
    with it. A deep copy shares the types, and with them the graphs."""
    buffer = io.BytesIO()
    torch.jit.save(module, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


def returns_mapping(module: torch.jit.ScriptModule) -> bool:
    """Whether the scripted ``forward`` returns a dict, or a tuple or list holding one (a Hugging
    Face model traced with ``strict=False`` returns its outputs by name): the TorchScript exporter
    has no ONNX for ``prim::DictConstruct``, so such a module is traced inside the region's output
    flattening instead (:func:`export_traced`), which reads the dict in Python."""
    try:
        return any("Dict[" in str(r.type) for r in module.forward.schema.returns)
    except (AttributeError, RuntimeError):
        return False


def scripted_submodule(module: torch.nn.Module) -> str | None:
    """The name of the first TorchScript module (``torch.jit.script`` of a submodule) inside
    ``module``, which is not one itself, or None: ``torch.export`` fails on the call into it
    ("Sequential.forward() takes 2 positional arguments but 3 were given")."""
    if isinstance(module, torch.jit.ScriptModule):
        return None
    return next((name for name, m in module.named_modules() if isinstance(m, torch.jit.ScriptModule)), None)


def torch_export_note(module: torch.nn.Module) -> str:
    """What to add to a ``torch.export`` failure of ``module`` that calls TorchScript: the cause,
    which the exporter's own message does not name."""
    name = scripted_submodule(module)
    return "" if name is None else (f" (the region calls the TorchScript module {name!r}, which torch.export "
                                    "cannot trace into; its ONNX Runtime and OpenVINO candidates are exported "
                                    "with the TorchScript exporter)")


def export_traced(module: torch.nn.Module, args: tuple[Any, ...], path: Path, opset: int, *,
                  free_sizes: bool = False) -> None:
    """An eager ``module`` that calls TorchScript inside, for its positional tensor ``args``, as one
    ``.onnx`` file (``free_sizes``: see :func:`export_torchscript`): ``torch.jit.trace`` records
    its eager code and keeps the call into the scripted submodule, and the TorchScript exporter
    takes the result. ``module`` is the region with its outputs flattened (:class:`~.aoti_outputs.TensorOutputs`), so the graph's
    outputs come in the order the runner's template expects. (The TorchScript exporter traces an
    eager module itself too, but its trace does not find the scripted submodules: "Tried to trace
    ... but it is not part of the active trace".)"""
    if (where := python_value_taken(module, args)) is not None:
        raise TracedDecision(where)
    traced = torch.jit.trace(module, args, strict=False, check_trace=False)
    export_torchscript(traced, args, {}, path, opset, free_sizes=free_sizes)


#: the tensor methods that hand a tensor's value to Python
_TO_PYTHON = frozenset({"__bool__", "__int__", "__float__", "__index__", "__complex__", "item", "tolist"})


class _PythonValues(TorchFunctionMode):
    """Notes the first line that turns a tensor into a Python value (past torch's dispatch to it)."""

    def __init__(self) -> None:
        super().__init__()
        self.where: str | None = None

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.where is None and getattr(func, "__name__", "") in _TO_PYTHON:
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename.endswith(("torch/overrides.py", "torch/_tensor.py")):
                frame = frame.f_back
            name = frame.f_code.co_filename if frame is not None else ""
            if name:
                code = " ".join(linecache.getline(name, frame.f_lineno).split())
                self.where = f"{name}:{frame.f_lineno} (`{code}`)"
        return func(*args, **(kwargs or {}))


def python_value_taken(module: torch.nn.Module, args: tuple[Any, ...]) -> str | None:
    """Where (``path:line (`code`)``) code turns a tensor into a Python value (a bool, a
    number, a list) in an eager call of ``module``, or None. torch.jit.trace keeps the path such a
    value took as a constant: an eager model calling a scripted block with ``if h.mean() > 0.25:``
    in its own forward was traced down one branch, its ONNX Runtime build passed the accuracy guard
    on the captured inputs and answered inputs taking the other branch wrongly (2.3 off). Asked in
    eager, not of the tracer's warnings: the tracer hands sizes out as tensors too and warns alike
    for ``if x.shape[1] > 3:`` (as for torch's own RNNs checking their inputs), which a trace at the
    captured sizes keeps rightly; in eager a size is an int. A decision in a library's code is kept
    by the trace as one in the user's is, so it refuses the trace too."""
    values = _PythonValues()
    with torch.no_grad(), values:
        module(*args)
    return values.where


def bound_arguments(params: list[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
    """The value of each of ``params`` (a scripted ``forward``'s schema arguments past ``self``,
    :func:`_schema`): given by position or keyword, else its default; None when one has no value."""
    values = []
    for i, param in enumerate(params):
        if i < len(args):
            values.append(args[i])
        elif param.name in kwargs:
            values.append(kwargs[param.name])
        elif param.has_default_value():
            values.append(param.default_value)
        else:
            return None
    return values


def _schema(module: torch.jit.ScriptModule) -> list[Any] | None:
    """The arguments of the scripted ``forward`` past ``self``, or None where it cannot be read."""
    try:
        return list(module.forward.schema.arguments[1:])
    except (AttributeError, RuntimeError):
        return None


def _number(param: Any, value: Any) -> Any:
    """``value`` as the number type of ``param`` where both are numbers, else None."""
    kind = _NUMBER_TYPES.get(str(param.type))
    return kind(value) if kind is not None and type(value) in (bool, int, float) else None


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

