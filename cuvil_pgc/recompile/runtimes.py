"""The inference runtimes the plan space can hand a region to, and whether each is usable here.

Each runtime backend of :class:`~.candidates.Candidate` (``ort``: ONNX Runtime, ``openvino``:
OpenVINO, ``tensorrt``: Torch-TensorRT) needs a Python package that is an optional extra of
cuvil-pgc. :func:`check` imports it (only when asked) and says whether the backend can run on a
device, and if not why and which ``pip install`` fixes it; the search leaves out the backends
that cannot run, ``load_build`` refuses (or falls back to eager) a build that needs one, and
``cuvil-pgc doctor`` lists them all.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass

from cuvil_pgc.errors import BuildError


@dataclass(frozen=True)
class Runtime:
    backend: str          # the Candidate.backend value
    title: str            # what users call it
    modules: tuple[str, ...]   # what must import (the first one's version is the runtime's)
    extra: str            # the pip extra of cuvil-pgc that installs it
    devices: tuple[str, ...]   # device types it runs regions on

    @property
    def fix(self) -> str:
        return f"pip install 'cuvil-pgc[{self.extra}]' ({', '.join(self.modules)})"


#: the runtime backends, in the order the plan space lists them. The ONNX export needs onnx and
#: onnxscript (torch.onnx's dynamo exporter); OpenVINO converts that same ONNX file.
RUNTIMES = {
    "ort": Runtime("ort", "ONNX Runtime", ("onnxruntime", "onnx", "onnxscript"), "ort", ("cpu", "cuda")),
    "openvino": Runtime("openvino", "OpenVINO", ("openvino", "onnx", "onnxscript"), "openvino", ("cpu",)),
    "tensorrt": Runtime("tensorrt", "Torch-TensorRT", ("torch_tensorrt",), "tensorrt", ("cuda",)),
}
RUNTIME_BACKENDS = tuple(RUNTIMES)
#: ONNX Runtime's execution providers by the value of a candidate's ``ep`` knob. The package
#: decides which exist: ``onnxruntime`` has the CPU provider alone (on GPU machines too: it is
#: what ``pip install onnxruntime`` gives), ``onnxruntime-gpu`` adds CUDA and TensorRT.
ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
                 "tensorrt": "TensorrtExecutionProvider"}
ORT_GPU_FIX = "pip install onnxruntime-gpu (in place of onnxruntime)"


@dataclass(frozen=True)
class RuntimeStatus:
    backend: str
    ok: bool
    detail: str = ""            # version (and what it found) when ok
    reason: str | None = None
    fix: str | None = None


@functools.cache
def _import_status(backend: str) -> RuntimeStatus:
    runtime = RUNTIMES[backend]
    versions = []
    for name in runtime.modules:
        try:
            module = importlib.import_module(name)
        except Exception as exc:   # ImportError, or a broken install raising anything else
            return RuntimeStatus(backend, False, reason=f"{name} is not importable ({type(exc).__name__}: {exc})",
                                 fix=runtime.fix)
        versions.append(f"{name} {getattr(module, '__version__', '?')}")
    return RuntimeStatus(backend, True, ", ".join(versions))


def check(backend: str, device: str = "cpu") -> RuntimeStatus:
    """Whether ``backend`` can run regions on ``device`` here (imports its packages once)."""
    runtime = RUNTIMES[backend]
    kind = device.split(":")[0]
    if kind not in runtime.devices:
        return RuntimeStatus(backend, False, reason=f"{runtime.title} regions run on {'/'.join(runtime.devices)}, "
                                                    f"not {kind}", fix=f"recompile for {runtime.devices[0]}")
    status = _import_status(backend)
    if status.ok and backend == "ort" and kind == "cuda" and "cuda" not in ort_eps():
        return RuntimeStatus(backend, False, status.detail, fix=ORT_GPU_FIX, reason=(
            f"onnxruntime {version('ort')} has no CUDA execution provider (it runs on "
            f"{', '.join(ort_eps()) or 'nothing'} here: the CPU package)"))
    return status


@functools.cache
def ort_eps() -> tuple[str, ...]:
    """The ``ep`` values (:data:`ORT_PROVIDERS`) the installed ONNX Runtime can run here."""
    if not _import_status("ort").ok:
        return ()
    try:
        import onnxruntime

        have = set(onnxruntime.get_available_providers())
    except Exception:      # a broken install: it runs nothing
        return ()
    return tuple(ep for ep, provider in ORT_PROVIDERS.items() if provider in have)


def available(device: str = "cpu") -> tuple[str, ...]:
    """The runtime backends usable on ``device`` here."""
    return tuple(b for b in RUNTIME_BACKENDS if check(b, device).ok)


def unusable(device: str = "cpu") -> list[RuntimeStatus]:
    """The runtimes that run regions on ``device``'s kind but cannot here (a package missing, or
    ONNX Runtime's CPU package on a GPU machine), each with its fix."""
    kind = device.split(":")[0]
    return [status for b in RUNTIME_BACKENDS if kind in RUNTIMES[b].devices and not (status := check(b, device)).ok]


