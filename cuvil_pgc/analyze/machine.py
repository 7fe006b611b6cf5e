"""The machine model: the roofs that bottleneck attribution measures regions against.

A :class:`MachineModel` holds, for one device, peak matmul FLOP/s per dtype, sustained memory
bandwidth, and the fixed cost of one op: eager dispatch overhead on the CPU, kernel-launch cost on
a GPU. :func:`calibrate` measures them with short microbenchmarks (``_microbench``; <= 30 s on a
CPU, <= 5 s with ``quick``) and caches the result per machine fingerprint (CPU model and ISA
flags or GPU name, core count, torch version, device) under :func:`cache_dir`.
:func:`default_machine` returns the cached model for this machine (a GPU's found by its name, through
:func:`cached_gpu_model`, without importing torch), or, when none was cached, a documented fallback (``source="fallback"``) with a one-time warning telling the user to run
``cuvil-pgc calibrate``.

Files are JSON (``to_json`` / ``from_json``, ``save`` / ``load``); a file that is not a valid
machine model raises :class:`~cuvil_pgc.errors.AnalysisError` naming the file and the field.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cuvil_pgc._cpu_identity import cpu_identity
from cuvil_pgc.errors import AnalysisError, ConfigError

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
CACHE_DIR_ENV = "CUVIL_CACHE_DIR"        # overrides the cache folder (default ~/.cache/cuvil-pgc)
DTYPES = ("fp32", "bf16", "fp16")
SOURCES = ("measured", "fallback", "datasheet")   # datasheet: a known GPU named by the trace (gpu_specs)
_DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


@dataclass
class MachineModel:
    """Roofs of one device, measured by :func:`calibrate` or taken from the fallback.

    Attributes:
        device: ``"cpu"`` or ``"cuda:N"``.
        name: human-readable device description.
        fingerprint: identity of the machine the figures belong to (see :func:`machine_identity`).
        peak_flops: FLOP/s of a large matmul per dtype (``fp32`` always; ``bf16``/``fp16`` where
            the device runs them at all, even if slowly: see ``notes``).
        mem_bw: sustained memory bandwidth, bytes/s, reads and writes counted.
        dispatch_overhead_s: host cost of one eager op (CPU ops; on CUDA the enqueue cost).
        launch_latency_s: per-kernel cost of a launch-bound chain of kernels (CUDA only).
        threads: torch intra-op threads during calibration (None: unknown).
        source: ``"measured"`` or ``"fallback"``.
        measured_at: ISO 8601 UTC time of the calibration (None for the fallback).
        torch_version: torch the figures were measured with.
        notes: per-figure remarks, e.g. why a dtype is missing or slow.
        details: the evidence behind each figure (sizes, samples, medians), free-form.
    """

    device: str
    name: str
    fingerprint: str
    peak_flops: dict[str, float]
    mem_bw: float
    dispatch_overhead_s: float | None = None
    launch_latency_s: float | None = None
    threads: int | None = None
    source: str = "measured"
    measured_at: str | None = None
    torch_version: str = ""
    notes: dict[str, str] = field(default_factory=dict)
    details: dict[str, Any] = field(default_factory=dict)

    def peak(self, dtype: str = "fp32") -> float:
        """Peak FLOP/s for ``dtype`` (``fp32``, ``bf16``, ``fp16``; torch names are accepted)."""
        key = normalize_dtype(dtype)
        if key not in self.peak_flops:
            raise AnalysisError(f"machine model of {self.name} has no {key} peak "
                                f"({self.notes.get(key, 'not measured')})",
                                fix=f"use one of {', '.join(self.peak_flops)}")
        return self.peak_flops[key]

    def ridge(self, dtype: str = "fp32") -> float:
        """Ridge point: the arithmetic intensity (FLOP/byte) where memory-bound turns compute-bound."""
        return self.peak(dtype) / self.mem_bw

    def roof(self, intensity: float, dtype: str = "fp32") -> float:
        """Attainable FLOP/s at ``intensity`` FLOP/byte: ``min(peak, mem_bw * intensity)``."""
        return min(self.peak(dtype), self.mem_bw * intensity)

    @property
    def dispatch_us(self) -> float:
        """Per-op host dispatch overhead in µs (0 when unknown)."""
        return (self.dispatch_overhead_s or 0.0) * 1e6

    @property
    def launch_us(self) -> float:
        """Per-kernel launch cost in µs (0 on a CPU model)."""
        return (self.launch_latency_s or 0.0) * 1e6

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; :meth:`from_json` reads it back."""
        return {"schema_version": SCHEMA_VERSION, **asdict(self)}

    @classmethod
    def from_json(cls, doc: Any, path: str | os.PathLike[str] | None = None) -> MachineModel:
        """Validate and build a model; AnalysisError names ``path`` and the bad field."""
        return cls(**_validated(doc, path))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write the model as JSON (atomically: a reader never sees half a file)."""
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(self.to_json(), indent=2) + "\n", encoding="utf-8")
        os.replace(tmp, target)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> MachineModel:
        """Read a file written by :meth:`save` or ``cuvil-pgc calibrate -o``."""
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise AnalysisError("machine file does not exist", path=path,
                                fix="create it with `cuvil-pgc calibrate -o FILE`") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise AnalysisError(f"cannot read machine file ({exc})", path=path) from None
        try:
            doc = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AnalysisError(f"machine file is not JSON ({exc.msg} at line {exc.lineno})", path=path,
                                fix="recreate it with `cuvil-pgc calibrate -o FILE`") from None
        return cls.from_json(doc, path)


def normalize_dtype(dtype: Any) -> str:
    """``torch.bfloat16`` / ``"bfloat16"`` / ``"bf16"`` -> ``"bf16"`` (unknown names pass through)."""
    name = str(dtype).removeprefix("torch.")
    return _DTYPE_ALIASES.get(name, name)


# ---------------------------------------------------------------- validation of machine files

def _bad(path: Any, field_name: str, problem: str) -> AnalysisError:
    return AnalysisError(f"machine file field {field_name!r} {problem}", path=path,
                         fix="recreate the file with `cuvil-pgc calibrate -o FILE`")


def _positive(value: Any, path: Any, field_name: str, optional: bool = False) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(path, field_name, f"must be a number, got {type(value).__name__}")
    number = float(value) if isinstance(value, float) or abs(value) < 2 ** 1000 else math.inf
    if not math.isfinite(number) or number <= 0:
        raise _bad(path, field_name, f"must be a positive finite number, got {value!r:.40}")
    return number


def _typed(doc: dict, key: str, kind: type | tuple, path: Any, optional: bool = False) -> Any:
    if key not in doc:
        if optional:
            return None
        raise _bad(path, key, "is missing")
    value = doc[key]
    if (value is None and optional) or (isinstance(value, kind) and not isinstance(value, bool)):
        return value
    raise _bad(path, key, f"has type {type(value).__name__}")


def _validated(doc: Any, path: Any) -> dict[str, Any]:
    if not isinstance(doc, dict):
        raise AnalysisError(f"machine file holds a JSON {type(doc).__name__}, not an object", path=path,
                            fix="recreate it with `cuvil-pgc calibrate -o FILE`")
    version = _typed(doc, "schema_version", int, path)
    if version < 1:
        raise _bad(path, "schema_version", f"is {version}, not a version number")
    if version > SCHEMA_VERSION:
        raise _bad(path, "schema_version", f"is {version}, newer than this cuvil-pgc reads "
                                           f"({SCHEMA_VERSION}); upgrade cuvil-pgc")
    out: dict[str, Any] = {
        "device": _device_field(_typed(doc, "device", str, path), path),
        "name": _typed(doc, "name", str, path),
        "fingerprint": _typed(doc, "fingerprint", str, path),
    }
    peaks = _typed(doc, "peak_flops", dict, path)
    if "fp32" not in peaks:
        raise _bad(path, "peak_flops.fp32", "is missing")
    out["peak_flops"] = {str(k): _positive(v, path, f"peak_flops.{k}") for k, v in peaks.items()}
    out["mem_bw"] = _positive(_typed(doc, "mem_bw", int | float, path), path, "mem_bw")
    for key in ("dispatch_overhead_s", "launch_latency_s"):
        out[key] = _positive(doc.get(key), path, key, optional=True)
    if out["device"] == "cpu" and out["dispatch_overhead_s"] is None:
        raise _bad(path, "dispatch_overhead_s", "is missing (a CPU model needs it)")
    out["threads"] = _typed(doc, "threads", int, path, optional=True)
    out["source"] = _typed(doc, "source", str, path)
    if out["source"] not in SOURCES:
        raise _bad(path, "source", f"is {out['source']!r}, not one of {', '.join(SOURCES)}")
    out["measured_at"] = _typed(doc, "measured_at", str, path, optional=True)
    out["torch_version"] = _typed(doc, "torch_version", str, path, optional=True) or ""
    out["notes"] = _typed(doc, "notes", dict, path, optional=True) or {}
    out["details"] = _typed(doc, "details", dict, path, optional=True) or {}
    return out


def _device_field(device: str, path: Any) -> str:
    try:
        return normalize_device(device)
    except ConfigError:
        raise _bad(path, "device", f"is {device!r}, not 'cpu' or 'cuda:N'") from None


def normalize_device(device: str) -> str:
    """``"cpu"`` -> ``"cpu"``; ``"cuda"`` -> ``"cuda:0"``; ``"cuda:N"`` kept; else ConfigError."""
    text = str(device).strip().lower()
    if text == "cpu":
        return "cpu"
    if text == "cuda":
        return "cuda:0"
    if text.startswith("cuda:") and text[5:].isdigit():
        return f"cuda:{int(text[5:])}"
    raise ConfigError(f"device {device!r} is not cpu, cuda or cuda:N")


# ---------------------------------------------------------------- identity and cache

def _torch_version() -> str:
    from importlib import metadata

    try:
        return metadata.version("torch")       # no torch import: default_machine stays cheap
    except metadata.PackageNotFoundError:
        import torch

        return torch.__version__


def machine_identity(device: str = "cpu") -> dict[str, Any]:
    """What the figures depend on: CPU model and ISA flags or GPU, cores, torch version, device."""
    device = normalize_device(device)
    identity: dict[str, Any] = {"device": device, **cpu_identity(), "torch": _torch_version()}
    if device.startswith("cuda"):
        identity.update(_cuda_identity(device))
    return identity


def _cuda_identity(device: str) -> dict[str, Any]:
    torch = require_cuda(device)
    index = int(device.split(":")[1])
    props = torch.cuda.get_device_properties(index)
    return {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
            "cuda": torch.version.cuda}


def require_cuda(device: str) -> Any:
    """Import torch and check that ``device`` exists; ConfigError saying why not otherwise."""
    import torch

    if not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device is visible"
        raise ConfigError(f"--device {device}: {why} (torch {torch.__version__})",
                          fix="run on a machine with an NVIDIA GPU and a CUDA build of torch, "
                              "or use --device cpu")
    index = int(device.split(":")[1])
    if index >= torch.cuda.device_count():
        raise ConfigError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here",
                          fix="pick an index below the device count")
    return torch


def fingerprint_of(identity: dict[str, Any]) -> str:
    """A short stable hash of :func:`machine_identity`."""
    blob = json.dumps(identity, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def describe(identity: dict[str, Any]) -> str:
    """Human-readable device name for tables and reports."""
    if "gpu" in identity:
        return f"{identity['gpu']} (sm_{identity['capability'].replace('.', '')}, CUDA {identity['cuda']})"
    isa = ", ".join(f for f in identity["isa"] if f.startswith(("avx", "amx", "sve"))) or identity["arch"]
    return f"{identity['cpu']} ({identity['cores']} cores, {isa})"


def cache_dir() -> Path:
    """The cache directory (:func:`cuvil_pgc._cache.cache_dir`)."""
    from cuvil_pgc._cache import cache_dir as root

    return root()


def cache_path(fingerprint: str) -> Path:
    """Where the calibrated model of the machine with ``fingerprint`` is cached."""
    return cache_dir() / f"machine-{fingerprint}.json"


# ---------------------------------------------------------------- fallback and default

# Figures used when this machine was never calibrated, marked source="fallback".
# CPU: rounded from `cuvil-pgc calibrate` runs on a small, busy 2-vCPU AVX2 cloud VM (AMD EPYC,
# torch 2.13, 2 threads), which measured 72-173 GFLOP/s fp32, 5-35 GB/s (the low end: medians
# under load) and 1.5-3 µs per eager op. No bf16 / fp16 peaks: whether a CPU has fast
# low-precision matmul (AMX, AVX512-BF16) varies too much to guess; that one ran them at 2-3% of fp32.
FALLBACK_CPU = {"peak_flops": {"fp32": 100e9}, "mem_bw": 10e9, "dispatch_overhead_s": 2e-6}
FALLBACK_CUDA = {"peak_flops": {"fp32": 19.5e12, "bf16": 312e12, "fp16": 312e12}, "mem_bw": 1.555e12,
                 "dispatch_overhead_s": 2e-6, "launch_latency_s": 5e-6}
_warned: set[str] = set()


def fallback_machine(device: str = "cpu", identity: dict[str, Any] | None = None) -> MachineModel:
    """The documented fallback model for ``device`` (source="fallback")."""
    device = normalize_device(device)
    identity = identity or _identity_or_generic(device)
    return _fallback(device, describe(identity), identity, "uncalibrated fallback figures; run `cuvil-pgc calibrate`")


def elsewhere_machine(device: str, where: str) -> MachineModel:
    """The documented fallback for a device of another machine, one the trace was recorded on
    (``where`` names it) but does not describe: a Kineto trace names its GPUs, never its CPU. Never
    this machine's figures, calibrated or not: they say nothing about the recording machine."""
    device = normalize_device(device)
    what = "CPU" if device == "cpu" else "GPU"
    return _fallback(device, f"the {what} of {where}",
                     {"device": device, "recorded_on": where},
                     f"documented fallback figures: the trace was recorded on {where}, whose {what} it does "
                     "not describe; pass `--machine` with a calibration made there (`cuvil-pgc calibrate -o`)")


