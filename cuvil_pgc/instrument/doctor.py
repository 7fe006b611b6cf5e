"""Which profiling backends work on this machine, and for each that does not: why, and what to do.

Each check is a plain function returning a :class:`BackendCheck`; :func:`run_checks` runs them all.
They never raise (a check that crashes reports that as its reason) and import their backend only
when run. The GPU samplers' backends are asked through the samplers themselves
(:meth:`~cuvil_pgc.instrument.samplers.base.Sampler.probe`), so doctor and a session agree.
``cuvil-pgc doctor`` (:mod:`cuvil_pgc.cli.doctor`) runs them and the recompiler's runtime
checks, and renders the result.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from cuvil_pgc.instrument.samplers.base import Probe
from cuvil_pgc.instrument.samplers.cupti_kernels import CuptiKernelSampler
from cuvil_pgc.instrument.samplers.nvml import NvmlSampler

NVIDIA_PARAMS = "/proc/driver/nvidia/params"
PROFILING_PARAM = "RmProfilingAdminOnly"
PROFILING_FIX = ("run as root, or set `options nvidia NVreg_RestrictProfilingToAdminUsers=0` in "
                 "/etc/modprobe.d/ and reload the nvidia module")


@dataclass(frozen=True)
class BackendCheck:
    """One backend: ``ok``, what was found (``detail``), and if not ok ``reason`` and ``fix``."""

    name: str
    ok: bool
    detail: str = ""
    reason: str | None = None
    fix: str | None = None

    @property
    def status(self) -> str:
        return "ok" if self.ok else "unavailable"

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), status=self.status)

    @classmethod
    def of(cls, name: str, probe: Probe) -> BackendCheck:
        """The check of a sampler's backend, as its :meth:`~cuvil_pgc.instrument.samplers.Sampler.probe` says."""
        return cls(name, probe.ok, probe.detail, probe.reason, probe.fix)


def check_torch() -> BackendCheck:
    try:
        import torch
    except ImportError as exc:
        return BackendCheck("torch", False, reason=f"torch is not importable ({exc})",
                            fix="pip install torch (2.6 to 2.14)")
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU-only build"
    return BackendCheck("torch", True, f"torch {torch.__version__} ({build})")


def check_op_capture() -> BackendCheck:
    """torch.profiler records aten operators on the CPU (the op sampler's backend)."""
    name = "torch.profiler CPU op capture"
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as exc:
        return BackendCheck(name, False, reason=f"torch.profiler is not importable ({exc})", fix="install torch")
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        torch.ones(4).add_(1)
    names = {e.name for e in prof.events()}
    if "aten::add_" not in names:
        return BackendCheck(name, False, reason="torch.profiler recorded no aten::add_ for a tensor add",
                            fix="check that no other profiler is active in this process")
    return BackendCheck(name, True, f"{len(names)} operator names seen in a one-op probe")


def check_compile() -> BackendCheck:
    """torch.compile with Inductor needs a C/C++ compiler (CPU) and Triton (GPU)."""
    name = "torch.compile (inductor)"
    try:
        import torch._inductor  # noqa: F401
    except ImportError as exc:
        return BackendCheck(name, False, reason=f"torch._inductor is not importable ({exc})",
                            fix="install a torch build with Inductor (any 2.x wheel from pytorch.org)")
    compiler = _find_compiler()
    if compiler is None:
        return BackendCheck(name, False, reason="no C/C++ compiler found (CXX, c++, g++, clang++)",
                            fix="install one, e.g. `apt-get install g++`, or set CXX")
    detail = f"C++ compiler {compiler}"
    if _cuda_usable():
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            return BackendCheck(name, False, detail, reason="Triton is missing: Inductor cannot build GPU kernels",
                                fix="pip install triton (matching your torch)")
        detail += ", Triton present"
    return BackendCheck(name, True, detail)


def check_cuda() -> BackendCheck:
    try:
        import torch
    except ImportError:
        return BackendCheck("CUDA", False, reason="torch is not importable", fix="install torch")
    if not torch.version.cuda:
        return BackendCheck("CUDA", False, reason=f"torch {torch.__version__} is a CPU-only build",
                            fix="install a CUDA build of torch (https://pytorch.org/get-started)")
    if not torch.cuda.is_available():
        return BackendCheck("CUDA", False, reason="no CUDA device or driver visible to torch",
                            fix="check nvidia-smi, the driver install and CUDA_VISIBLE_DEVICES")
    names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return BackendCheck("CUDA", True, f"CUDA {torch.version.cuda}: " + ", ".join(names))


