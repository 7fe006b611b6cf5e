"""GPU utilization timeline from NVML (nvidia-ml-py), sampled on a background thread.

Contract:
- Per visible GPU (``CUDA_VISIBLE_DEVICES`` respected; keys ``gpu<cuda index>``), at ``sample_hz``:
  ``sm_util`` and ``sm_occupancy`` (GPM ``SM_UTIL`` / ``SM_OCCUPANCY``, Hopper and newer),
  ``mem_bw_util`` (GPM ``DRAM_BW_UTIL``), ``sm_clock_mhz``, ``power_w`` and ``mem_used_bytes``.
  Without GPM, ``sm_util`` and ``mem_bw_util`` come from ``nvmlDeviceGetUtilizationRates`` (the coarse
  "a kernel was running" percentage; the status says so) and ``sm_occupancy`` is unavailable.
- Counter events (``ph: "C"``), one per metric and tick, ``args`` keyed by device (``{"gpu0": 41.5}``).
  GPM values are averages over the interval between two samples and are stamped at its start;
  the others are stamped when read.
- A metric NVML refuses (``NVML_ERROR_NOT_SUPPORTED`` on older GPUs or MIG, ``NO_PERMISSION``) is
  recorded in ``status["metrics"][device][metric]["unavailable"]`` with the reason and never
  emitted, not even as 0.
- Like py-spy, the sampler measures how late each tick ran against its schedule: ``status["lag_ms"]``
  holds p50 and max; ticks skipped because a tick overran are counted in ``missed_ticks``.
- Nothing here raises into the user's program; pynvml is imported only when the sampler runs.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
import time
from typing import Any

from cuvil_pgc.instrument.samplers.base import GPU_EXTRA_FIX, Probe, Sampler, SamplerContext
from cuvil_pgc.trace import schema

GPM_SOURCE = "gpm"
RATES_SOURCE = "utilization_rates"
RATES_NOTE = ("coarse: percent of time any kernel was running (nvmlDeviceGetUtilizationRates), "
              "not SM activity; GPM metrics need a Hopper or newer GPU")
LAG_SAMPLES_MAX = 1 << 16

# counter name -> GPM metric constant name in pynvml
_GPM_METRICS = {
    schema.COUNTER_SM_UTIL: "NVML_GPM_METRIC_SM_UTIL",
    schema.COUNTER_SM_OCCUPANCY: "NVML_GPM_METRIC_SM_OCCUPANCY",
    schema.COUNTER_MEM_BW_UTIL: "NVML_GPM_METRIC_DRAM_BW_UTIL",
}


def _import_nvml() -> Any:
    """The NVML bindings (``pynvml`` from nvidia-ml-py); the import seam tests replace with a fake."""
    import pynvml

    return pynvml


def nvml_error_reason(nvml: Any, exc: BaseException) -> str:
    """``NVML_ERROR_NOT_SUPPORTED (Not Supported)``-style text for an NVMLError."""
    value = getattr(exc, "value", None)
    for name in dir(nvml):
        if name.startswith("NVML_ERROR_") and getattr(nvml, name) == value:
            return f"{name} ({exc})"
    return f"{type(exc).__name__}: {exc}"


def cuda_present() -> bool:
    """Cheaply: is a CUDA GPU usable here? Uses torch only if the program imported it already."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return bool(torch.cuda.is_available())
        except Exception:
            return False
    try:
        nvml = _import_nvml()
        nvml.nvmlInit()
    except Exception:
        return _libcuda_loadable()
    try:
        return nvml.nvmlDeviceGetCount() > 0
    except Exception:
        return False
    finally:
        _quietly(nvml.nvmlShutdown)


def gpu_names() -> list[str]:
    """Names of the GPUs this process sees, as NVML gives them ([] without pynvml or a driver)."""
    try:
        nvml = _import_nvml()
        nvml.nvmlInit()
    except Exception:
        return []
    try:
        return [str(nvml.nvmlDeviceGetName(handle)) for _, handle in visible_devices(nvml)]
    except Exception:
        return []
    finally:
        _quietly(nvml.nvmlShutdown)