def _fallback(device: str, name: str, identity: dict[str, Any], note: str) -> MachineModel:
    figures = FALLBACK_CPU if device == "cpu" else FALLBACK_CUDA
    return MachineModel(device=device, name=name, fingerprint=fingerprint_of(identity), source="fallback",
                        torch_version=identity.get("torch", ""), notes={"source": note},
                        **{k: (dict(v) if isinstance(v, dict) else v) for k, v in figures.items()})


def _identity_or_generic(device: str) -> dict[str, Any]:
    if device == "cpu":
        return machine_identity(device)
    names = local_gpu_names()     # a GPU's identity without torch (2-3 s): analysis never imports it
    index = int(device.split(":")[1])
    return _generic_gpu_identity(device, names[index] if index < len(names) else "unknown GPU")


def _generic_gpu_identity(device: str, gpu: str = "unknown GPU") -> dict[str, Any]:
    return {**machine_identity("cpu"), "device": device, "gpu": gpu, "capability": "?", "cuda": "?"}


# Where the NVIDIA driver describes each GPU (one folder per PCI address, with an ``information`` file).
NVIDIA_PROC_GPUS = "/proc/driver/nvidia/gpus"


def nvidia_gpu_visible() -> bool:
    """Whether this machine could have a CUDA device, decided without importing torch (2-3 s):
    the NVIDIA driver lists its GPUs in /proc/driver/nvidia/gpus (Linux) and makes /dev/nvidia0..;
    ``CUDA_VISIBLE_DEVICES`` set to nothing or -1 hides them. Elsewhere (no procfs), assume yes."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    if not os.path.isdir("/proc"):
        return True
    try:
        if os.listdir(NVIDIA_PROC_GPUS):
            return True
    except OSError:
        pass
    return any(name.startswith("nvidia") and name[6:].isdigit() for name in _dev_names())


def _dev_names() -> list[str]:
    try:
        return os.listdir("/dev")
    except OSError:
        return []


def local_gpu_names() -> list[str]:
    """Model names of this machine's NVIDIA GPUs (e.g. ``NVIDIA H200``, as CUDA names them), without
    torch: from the driver's ``/proc/driver/nvidia/gpus/*/information`` ("Model:"), in PCI order,
    else from NVML; [] when no GPU is visible. The order is the driver's, which CUDA's device
    numbering need not follow (CUDA_DEVICE_ORDER, CUDA_VISIBLE_DEVICES)."""
    if not nvidia_gpu_visible():
        return []
    names = []
    try:
        folders = sorted(os.listdir(NVIDIA_PROC_GPUS))
    except OSError:
        folders = []
    for folder in folders:
        try:
            with open(os.path.join(NVIDIA_PROC_GPUS, folder, "information"), encoding="utf-8",
                      errors="replace") as fh:
                for line in fh:
                    key, sep, value = line.partition(":")
                    if sep and key.strip() == "Model" and value.strip():
                        names.append(value.strip())
                        break
        except OSError:
            continue
    return names or _nvml_gpu_names()


def _nvml_gpu_names() -> list[str]:
    from cuvil_pgc.instrument.samplers.nvml import gpu_names

    return gpu_names()


def cached_gpu_model(name: str, sms: int | None = None, device: str | None = None) -> MachineModel | None:
    """The cached ``cuvil-pgc calibrate --device cuda`` calibration of a GPU named ``name`` (as
    CUDA names it, e.g. ``NVIDIA H200``) with ``sms`` SMs where both sides know it; None when there
    is none. Several: the one of ``device`` first, then the latest. Reads the cache files (their
    fingerprints need torch to compute), never imports torch."""
    folder = cache_dir()
    found = []
    for path in sorted(folder.glob("machine-*.json")) if folder.is_dir() else ():
        try:
            model = MachineModel.load(path)
        except AnalysisError:
            continue
        gpu = model.details.get("gpu") if isinstance(model.details.get("gpu"), dict) else {}
        cached_name = gpu.get("name") or model.name.split(" (")[0]     # before the record: describe()
        cached_sms = gpu.get("sms")
        if not model.device.startswith("cuda") or model.source != "measured" or cached_name != name:
            continue
        if sms is not None and cached_sms is not None and cached_sms != sms:
            continue
        found.append(model)
    found.sort(key=lambda m: (m.device == device, m.measured_at or ""), reverse=True)
    return found[0] if found else None


def default_machine(device: str = "cpu") -> MachineModel:
    """The cached calibration of this machine, else the fallback (warning once per device).
    A GPU's calibration is found by the name of this machine's GPU (:func:`cached_gpu_model`)."""
    device = normalize_device(device)
    identity = _identity_or_generic(device)
    if device == "cpu":
        path = cache_path(fingerprint_of(identity))
        if path.is_file():
            try:
                return MachineModel.load(path)
            except AnalysisError as exc:
                _warn_once(device, f"ignoring unusable cached machine model: {exc}")
    else:
        for name in dict.fromkeys([identity["gpu"], *local_gpu_names()]):
            model = cached_gpu_model(name, device=device)
            if model is not None:
                return model
    _warn_once(device, "warning: " + uncalibrated_warning(device))
    return fallback_machine(device, identity)


def uncalibrated_warning(device: str) -> str:
    """The one wording of the "uncalibrated machine" warning, with the command that fixes it."""
    fix = "cuvil-pgc calibrate" + ("" if device == "cpu" else f" --device {device}")
    return (f"this machine's {device} is not calibrated: bottleneck figures use documented fallback "
            f"peaks; run `{fix}` once (about 20 s) to measure them")


def _warn_once(device: str, message: str) -> None:
    if device not in _warned:
        _warned.add(device)
        log.warning(message)


# ---------------------------------------------------------------- calibration

def calibrate(device: str = "cpu", quick: bool = False, cache: bool = True) -> MachineModel:
    """Measure this machine's roofs for ``device`` and (with ``cache``) cache them.

    The latest calibration, quick or not, replaces the cached one for this fingerprint.
    CPU: <= 30 s (quick: <= 5 s), importing torch aside, at torch's default thread count, which
    is recorded.
    Raises ConfigError for an unknown device or a CUDA device that is not there.
    """
    import torch  # noqa: F401  (imported before the clock starts: not part of the budget)

    from cuvil_pgc.analyze import _microbench

    device = normalize_device(device)
    identity = machine_identity(device)
    started = time.perf_counter()
    figures = _microbench.measure(device, quick)
    model = measured_model(identity, figures)
    model.details["calibration_s"] = round(time.perf_counter() - started, 3)
    model.details["quick"] = quick
    if "contention" in model.notes:
        log.warning("calibrate: %s", model.notes["contention"])
    if cache:
        model.save(cache_path(model.fingerprint))
    return model


def measured_model(identity: dict[str, Any], figures: dict[str, Any]) -> MachineModel:
    """The model :func:`calibrate` caches for the machine ``identity`` from measured ``figures``.
    A GPU's records its name and SM count (``details["gpu"]``): what analysis finds it by, since the
    name is also in the trace's ``deviceProperties`` and the driver's /proc files, torch-free."""
    model = MachineModel(device=identity["device"], name=describe(identity), fingerprint=fingerprint_of(identity),
                         source="measured", torch_version=identity["torch"],
                         measured_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                         **figures)
    if "gpu" in identity:
        model.details["gpu"] = {"name": identity["gpu"], "sms": identity.get("sms")}
    return model
