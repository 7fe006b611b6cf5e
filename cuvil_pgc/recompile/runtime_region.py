"""Running an exported region on ONNX Runtime, OpenVINO or TensorRT behind the module's own call.

A runner takes the region's positional and keyword arguments, hands the tensors among them to the
runtime without copying them (contiguous ones: NumPy views of CPU tensors, which ONNX Runtime's
CPU provider and OpenVINO's shared-memory inputs read in place; on CUDA, ONNX Runtime IO binding
to the tensors' device memory, the results written straight into freshly allocated torch
tensors), wraps the runtime's result arrays as torch tensors without copying them, and returns
them in the structure the original module returned (tuples, dicts, dataclass-like outputs, None
entries, constants): an :class:`OutputTemplate` records that structure. On the CPU the plain
calls beat binding every buffer (measured interleaved on a loaded 2-core machine): ONNX Runtime's
IO binding cost ~1.8x its ``run`` with NumPy feeds for a small MLP, and OpenVINO's
``Tensor(..., shared_memory=True)`` costs more to create per output (~70 µs for two) than
copying the outputs out of the request's own buffers (~25 µs): the runner takes the copies its
``infer()`` makes (one copy, not a second one of the request's buffers); its inputs are shared.
A runner is wrapped in :class:`~.apply.CompiledRegion`, which runs the original module for inputs
of another signature (the exports are shape-specialized).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from cuvil_pgc.recompile.hf_outputs import fast_builder, same_model_output
from cuvil_pgc.recompile.object_outputs import ObjectLeaf, is_output_leaf, output_tensors
from cuvil_pgc.recompile.runtimes import ORT_GPU_FIX, ORT_PROVIDERS

TENSOR_DTYPES = {"float32": torch.float32, "float64": torch.float64, "float16": torch.float16,
           "bfloat16": torch.bfloat16, "int64": torch.int64, "int32": torch.int32, "int16": torch.int16,
           "int8": torch.int8, "uint8": torch.uint8, "bool": torch.bool}


def tensor_leaves(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    """The tensors among a call's arguments in the order an export flattens them."""
    return [leaf for leaf in pytree.tree_leaves((args, kwargs)) if isinstance(leaf, torch.Tensor)]


@dataclass
class OutputTemplate:
    """The structure of a region's output: its tree spec, each leaf as an output tensor index or a
    constant, and each output tensor's shape and dtype (what a runner allocates)."""

    spec: Any                               # pytree TreeSpec
    #: ("t", index into the runtime's outputs) | ("c", constant) | ("o", ObjectLeaf): an object
    #: holding tensors the pytree does not open (:mod:`.object_outputs`)
    leaves: list[tuple[str, Any]]
    tensors: list[tuple[tuple[int, ...], torch.dtype]]

    def __post_init__(self) -> None:
        # the common shapes built without the pytree: one tensor, or a tuple of the outputs in order
        in_order = self.leaves == [("t", i) for i in range(len(self.leaves))]
        #: the output is the runtime's one tensor itself (callers may skip :meth:`build`)
        self.is_single = in_order and len(self.leaves) == 1 and self.spec.is_leaf()
        self._tuple = in_order and self.spec.type is tuple and all(c.is_leaf() for c in self.spec.children())
        self._flat = None if self.is_single or self._tuple else _flat_builder(self.spec, self.leaves)
        self._hf = fast_builder(self.spec, self.leaves)      # a Hugging Face ModelOutput (see .hf_outputs)
        self._hf_proven = False

    @classmethod
    def of(cls, output: Any) -> OutputTemplate:
        flat, spec = pytree.tree_flatten(output, is_leaf=is_output_leaf)
        leaves, tensors = [], []
        for leaf in flat:
            if isinstance(leaf, torch.Tensor):
                leaves.append(("t", len(tensors)))
                tensors.append((tuple(leaf.shape), leaf.dtype))
            elif (opened := ObjectLeaf.of(leaf, first=len(tensors))) is not None:
                leaves.append(("o", opened))
                tensors.extend(opened.tensors)
            else:
                leaves.append(("c", leaf))
        return cls(spec, leaves, tensors)

    def allocate(self, device: torch.device | str = "cpu") -> list[torch.Tensor]:
        return [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in self.tensors]

    def build(self, outputs: list[torch.Tensor]) -> Any:
        if self.is_single:
            return outputs[0]
        if self._tuple:
            return tuple(outputs)
        if self._flat is not None:
            return self._flat(outputs)
        if self._hf is not None:
            return self._hf(outputs) if self._hf_proven else self._prove_hf(outputs)
        return self._unflatten(outputs)

    def _unflatten(self, outputs: list[torch.Tensor]) -> Any:
        return pytree.tree_unflatten([outputs[v] if kind == "t" else v.build(outputs) if kind == "o"
                                      else v for kind, v in self.leaves], self.spec)

    def _prove_hf(self, outputs: list[torch.Tensor]) -> Any:
        """The first output built both ways: the fast builder stays only if they agree."""
        reference = self._unflatten(outputs)
        if not same_model_output(self._hf(outputs), reference):
            self._hf = None
        self._hf_proven = True
        return reference

    def to_json(self) -> dict[str, Any] | None:
        """A JSON-able form, or None when the structure or a constant cannot be serialized (the
        loader then learns it from one call of the original module)."""
        if not all(kind == "t" or v is None or isinstance(v, (bool, int, float, str)) for kind, v in self.leaves):
            return None
        try:
            spec = pytree.treespec_dumps(self.spec)
        except Exception:   # a pytree node type registered without a serialized name
            return None
        return {"spec": spec, "leaves": [list(x) for x in self.leaves],
                "tensors": [[list(shape), str(dtype).removeprefix("torch.")] for shape, dtype in self.tensors]}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> OutputTemplate:
        return cls(pytree.treespec_loads(doc["spec"]), [(kind, v) for kind, v in doc["leaves"]],
                   [(tuple(shape), TENSOR_DTYPES[dtype]) for shape, dtype in doc["tensors"]])