def _libcuda_loadable() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def visible_devices(nvml: Any) -> list[tuple[int, Any]]:
    """(CUDA index, NVML handle) of the GPUs this process sees, honouring CUDA_VISIBLE_DEVICES."""
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
    spec = os.environ.get("CUDA_VISIBLE_DEVICES")
    if spec is None:
        return list(enumerate(handles))
    chosen = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            break
        if item.isdigit():
            if int(item) >= len(handles):
                break   # CUDA stops at the first invalid entry too
            chosen.append(handles[int(item)])
        else:
            match = [h for h in handles if str(nvml.nvmlDeviceGetUUID(h)).startswith(item)]
            if not match:
                return list(enumerate(handles))     # MIG UUIDs and the like: sample every GPU
            chosen.append(match[0])
    return list(enumerate(chosen))


class _Device:
    """One GPU: its handle, how each metric is read, and its GPM sample pair."""

    def __init__(self, nvml: Any, index: int, handle: Any) -> None:
        self.nvml, self.index, self.handle = nvml, index, handle
        self.key = f"gpu{index}"
        self.sources: dict[str, dict[str, Any]] = {}
        self.gpm_samples: list[Any] = []

    def info(self) -> dict[str, Any]:
        nvml, h = self.nvml, self.handle
        info: dict[str, Any] = {"index": self.index, "kind": "cuda"}
        for key, read in (("name", lambda: str(nvml.nvmlDeviceGetName(h))),
                          ("uuid", lambda: str(nvml.nvmlDeviceGetUUID(h))),
                          ("memory_bytes", lambda: int(nvml.nvmlDeviceGetMemoryInfo(h).total)),
                          ("compute_capability", lambda: "{}.{}".format(*nvml.nvmlDeviceGetCudaComputeCapability(h))),
                          ("driver_version", lambda: str(nvml.nvmlSystemGetDriverVersion()))):
            try:
                info[key] = read()
            except Exception:
                info[key] = None
        return info

    def plan(self) -> None:
        """Decide each metric's source by asking NVML once; refusals become 'unavailable'."""
        gpm = self._start_gpm()
        for metric in _GPM_METRICS:
            if gpm:
                self.sources[metric] = {"source": GPM_SOURCE}
            else:
                self._fallback(metric, "GPM is not supported on this GPU (needs Hopper or newer)")
        for metric, read in self._plain_readers().items():
            self._probe(metric, read, {"source": metric_source(metric)})

    def _start_gpm(self) -> bool:
        nvml = self.nvml
        try:
            if not nvml.nvmlGpmQueryDeviceSupport(self.handle).isSupportedDevice:
                return False
            self.gpm_samples = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
            nvml.nvmlGpmSampleGet(self.handle, self.gpm_samples[0])
        except Exception:
            self.free()
            return False
        return True

    def _fallback(self, metric: str, why: str) -> None:
        if metric == schema.COUNTER_SM_OCCUPANCY:
            self.sources[metric] = {"unavailable": why}
            return
        attr = "gpu" if metric == schema.COUNTER_SM_UTIL else "memory"
        self._probe(metric, lambda: getattr(self.nvml.nvmlDeviceGetUtilizationRates(self.handle), attr),
                    {"source": RATES_SOURCE, "note": RATES_NOTE})

    def _plain_readers(self) -> dict[str, Any]:
        nvml, h = self.nvml, self.handle
        return {
            schema.COUNTER_SM_CLOCK: lambda: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
            schema.COUNTER_POWER: lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            schema.COUNTER_MEM_USED: lambda: nvml.nvmlDeviceGetMemoryInfo(h).used,
        }

    def _probe(self, metric: str, read, source: dict[str, Any]) -> None:
        try:
            read()
        except Exception as exc:
            self.sources[metric] = {"unavailable": self._reason(exc)}
            return
        self.sources[metric] = dict(source, read=read)

    def _reason(self, exc: BaseException) -> str:
        reason = nvml_error_reason(self.nvml, exc)
        try:
            if self.nvml.nvmlDeviceGetMigMode(self.handle)[0] == self.nvml.NVML_DEVICE_MIG_ENABLE:
                reason += "; MIG mode is on"
        except Exception:
            pass
        return reason

    def read_gpm(self) -> dict[str, float]:
        """GPM metrics over the interval since the previous call; refused metrics are retired."""
        nvml = self.nvml
        wanted = [m for m in _GPM_METRICS if self.sources[m].get("source") == GPM_SOURCE]
        if not wanted:
            return {}
        prev, cur = self.gpm_samples
        nvml.nvmlGpmSampleGet(self.handle, cur)
        request = nvml.c_nvmlGpmMetricsGet_t()
        request.version = nvml.NVML_GPM_METRICS_GET_VERSION
        request.numMetrics = len(wanted)
        request.sample1, request.sample2 = prev, cur
        for slot, metric in zip(request.metrics, wanted, strict=False):
            slot.metricId = getattr(nvml, _GPM_METRICS[metric])
        nvml.nvmlGpmMetricsGet(request)
        self.gpm_samples = [cur, prev]
        values = {}
        for slot, metric in zip(request.metrics, wanted, strict=False):
            if slot.nvmlReturn == nvml.NVML_SUCCESS:
                values[metric] = float(slot.value)
            else:
                self._fallback(metric, "GPM refused it: " + nvml_error_reason(nvml, nvml.NVMLError(slot.nvmlReturn)))
        return values

    def free(self) -> None:
        for sample in self.gpm_samples:
            _quietly(self.nvml.nvmlGpmSampleFree, sample)
        self.gpm_samples = []


