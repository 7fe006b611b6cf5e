"""OpenVINO as a region's runtime: the CPU plugin's properties from the candidate's knobs, and the
runner.

The runner keeps one infer request. Small inputs are copied into the request's own buffers and
larger ones shared (:func:`openvino_input_buffers`). The outputs are the copies ``infer()`` makes:
``Tensor(..., shared_memory=True)`` cost more to create per output (~70 µs for two) than copying
the outputs out of the request's buffers (~25 µs), and the request reuses its buffers on the next
call.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

from cuvil_pgc.recompile._signal_stack import kept_signal_stack
from cuvil_pgc.recompile.onnx_index_checks import CHECK_OUTPUT
from cuvil_pgc.recompile.output_template import OutputTemplate
from cuvil_pgc.recompile.runtime_region import RuntimeRunner, index_checked, numpy_view, runtime_threads

OV_HINTS = {"latency": "LATENCY", "throughput": "THROUGHPUT"}
OV_PRECISIONS = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


def openvino_config(knobs: dict[str, str], precision: str) -> dict[str, str]:
    """The CPU plugin's properties for the candidate: ``hint`` (latency | throughput), the inference
    precision (explicitly f32 for fp32: on CPUs with AMX the plugin would pick bf16 on its own),
    ``threads`` (default torch's) and ``pin`` (on | off, default off).

    Pinning is off unless asked for: the plugin pins its inference thread to one core, and on a
    shared machine (other processes, or torch and ONNX Runtime threads in this one) that core is
    often busy, so every call waits for it. Measured on 2 busy cores, batch-1 MLP interleaved with
    eager and ONNX Runtime: 2.58 ms pinned, 0.36 ms unpinned; alone or on a quiet machine the two
    are within noise (0.27-0.32 ms)."""
    return {"PERFORMANCE_HINT": OV_HINTS[knobs.get("hint", "latency")],
            "INFERENCE_PRECISION_HINT": OV_PRECISIONS[precision],
            "INFERENCE_NUM_THREADS": str(runtime_threads(knobs)),
            "ENABLE_CPU_PINNING": "YES" if knobs.get("pin") == "on" else "NO"}


class OpenVinoRunner(RuntimeRunner):
    """An OpenVINO compiled model and one infer request reading the torch tensors' memory in place."""

    def __init__(self, xml_path: str, knobs: dict[str, str], precision: str, template: OutputTemplate | None,
                 original: Callable[..., Any] | None = None, *, model: Any = None) -> None:
        import openvino as ov

        super().__init__(template, original)
        self._ov, self._knobs, self._precision = ov, knobs, precision
        core = ov.Core()
        model = core.read_model(xml_path) if model is None else model
        with kept_signal_stack():         # the CPU plugin's own would outlive it on this thread (see there)
            self.compiled = core.compile_model(model, "CPU", openvino_config(knobs, precision))
        self.request = self.compiled.create_infer_request()
        self._lock = threading.Lock()     # an infer request serves one call at a time
        self._path = xml_path

    def size_compiler(self) -> Callable[[tuple[tuple[int, ...], ...]], OpenVinoRunner] | None:
        """``compile(shapes)``: this free-size program compiled for exactly ``shapes`` (one per
        input), with the same knobs, output structure and original, from its model read now (the
        loaded build's file goes when loading ends) and kept; None for a program whose sizes are
        all fixed (see :mod:`.size_programs`)."""
        if all(port.get_partial_shape().is_static for port in self.compiled.inputs):
            return None
        read = self._ov.Core().read_model(self._path)

        def compiled_for(shapes: tuple[tuple[int, ...], ...]) -> OpenVinoRunner:
            model = read.clone()
            model.reshape({i: self._ov.PartialShape(list(shape)) for i, shape in enumerate(shapes)})
            return OpenVinoRunner("", self._knobs, self._precision, self.template, self._original, model=model)
        return compiled_for

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._arrays([numpy_view(t) for t in inputs])

    @functools.cached_property
    def _arrays(self) -> Callable[[list[Any]], list[torch.Tensor]]:
        """Small inputs copied into the request's own input buffers, larger ones shared (see
        :func:`openvino_input_buffers`); outputs the fresh copies inference makes
        (``share_outputs=False``: the request's own buffers are reused by the next call); through
        the request's compiled ``infer`` (:func:`_native_infer`)."""
        import numpy as np

        tensor, request, lock, infer = self._ov.Tensor, self.request, self._lock, _native_infer(self.request)
        buffers, copy = openvino_input_buffers(request, self.compiled), np.copyto
        bf16 = self._ov.Type.bf16
        typed = [port.get_element_type() == bf16 for port in self.compiled.inputs]
        words = [i for i, port in enumerate(self.compiled.outputs) if port.get_element_type() == bf16]
        if any(typed) or words:
            call = _bf16_call(self._ov, request, lock, infer, buffers, typed, words)
        else:
            def call(arrays: list[Any]) -> list[torch.Tensor]:
                with lock:
                    for i, (a, buffer) in enumerate(zip(arrays, buffers, strict=True)):
                        if buffer is None:
                            request.set_input_tensor(i, tensor(a, shared_memory=True))
                        else:
                            copy(buffer, a)
                    return list(map(torch.from_numpy, infer(request, {}, False, True).values()))
        return index_checked(call, "OpenVINO") if self.checks_indices else call

    @property
    def checks_indices(self) -> bool:
        """Whether the program checks indices it computes (:mod:`.onnx_index_checks`)."""
        return bool(self.compiled.outputs) and CHECK_OUTPUT in self.compiled.outputs[-1].get_names()


def _bf16_call(ov: Any, request: Any, lock: Any, infer: Any, buffers: list[Any], typed: list[bool],
               words: list[int]) -> Callable[[list[Any]], list[torch.Tensor]]:
    """The OpenVINO array call of a model with bf16 inputs or outputs, which NumPy holds as raw
    16-bit words: a bf16 input is handed over as a tensor told its element type (OpenVINO refused
    the words as u16), a bf16 output's words are viewed as bf16 again."""
    import numpy as np

    tensor, bf16 = ov.Tensor, ov.Type.bf16

    def call(arrays: list[Any]) -> list[torch.Tensor]:
        with lock:
            for i, (a, buffer) in enumerate(zip(arrays, buffers, strict=True)):
                if buffer is not None:
                    np.copyto(buffer, a)
                else:
                    request.set_input_tensor(i, tensor(a, a.shape, bf16) if typed[i] else tensor(a, shared_memory=True))
            outputs = list(map(torch.from_numpy, infer(request, {}, False, True).values()))
        for i in words:
            outputs[i] = outputs[i].view(torch.bfloat16)
        return outputs
    return call


#: inputs up to this size are copied into the infer request's own buffers rather than shared
OV_COPY_INPUT_BYTES = 64 * 1024


def openvino_input_buffers(request: Any, compiled: Any) -> list[Any]:
    """Per input of ``compiled``: the NumPy view of ``request``'s own input buffer where the input
    is small enough to copy (:data:`OV_COPY_INPUT_BYTES`), else None (share the caller's memory).

    Handing the CPU plugin a new shared tensor each call makes it bind the new memory again:
    measured in one process, interleaved, against the same compiled model fed shared tensors,
    copying into the request's buffers took the zoo transformer (8 KB input) from 82.4 to 73.5 µs
    and the zoo CNN (12 KB) from 348 to 328 µs; a 110 KB image input was a tie. bf16 inputs, which
    NumPy holds as raw 16-bit words, are always shared."""
    import openvino as ov

    buffers = []
    for i, port in enumerate(compiled.inputs):
        data = None
        if port.get_element_type() != ov.Type.bf16 and port.get_partial_shape().is_static:   # a free size: share
            try:
                data = request.get_input_tensor(i).data
            except Exception:        # an element type NumPy cannot view: share instead
                data = None
        buffers.append(data if data is not None and data.nbytes <= OV_COPY_INPUT_BYTES else None)
    return buffers


def _native_infer(request: Any) -> Callable[[Any, dict[Any, Any], bool, bool], Any]:
    """``infer(request, inputs, share_outputs, decode_strings)`` returning a mapping of the outputs
    in order: the compiled ``InferRequest.infer`` where this openvino has one (in
    ``openvino._pyopenvino``, which the Python class wraps), else the public ``request.infer``.
    The public one runs Python calls around it (the input dispatcher, the result dictionary); on
    the zoo transformer's 80 µs call each Python call cost about 1-1.5% deployed."""
    try:
        from openvino import _pyopenvino
        native = _pyopenvino.InferRequest.infer
    except (ImportError, AttributeError):
        native = None
    if native is None or not isinstance(request, _pyopenvino.InferRequest):
        return lambda r, inputs, share, decode: r.infer(inputs, share_outputs=share, decode_strings=decode)
    return native