def check_cupti() -> BackendCheck:
    """cupti-python importable, libcupti and the driver loadable, and CUPTI not held by another tool."""
    return BackendCheck.of("CUPTI (kernels)", CuptiKernelSampler().probe())


def check_nvml() -> BackendCheck:
    """NVML starts, sees GPUs, and whether each supports GPM (SM activity and occupancy)."""
    return BackendCheck.of("NVML (utilization)", NvmlSampler().probe())


def check_counter_permission(params_path: str = NVIDIA_PARAMS) -> BackendCheck:
    """NVreg_RestrictProfilingToAdminUsers: may this user read GPU performance counters?"""
    name = "GPU counters permission"
    try:
        with open(params_path) as fh:
            params = dict(line.split(":", 1) for line in fh if ":" in line)
    except OSError:
        return BackendCheck(name, False, reason=f"no NVIDIA kernel driver ({params_path} is missing)",
                            fix="install the NVIDIA driver")
    restricted = params.get(PROFILING_PARAM, "").strip()
    if restricted == "1" and os.geteuid() != 0:
        return BackendCheck(name, False, reason="NVreg_RestrictProfilingToAdminUsers=1: performance counters "
                                                "(CUPTI_ERROR_INSUFFICIENT_PRIVILEGES) are for admin users only",
                            fix=PROFILING_FIX)
    who = "root" if os.geteuid() == 0 else "all users"
    return BackendCheck(name, True, f"counters readable ({PROFILING_PARAM}={restricted or '?'}, {who})")


def check_cpu_util(proc: str = "/proc") -> BackendCheck:
    """/proc/stat and /proc/self/stat readable: the CPU utilization timeline."""
    name = "CPU utilization (/proc)"
    try:
        with open(os.path.join(proc, "stat")) as fh:
            cores = sum(1 for line in fh if line.startswith("cpu") and line[3:4].isdigit())
        with open(os.path.join(proc, "self", "stat")) as fh:
            fh.read()
    except OSError as exc:
        return BackendCheck(name, False, reason=f"cannot read {proc}: {exc}",
                            fix="run on Linux with /proc mounted (psutil is used elsewhere)")
    return BackendCheck(name, True, f"{cores} cores, process and per-core times")


def check_region_accel() -> BackendCheck:
    """The C accelerator of ProfileRegion (built at install when a C compiler is present)."""
    from cuvil_pgc.instrument import region

    return c_extension_check("region accelerator (C)", region.ACCELERATED, "cuvil_pgc.instrument._fastregion",
                             "regions and the trace writer run in C", "regions run in pure Python", "~10x the cost")


def c_extension_check(name: str, loaded: bool, module: str, detail: str, without: str, cost: str) -> BackendCheck:
    """A check of one of the optional C extensions setup.py builds: ``detail`` where it ``loaded``;
    else why not (``without`` it, what runs instead, at ``cost``) and the fix."""
    import importlib.util

    if loaded:
        return BackendCheck(name, True, detail)
    if os.environ.get("CUVIL_PGC_PURE_PYTHON"):
        return BackendCheck(name, False, reason=f"CUVIL_PGC_PURE_PYTHON is set: {without}",
                            fix="unset CUVIL_PGC_PURE_PYTHON")
    built = importlib.util.find_spec(module) is not None
    return BackendCheck(name, False, reason="the extension is built but does not load" if built else
                        f"the extension was not built at install: {without} ({cost})",
                        fix="install a C compiler and the Python headers (e.g. apt-get install gcc python3-dev), "
                            "then reinstall cuvil-pgc")


# CUPTI is probed before torch.profiler runs: on a CUDA build, starting torch.profiler makes Kineto
# subscribe to CUPTI, and the CUPTI check would then report this very process as the other tool.
CHECKS: list[Callable[[], BackendCheck]] = [
    check_torch, check_cuda, check_cupti, check_nvml, check_counter_permission, check_op_capture,
    check_compile, check_cpu_util, check_region_accel,
]


def run_checks(checks: list[Callable[[], BackendCheck]] | None = None) -> list[BackendCheck]:
    """Run every check (the editable default list ``CHECKS``); a crashing check reports its error."""
    results = []
    for check in CHECKS if checks is None else checks:
        try:
            results.append(check())
        except Exception as exc:
            label = (check.__doc__ or check.__name__).strip().splitlines()[0]
            results.append(BackendCheck(check.__name__.removeprefix("check_"), False,
                                        reason=f"check crashed: {type(exc).__name__}: {exc}",
                                        fix=f"report this ({label})"))
    return results


def _find_compiler() -> str | None:
    for candidate in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


def _cuda_usable() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False