def version(backend: str) -> str:
    """The runtime's version string (its first module's ``__version__``); "" when not importable."""
    status = _import_status(backend)
    return status.detail.split(",")[0].split(" ", 1)[1] if status.ok else ""


def require(backend: str, device: str, path: str | None = None) -> None:
    """Raise a BuildError naming the pip extra when ``backend`` cannot run on ``device`` here."""
    status = check(backend, device)
    if not status.ok:
        raise BuildError(f"the build runs a region on {RUNTIMES[backend].title}, which cannot run here: "
                         f"{status.reason}", path=path,
                         fix=f"{status.fix}, or load it with fallback='eager'")


def reset() -> None:
    """Forget the import results (tests that fake a runtime's module call this)."""
    _import_status.cache_clear()
    ort_eps.cache_clear()


@functools.cache
def openvino_native_bf16() -> bool:
    """Whether OpenVINO's CPU plugin runs bf16 natively here (AVX512-BF16 or AMX)."""
    try:
        import openvino as ov

        from cuvil_pgc.recompile._signal_stack import kept_signal_stack

        with kept_signal_stack():         # loading the CPU plugin replaces this thread's (see there)
            return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")
    except Exception:
        return False


def describe(backend: str) -> RuntimeStatus:
    """What ``cuvil-pgc doctor`` says about a runtime backend: importable or not (and the pip extra),
    and what it can run on here (ONNX Runtime's execution providers, OpenVINO's devices, whether
    a CUDA device is visible for TensorRT)."""
    status = _import_status(backend)
    if not status.ok:
        return status
    try:
        if backend == "ort":
            import onnxruntime

            where = "providers " + ", ".join(onnxruntime.get_available_providers())
            import torch

            if torch.cuda.is_available() and "cuda" not in ort_eps():
                where += f" (none for CUDA: GPU regions need it; {ORT_GPU_FIX})"
        elif backend == "openvino":
            import openvino

            from cuvil_pgc.recompile._signal_stack import kept_signal_stack

            with kept_signal_stack():
                where = "devices " + ", ".join(openvino.Core().available_devices)
        else:
            import torch

            if not torch.cuda.is_available():
                return RuntimeStatus(backend, False, status.detail, reason="installed, but no CUDA device is "
                                     "visible: TensorRT regions need an NVIDIA GPU", fix="run on a GPU machine")
            where = f"GPU {torch.cuda.get_device_name()}"
    except Exception as exc:   # the package imports but cannot start
        return RuntimeStatus(backend, False, status.detail, reason=f"{RUNTIMES[backend].title} cannot start: "
                             f"{type(exc).__name__}: {exc}", fix=f"reinstall it: {RUNTIMES[backend].fix}")
    return RuntimeStatus(backend, True, f"{status.detail}; {where}")