def metric_source(metric: str) -> str:
    return {schema.COUNTER_SM_CLOCK: "nvmlDeviceGetClockInfo(SM)", schema.COUNTER_POWER: "nvmlDeviceGetPowerUsage",
            schema.COUNTER_MEM_USED: "nvmlDeviceGetMemoryInfo"}.get(metric, metric)


class NvmlSampler(Sampler):
    """Samples GPU utilization counters on a daemon thread (see the module docstring)."""

    name = "nvml"

    def __init__(self, sample_hz: float = 20.0) -> None:
        super().__init__()
        self.sample_hz = sample_hz
        self.devices: list[dict[str, Any]] = []
        self._nvml: Any = None
        self._initialized = False
        self._gpus: list[_Device] = []
        self._ctx: SamplerContext | None = None
        self._events: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lags_ns: list[int] = []
        self._missed = 0
        self._ticks = 0
        self._read_errors = 0

    def unavailable(self) -> str | None:
        if self.sample_hz <= 0:
            return "sample_hz is 0: utilization sampling is off"
        try:
            nvml = _import_nvml()
        except ImportError as exc:
            return f"nvidia-ml-py is not importable ({exc}); install it with `pip install 'cuvil-pgc[gpu]'`"
        try:
            nvml.nvmlInit()
        except Exception as exc:
            return f"NVML cannot start here: {nvml_error_reason(nvml, exc)} (no NVIDIA driver?)"
        self._nvml, self._initialized = nvml, True
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:
            count, why = 0, nvml_error_reason(nvml, exc)
        else:
            why = "NVML sees no GPU"
        if count <= 0:
            self._shutdown()
            return why
        return None

    def probe(self) -> Probe:
        """NVML starts and sees GPUs, and whether each supports GPM (SM activity and occupancy).
        Shuts NVML down again."""
        try:
            nvml = _import_nvml()
        except ImportError as exc:
            return Probe(False, reason=f"nvidia-ml-py is not importable ({exc})", fix=GPU_EXTRA_FIX)
        try:
            nvml.nvmlInit()
        except Exception as exc:
            return Probe(False, reason=f"NVML cannot start: {nvml_error_reason(nvml, exc)}",
                         fix="install the NVIDIA driver (libnvidia-ml.so.1) and run on a GPU machine")
        try:
            parts = [_describe_gpu(nvml, i, h) for i, h in visible_devices(nvml)]
        finally:
            _quietly(nvml.nvmlShutdown)
        if not parts:
            return Probe(False, reason="NVML sees no GPU", fix="check nvidia-smi and CUDA_VISIBLE_DEVICES")
        return Probe(True, f"{len(parts)} GPU(s): " + "; ".join(parts))

    def start(self, ctx: SamplerContext) -> None:
        self._ctx = ctx
        nvml = self._nvml
        self._gpus = [_Device(nvml, i, h) for i, h in visible_devices(nvml)]
        if not self._gpus:
            self._shutdown()
            self.status.update(status=schema.STATUS_UNAVAILABLE,
                               reason="CUDA_VISIBLE_DEVICES hides every GPU NVML sees")
            return
        for gpu in self._gpus:
            gpu.plan()
        self.devices = [gpu.info() for gpu in self._gpus]
        self.status.update(sample_hz=self.sample_hz, metrics=self._metric_status())
        self._thread = threading.Thread(target=self._run, name="cuvil-pgc-nvml", daemon=True)
        self._thread.start()

    def flush(self) -> None:
        with self._lock:
            events, self._events = self._events, []
        if events:
            self._ctx.emit(events)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        for gpu in self._gpus:
            gpu.free()
        self._shutdown()
        self.flush()
        self.status.update(metrics=self._metric_status(), samples=self._ticks, missed_ticks=self._missed,
                           read_errors=self._read_errors, lag_ms=self._lag_summary())

    # -- the sampling thread -------------------------------------------------------------------
    def _run(self) -> None:
        period_ns = int(1e9 / self.sample_hz)
        prev_ns = time.perf_counter_ns()
        due = prev_ns + period_ns
        while not self._stop.wait(max(0.0, (due - time.perf_counter_ns()) / 1e9)):
            now = time.perf_counter_ns()
            if len(self._lags_ns) < LAG_SAMPLES_MAX:
                self._lags_ns.append(now - due)
            try:
                self._tick(prev_ns, now)
            except Exception:
                self._read_errors += 1
            prev_ns = now
            due += period_ns
            late = time.perf_counter_ns() - due
            if late > 0:    # overran: skip the ticks already missed, keep the grid
                skipped = late // period_ns + 1
                self._missed += skipped
                due += skipped * period_ns

    def _tick(self, prev_ns: int, now_ns: int) -> None:
        to_us = self._ctx.clock.mono_to_us
        series: dict[tuple[str, float], dict[str, float]] = {}
        for gpu in self._gpus:
            for metric, value in self._read(gpu).items():
                gpm = gpu.sources[metric].get("source") == GPM_SOURCE
                ts = to_us(prev_ns if gpm else now_ns)
                series.setdefault((metric, ts), {})[gpu.key] = value
        events = [{"ph": "C", "name": metric, "pid": self._ctx.pid, "tid": 0, "ts": ts, "args": args}
                  for (metric, ts), args in series.items()]
        with self._lock:
            self._events.extend(events)
        self._ticks += 1

    def _read(self, gpu: _Device) -> dict[str, float]:
        values: dict[str, float] = {}
        try:
            values.update(gpu.read_gpm())
        except Exception:
            self._read_errors += 1
        for metric, source in gpu.sources.items():
            read = source.get("read")
            if read is None:
                continue
            try:
                values[metric] = float(read())
            except Exception:
                self._read_errors += 1
        return values

    # -- status ----------------------------------------------------------------------------------
    def _metric_status(self) -> dict[str, dict[str, dict[str, Any]]]:
        return {gpu.key: {m: {k: v for k, v in s.items() if k != "read"} for m, s in gpu.sources.items()}
                for gpu in self._gpus}

    def _lag_summary(self) -> dict[str, float] | None:
        lags = sorted(self._lags_ns)
        if not lags:
            return None
        return {"p50": round(lags[len(lags) // 2] / 1e6, 3), "max": round(lags[-1] / 1e6, 3)}

    def _shutdown(self) -> None:
        if self._initialized:
            _quietly(self._nvml.nvmlShutdown)
            self._initialized = False


def _describe_gpu(lib: Any, index: int, handle: Any) -> str:
    label = f"gpu{index} {lib.nvmlDeviceGetName(handle)}"
    try:
        gpm = bool(lib.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except Exception:
        gpm = False
    return label + (": GPM (SM activity, occupancy)" if gpm else
                    ": no GPM, sm_util is the coarse utilization rate and sm_occupancy is unavailable")


def _quietly(fn, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        pass