def _flat_builder(spec: Any, leaves: list[tuple[str, Any]]) -> Callable[[list[torch.Tensor]], Any] | None:
    """A builder of a plain dict, tuple or list of output tensors and constants (``{"logits": t,
    "aux": None}``, ``(probs, None)``) that does not go through ``pytree.tree_unflatten``, or None
    for any other structure (nested, a namedtuple, an OrderedDict, a dataclass). The pytree's
    rebuild of a three-entry dict took 2.1 µs warm against 0.1 µs for the dict itself, and a
    GRU tagger returning one ran 6.5% behind ONNX Runtime called plainly where it was deployed."""
    kind = spec.type
    if kind not in (dict, tuple, list) or not all(c.is_leaf() for c in spec.children()) \
            or any(what == "o" for what, _ in leaves):
        return None
    picks = [(what == "t", v) for what, v in leaves]
    if kind is dict:
        keyed = [(key, tensor, v) for key, (tensor, v) in zip(spec.context, picks, strict=True)]
        return lambda outputs: {key: outputs[v] if tensor else v for key, tensor, v in keyed}
    make = tuple if kind is tuple else list
    return lambda outputs: make([outputs[v] if tensor else v for tensor, v in picks])


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
                                                              Callable[..., Any]] | None:
        """What :meth:`~.realized.CompiledRegion.__call__` needs to hand the captured CPU inputs'
        NumPy views straight to the runtime: the input count, each input's (shape, dtype), the
        array call (:attr:`_arrays`), whether the output is the runtime's one tensor, and the
        template's build for any other output. None where that does not apply (CUDA, bf16 inputs,
        no template yet, a runtime without an array call)."""
        template = self.template
        if template is None or not spec or any(dev.type != "cpu" or dtype == torch.bfloat16
                                               for _, dtype, dev, _ in spec):
            return None
        run = self._arrays
        if run is None:
            return None
        return len(spec), [(shape, dtype) for shape, dtype, _, _ in spec], run, template.is_single, template.build

    #: NumPy input arrays -> output tensors: the runtime's own CPU call, which :meth:`run` and
    #: :meth:`lean_parts` hand out, made on first use (None: a runtime without one has no lean call)
    _arrays: Callable[[list[Any]], list[torch.Tensor]] | None = None


