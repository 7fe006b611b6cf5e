"""A fake ``pynvml`` module: GPUs described by ``FakeGpu``, answered through the real structures.

Constants, ``NVMLError`` and the ctypes structures (``c_nvmlGpmMetricsGet_t``, utilization and
memory structs, GPM sample pointers) are pynvml's own, so the sampler's request building and result
reading run exactly as against the real library.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass, field

import pynvml as real

_GPM_VALUES = {
    real.NVML_GPM_METRIC_SM_UTIL: "sm_util",
    real.NVML_GPM_METRIC_SM_OCCUPANCY: "sm_occupancy",
    real.NVML_GPM_METRIC_DRAM_BW_UTIL: "dram_bw_util",
}


@dataclass
class FakeGpu:
    name: str = "NVIDIA H200"
    uuid: str = "GPU-00000000-1111-2222-3333-444444444444"
    compute_capability: tuple[int, int] = (9, 0)
    gpm: bool = True
    mig: bool = False
    sm_util: float = 62.5           # GPM SM activity, %
    sm_occupancy: float = 31.25     # GPM SM occupancy, %
    dram_bw_util: float = 12.0      # GPM DRAM bandwidth utilization, %
    util_gpu: int = 97              # nvmlDeviceGetUtilizationRates().gpu
    util_memory: int = 40           # nvmlDeviceGetUtilizationRates().memory
    sm_clock_mhz: int = 1980
    power_mw: int = 312_000
    memory_total: int = 141 << 30
    memory_used: int = 3 << 30
    refuse: dict[str, int] = field(default_factory=dict)       # function name -> NVML error code
    gpm_refuse: dict[int, int] = field(default_factory=dict)   # GPM metric id -> NVML error code


class FakeHandle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakeNvml:
    """Stands in for ``pynvml``; public ``nvml*`` functions mirror the real ones."""

    def __init__(self, gpus: list[FakeGpu] | None = None, *, init_error: int | None = None) -> None:
        for name in dir(real):
            if name.startswith("NVML_"):
                setattr(self, name, getattr(real, name))
        self.NVMLError = real.NVMLError
        self.c_nvmlGpmMetricsGet_t = real.c_nvmlGpmMetricsGet_t
        self.gpus = [FakeGpu()] if gpus is None else gpus
        self.init_error = init_error
        self.inits = 0
        self.shutdowns = 0
        self.samples: dict[int, tuple[int, float]] = {}     # sample address -> (device index, time)
        self.freed = 0
        self._allocated: list[object] = []

    # -- the real API (names and signatures of pynvml) ------------------------------------------
    def nvmlInit(self):
        if self.init_error is not None:
            raise real.NVMLError(self.init_error)
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        return FakeHandle(index)

    def nvmlDeviceGetName(self, handle):
        return self._gpu(handle, "nvmlDeviceGetName").name

    def nvmlDeviceGetUUID(self, handle):
        return self._gpu(handle, "nvmlDeviceGetUUID").uuid

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self._gpu(handle, "nvmlDeviceGetMemoryInfo")
        return real.c_nvmlMemory_t(total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used,
                                   used=gpu.memory_used)

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return self._gpu(handle, "nvmlDeviceGetCudaComputeCapability").compute_capability

    def nvmlSystemGetDriverVersion(self):
        return "580.95.05"

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu = self._gpu(handle, "nvmlDeviceGetUtilizationRates")
        return real.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_memory)

    def nvmlDeviceGetClockInfo(self, handle, type):  # noqa: A002 - the real parameter name
        assert type == real.NVML_CLOCK_SM
        return self._gpu(handle, "nvmlDeviceGetClockInfo").sm_clock_mhz

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._gpu(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetMigMode(self, device):
        gpu = self._gpu(device, "nvmlDeviceGetMigMode")
        mode = real.NVML_DEVICE_MIG_ENABLE if gpu.mig else real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlGpmQueryDeviceSupport(self, device):
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(self._gpu(device, "nvmlGpmQueryDeviceSupport").gpm)
        return support

    def nvmlGpmSampleAlloc(self):
        sample = ctypes.pointer(real.struct_c_nvmlGpmSample_t())
        self._allocated.append(sample)
        return sample

    def nvmlGpmSampleGet(self, device, gpmSample):  # noqa: N803 - the real parameter name
        gpu = self._gpu(device, "nvmlGpmSampleGet")
        if not gpu.gpm:
            raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
        self.samples[ctypes.addressof(gpmSample.contents)] = (device.index, time.perf_counter())
        return gpmSample

    def nvmlGpmMetricsGet(self, metricsGet):  # noqa: N803 - the real parameter name
        assert metricsGet.version == real.NVML_GPM_METRICS_GET_VERSION
        first = self.samples.get(ctypes.addressof(metricsGet.sample1.contents))
        second = self.samples.get(ctypes.addressof(metricsGet.sample2.contents))
        if first is None or second is None or first[0] != second[0] or second[1] < first[1]:
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[first[0]]
        for i in range(metricsGet.numMetrics):
            slot = metricsGet.metrics[i]
            code = gpu.gpm_refuse.get(slot.metricId, real.NVML_SUCCESS)
            slot.nvmlReturn = code
            slot.value = getattr(gpu, _GPM_VALUES[slot.metricId]) if code == real.NVML_SUCCESS else 0.0
        return metricsGet

    def nvmlGpmSampleFree(self, gpmSample):  # noqa: N803 - the real parameter name
        self.freed += 1

    # -- helpers ---------------------------------------------------------------------------------
    def _gpu(self, handle: FakeHandle, function: str) -> FakeGpu:
        gpu = self.gpus[handle.index]
        if function in gpu.refuse:
            raise real.NVMLError(gpu.refuse[function])
        return gpu
