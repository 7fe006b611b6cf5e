"""The few machine figures the analyzer's rules need, read from a MachineModel.

``Roofs`` holds peak FLOP/s, sustained memory bandwidth (bytes/s) and the fixed cost of one op
(CPU dispatch) or one kernel launch (GPU), in the units the passes use. ``roofs_of(machine)``
reads them from the calibrated (or fallback) :class:`cuvil_pgc.analyze.machine.MachineModel`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Roofs:
    peak_flops: float          # FLOP/s of the device the ops/kernels ran on (fp32)
    mem_bw: float              # bytes/s, sustained
    dispatch_us: float         # per CPU op: framework dispatch overhead, µs
    launch_us: float           # per GPU kernel: launch latency, µs (0 on CPU-only models)
    gpu_peak_flops: float = 0.0
    gpu_mem_bw: float = 0.0

    @property
    def ridge(self) -> float:
        """Arithmetic intensity (FLOP/byte) where the CPU roofline turns from memory to compute."""
        return self.peak_flops / self.mem_bw if self.mem_bw > 0 else float("inf")

    @property
    def gpu_ridge(self) -> float:
        return self.gpu_peak_flops / self.gpu_mem_bw if self.gpu_mem_bw > 0 else float("inf")


def roofs_of(machine: Any, gpu: Any = None) -> Roofs:
    """Roofs from a CPU MachineModel and, for traces with kernels, a CUDA one."""
    cpu = Roofs(peak_flops=float(machine.peak_flops["fp32"]), mem_bw=float(machine.mem_bw),
                dispatch_us=float(machine.dispatch_us), launch_us=0.0)
    if gpu is None:
        return cpu
    return Roofs(peak_flops=cpu.peak_flops, mem_bw=cpu.mem_bw, dispatch_us=cpu.dispatch_us,
                 launch_us=float(gpu.launch_us), gpu_peak_flops=float(gpu.peak_flops["fp32"]),
                 gpu_mem_bw=float(gpu.mem_bw))