# ----------------------------------------------------------------------------- ONNX Runtime

ORT_LEVELS = ("disabled", "basic", "extended", "all")
ORT_MODES = ("sequential", "parallel")
#: each ``ep`` knob's providers for a session: the one asked for first, then those ONNX Runtime
#: hands the nodes it cannot run to
ORT_EPS = {ep: [ORT_PROVIDERS[p] for p in chain]
           for ep, chain in {"cpu": ("cpu",), "cuda": ("cuda", "cpu"), "tensorrt": ("tensorrt", "cuda", "cpu")}.items()}


_measuring = contextvars.ContextVar("cuvil_pgc_measuring_in_process", default=False)


@contextlib.contextmanager
def measuring_in_process() -> Iterator[None]:
    """ONNX Runtime sessions made inside stop spinning when a run returns (``spin=run``) unless
    their candidate turns spinning off: ``recompile`` runs its search and race with this.

    Every contender of a search runs in the searching process, and each ONNX Runtime session's
    threads spun on after its runs, on the cores the next contender needed. recompile of a small
    DistilBERT at 2 threads reported eager at 6.8 ms and a 13x speedup; that forward takes 1.2 ms
    in a process of its own. One session spinning next to it cost eager 23% (1.40 → 1.72 ms),
    stopping after each run 6%. Plans keep their own setting where they are deployed: the race in
    processes of their own and ``load_build`` make their sessions outside this."""
    token = _measuring.set(True)
    try:
        yield
    finally:
        _measuring.reset(token)


def ort_session_options(ort: Any, knobs: dict[str, str]) -> Any:
    """SessionOptions for the candidate's knobs: ``opt`` (graph optimization level, default all),
    ``exec`` (sequential | parallel), ``threads`` (intra-op; default torch's), ``spin`` (on | off |
    run: spin while a run lasts, stop when it returns; see :func:`~.runtime_build.knobs_of` and
    :func:`measuring_in_process`)."""
    so = ort.SessionOptions()
    level = knobs.get("opt", "all")
    so.graph_optimization_level = {"disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                   "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
                                   "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
                                   "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    so.execution_mode = (ort.ExecutionMode.ORT_PARALLEL if knobs.get("exec") == "parallel"
                         else ort.ExecutionMode.ORT_SEQUENTIAL)
    so.intra_op_num_threads = runtime_threads(knobs)
    so.inter_op_num_threads = 1 if knobs.get("exec") != "parallel" else runtime_threads(knobs)
    so.add_session_config_entry("session.intra_op.allow_spinning", "0" if knobs.get("spin") == "off" else "1")
    if knobs.get("spin") == "run" or (_measuring.get() and knobs.get("spin") != "off"):
        so.add_session_config_entry("session.force_spinning_stop", "1")
    so.log_severity_level = 3
    return so


def runtime_threads(knobs: dict[str, str]) -> int:
    """The runtime's intra-op threads: the ``threads`` knob, else torch's (the deployment's count)."""
    return int(knobs["threads"]) if "threads" in knobs else torch.get_num_threads()


def _check_provider(ort: Any, ep: str, onnx_path: str) -> None:
    """Refuse an execution provider this ONNX Runtime lacks: given a provider it does not have,
    ``InferenceSession`` only warns and runs on the CPU (CUDA tensors then go through host copies,
    or fail deep in IO binding)."""
    from cuvil_pgc.errors import BuildError

    have = ort.get_available_providers()
    if ep not in ORT_EPS:
        raise BuildError(f"the ONNX Runtime region asks for execution provider {ep!r}, which this cuvil-pgc "
                         f"does not know ({', '.join(ORT_EPS)})", path=onnx_path,
                         fix="load it with the cuvil-pgc that made it, or recompile here")
    if ORT_EPS[ep][0] not in have:
        raise BuildError(f"onnxruntime {ort.__version__} has no {ORT_EPS[ep][0]} here (it has "
                         f"{', '.join(have)})", path=onnx_path,
                         fix=ORT_GPU_FIX if ep != "cpu" else "reinstall onnxruntime")


