"""ONNX Runtime as a region's runtime: session options from the candidate's knobs, and the runner.

CPU tensors go in as NumPy views and the session's outputs come back wrapped as tensors, through
the session's compiled ``run``; CUDA tensors go through IO binding, the outputs written straight
into freshly allocated torch tensors. On the CPU the plain call beats binding every buffer
(measured interleaved on a loaded 2-core machine: IO binding cost ~1.8x ``run`` with NumPy feeds
for a small MLP).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cuvil_pgc.recompile.onnx_index_checks import CHECK_OUTPUT
from cuvil_pgc.recompile.output_template import OutputTemplate
from cuvil_pgc.recompile.runtime_region import RuntimeRunner, index_checked, numpy_view, runtime_threads
from cuvil_pgc.recompile.runtimes import ORT_GPU_FIX, ORT_PROVIDERS

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
                 original: Callable[..., Any] | None = None, *, source: bytes | None = None,
                 sizes: dict[str, int] | None = None) -> None:
        import onnxruntime as ort

        super().__init__(template, original)
        ep = knobs.get("ep", "cpu")
        _check_provider(ort, ep, onnx_path)
        options = ort_session_options(ort, knobs)
        for name, n in (sizes or {}).items():
            options.add_free_dimension_override_by_name(name, n)
        self.session = ort.InferenceSession(onnx_path if source is None else source, options, providers=ORT_EPS[ep])
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self._path, self._knobs = onnx_path if source is None and ep == "cpu" else None, knobs

    #: copies of the weights :meth:`size_compiler` keeps (the program's bytes; see
    #: :func:`~.size_programs.default_capacity`)
    SOURCE_COPIES = 1

    def size_compiler(self) -> Callable[[tuple[tuple[int, ...], ...]], OrtRunner] | None:
        """``compile(shapes)``: this free-size program as a session of its own for exactly
        ``shapes`` (one per input; its named sizes overridden), with the same knobs, output
        structure and original, from the program's bytes, read now (the loaded build's file goes
        when loading ends); None for a program whose sizes are all fixed or not all named, or not
        on the CPU (see :mod:`.size_programs`)."""
        inputs = [i.shape for i in self.session.get_inputs()]
        if self._path is None or not any(isinstance(d, str) for dims in inputs for d in dims) \
                or any(d is None for dims in inputs for d in dims):
            return None
        with open(self._path, "rb") as f:
            source = f.read()

        def compiled_for(shapes: tuple[tuple[int, ...], ...]) -> OrtRunner:
            sizes = {d: n for dims, shape in zip(inputs, shapes, strict=True)
                     for d, n in zip(dims, shape, strict=True) if isinstance(d, str)}
            return OrtRunner(self._path, self._knobs, self.template, self._original, source=source, sizes=sizes)
        return compiled_for

    @functools.cached_property
    def _arrays(self) -> Callable[[list[Any]], list[torch.Tensor]]:
        """The session's compiled ``run`` (``InferenceSession._sess.run``) where it has one: the
        Python ``InferenceSession.run`` checks again what the lean call has checked (every input
        named, no foreign OrtValue, no WebGPU graph capture), 1.5-2 µs per call measured on a small
        MLP (6.4 µs against 8.2 µs)."""
        run, names, outputs = _compiled_run(self.session), self.input_names, self.output_names
        options = self._run_options

        def call(arrays: list[Any]) -> list[torch.Tensor]:     # map, not a comprehension: no Python frame
            return list(map(torch.from_numpy, run(outputs, dict(zip(names, arrays, strict=True)), options)))
        return index_checked(call, "ONNX Runtime") if self.checks_indices else call

    @functools.cached_property
    def _run_options(self) -> Any:
        """A program with index checks: runs that do not log the indices ONNX Runtime refuses itself
        (its error line on stderr for each such call; the region runs the original module, which
        raises eager's error, and warns once with ONNX Runtime's message). None otherwise."""
        if not self.checks_indices:
            return None
        import onnxruntime as ort

        options = ort.RunOptions()
        options.log_severity_level = 4               # fatal only
        return options

    @property
    def checks_indices(self) -> bool:
        """Whether the program checks indices it computes (:mod:`.onnx_index_checks`)."""
        return self.output_names[-1:] == [CHECK_OUTPUT]

    def run(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        if not inputs or inputs[0].device.type == "cpu":
            return self._arrays([numpy_view(t) for t in inputs])
        return self._run_bound(inputs)

    def _run_bound(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        import numpy as np

        outputs = self.template.allocate(inputs[0].device)
        binding = self.session.io_binding()
        for name, t in zip(self.input_names, inputs, strict=True):
            binding.bind_input(name, t.device.type, t.device.index or 0, _numpy_dtype(np, t.dtype),
                               tuple(t.shape), t.data_ptr())
        checks = self.checks_indices
        for name, t in zip(self.output_names[:-1] if checks else self.output_names, outputs, strict=True):
            binding.bind_output(name, t.device.type, t.device.index or 0, _numpy_dtype(np, t.dtype),
                                tuple(t.shape), t.data_ptr())
        if not checks:
            self.session.run_with_iobinding(binding)
            return outputs
        binding.bind_output(CHECK_OUTPUT, "cpu")      # the count of indices out of range (a scalar)

        def run(_: list[Any]) -> list[torch.Tensor]:
            self.session.run_with_iobinding(binding, self._run_options)
            return [torch.from_numpy(binding.get_outputs()[-1].numpy())]
        index_checked(run, "ONNX Runtime")([])
        return outputs


def _compiled_run(session: Any) -> Callable[[list[str], dict[str, Any], Any], Any]:
    """``run(output_names, feeds, run_options)`` of the session's compiled object where this
    onnxruntime has one (``_sess``, the pybind session its Python class wraps), else the public
    ``InferenceSession.run``, which takes the same arguments."""
    return getattr(getattr(session, "_sess", None), "run", None) or session.run


def _numpy_dtype(np: Any, dtype: torch.dtype) -> Any:
    return torch.empty((), dtype=dtype).numpy().dtype if dtype != torch.bfloat16 else np.uint16