class OrtRunner(RuntimeRunner):
    """An ONNX Runtime session: CPU tensors go in as NumPy views, its outputs come back wrapped;
    CUDA tensors through IO binding, the outputs written into torch tensors."""

    def __init__(self, onnx_path: str, knobs: dict[str, str], template: OutputTemplate | None,
                 original: Callable[..., Any] | None = None) -> None:
        import onnxruntime as ort

        super().__init__(template, original)
        ep = knobs.get("ep", "cpu")
        _check_provider(ort, ep, onnx_path)
        self.session = ort.InferenceSession(onnx_path, ort_session_options(ort, knobs), providers=ORT_EPS[ep])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    @functools.cached_property
    def _arrays(self) -> Callable[[list[Any]], list[torch.Tensor]]:
        """The session's compiled ``run`` (``InferenceSession._sess.run``) where it has one: the
        Python ``InferenceSession.run`` checks again what the lean call has checked (every input
        named, no foreign OrtValue, no WebGPU graph capture), 1.5-2 µs per call measured on a small
        MLP (6.4 µs against 8.2 µs)."""
        run, names, outputs = _compiled_run(self.session), self.input_names, self.output_names

        def call(arrays: list[Any]) -> list[torch.Tensor]:     # map, not a comprehension: no Python frame
            return list(map(torch.from_numpy, run(outputs, dict(zip(names, arrays, strict=True)), None)))
        return call

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if not inputs or inputs[0].device.type == "cpu":
            return self._arrays([_numpy(t) for t in inputs])
        return self._run_bound(inputs)

    def _run_bound(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        import numpy as np

        outputs = self.template.allocate(inputs[0].device)
        binding = self.session.io_binding()
        for name, t in zip(self.input_names, inputs, strict=True):
            binding.bind_input(name, t.device.type, t.device.index or 0, _numpy_dtype(np, t.dtype),
                               tuple(t.shape), t.data_ptr())
        for name, t in zip(self.output_names, outputs, strict=True):
            binding.bind_output(name, t.device.type, t.device.index or 0, _numpy_dtype(np, t.dtype),
                                tuple(t.shape), t.data_ptr())
        self.session.run_with_iobinding(binding)
        return outputs


def _compiled_run(session: Any) -> Callable[[list[str], dict[str, Any], Any], Any]:
    """``run(output_names, feeds, run_options)`` of the session's compiled object where this
    onnxruntime has one (``_sess``, the pybind session its Python class wraps), else the public
    ``InferenceSession.run``, which takes the same arguments."""
    return getattr(getattr(session, "_sess", None), "run", None) or session.run


def _numpy(t: torch.Tensor) -> Any:
    """A NumPy view of a CPU tensor (bf16, which NumPy lacks, as its raw 16-bit words); detached: a
    runtime's result carries no autograd history, so an input that requires grad is read as data."""
    t = t.detach()
    return t.view(torch.int16).numpy().view("uint16") if t.dtype == torch.bfloat16 else t.numpy()


def _numpy_dtype(np: Any, dtype: torch.dtype) -> Any:
    return torch.empty((), dtype=dtype).numpy().dtype if dtype != torch.bfloat16 else np.uint16


# ----------------------------------------------------------------------------- OpenVINO

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
                 original: Callable[..., Any] | None = None) -> None:
        import openvino as ov

        super().__init__(template, original)
        self._ov = ov
        core = ov.Core()
        self.compiled = core.compile_model(core.read_model(xml_path), "CPU", openvino_config(knobs, precision))
        self.request = self.compiled.create_infer_request()
        self._lock = threading.Lock()     # an infer request serves one call at a time

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return self._arrays([_numpy(t) for t in inputs])

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
            return _bf16_call(self._ov, request, lock, infer, buffers, typed, words)

        def call(arrays: list[Any]) -> list[torch.Tensor]:
            with lock:
                for i, (a, buffer) in enumerate(zip(arrays, buffers, strict=True)):
                    if buffer is None:
                        request.set_input_tensor(i, tensor(a, shared_memory=True))
                    else:
                        copy(buffer, a)
                return list(map(torch.from_numpy, infer(request, {}, False, True).values()))
        return call


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
