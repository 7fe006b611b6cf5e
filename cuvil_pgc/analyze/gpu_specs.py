"""Known GPUs: published peak figures, and the machine model of the GPU a trace was recorded on.

Kineto traces carry ``deviceProperties`` (name, SM count, memory, compute capability, ...) for
each GPU. :func:`gpu_from_properties` maps them to an entry of :data:`GPUS` and returns a
:class:`~cuvil_pgc.analyze.machine.MachineModel` with ``source="datasheet"`` whose name says which
entry was used, so a trace recorded on a V100 is analysed with a V100's roofs on a machine that has
no GPU at all (instead of "unknown GPU" fallback figures and advice to calibrate a GPU).

Figures are NVIDIA's published peaks per GPU, dense (no structured sparsity): FLOP/s per precision
(``fp32`` on CUDA cores; ``tf32`` / ``fp16`` / ``bf16`` / ``fp8`` on tensor cores) and memory
bandwidth in bytes/s. The kernel-launch cost is not a datasheet figure: the fallback's 5 µs.
Where a product has board variants (SXM vs PCIe, memory size), ``numSms`` and ``totalGlobalMem``
from the trace pick the variant.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from cuvil_pgc.analyze.machine import FALLBACK_CUDA, MachineModel, fingerprint_of

T = 1e12


@dataclass(frozen=True)
class GpuSpec:
    key: str                          # table entry, e.g. "A100-SXM4-80GB"
    pattern: str                      # regex on the device name (case-insensitive)
    peak_flops: dict[str, float]
    mem_bw: float                     # bytes/s
    sms: int | None = None            # SM count of this variant (picks among variants)
    min_mem_gb: float = 0.0           # at least this much memory (picks among variants)
    source: str = ""                  # the datasheet the figures come from
    extra: dict[str, Any] = field(default_factory=dict)


def _p(fp32: float, tf32: float | None, fp16: float, bf16: float | None = None, fp8: float | None = None,
       fp64: float | None = None) -> dict[str, float]:
    out = {"fp32": fp32 * T, "fp16": fp16 * T}
    for k, v in (("tf32", tf32), ("bf16", bf16), ("fp8", fp8), ("fp64", fp64)):
        if v is not None:
            out[k] = v * T
    return out


# Order matters: the first entry whose pattern matches and whose variant conditions hold is used.
GPUS: tuple[GpuSpec, ...] = (
    # NVIDIA Tesla V100 datasheet (2018): SXM2 15.7 TFLOPS FP32, 125 TFLOPS tensor (FP16), 7.8 FP64,
    # 900 GB/s HBM2; PCIe 14 / 112 / 7, 900 GB/s. V100S PCIe: 16.4 / 130 / 8.2, 1134 GB/s.
    # DGX Station / DGX-1 boards (``V100-DGXS``, ``V100-SXM2``) are the SXM2 part.
    GpuSpec("V100S-PCIe", r"V100S", _p(16.4, None, 130, fp64=8.2), 1134e9, source="NVIDIA V100S datasheet"),
    GpuSpec("V100-PCIe", r"V100.*PCIE", _p(14.0, None, 112, fp64=7.0), 900e9, source="NVIDIA V100 datasheet"),
    GpuSpec("V100-SXM2", r"V100", _p(15.7, None, 125, fp64=7.8), 900e9, source="NVIDIA V100 datasheet"),
    # NVIDIA T4 datasheet: 8.1 TFLOPS FP32, 65 TFLOPS FP16 (mixed) tensor, 320 GB/s GDDR6.
    GpuSpec("T4", r"\bT4\b", _p(8.1, None, 65), 320e9, source="NVIDIA T4 datasheet"),
    # NVIDIA A10 datasheet: 31.2 TFLOPS FP32, 62.5 TF32, 125 BF16/FP16 tensor (dense), 600 GB/s.
    GpuSpec("A10", r"\bA10\b(?!0)", _p(31.2, 62.5, 125, 125), 600e9, source="NVIDIA A10 datasheet"),
    # NVIDIA A100 datasheet: 19.5 TFLOPS FP32, 156 TF32, 312 BF16/FP16 tensor (dense), 9.7 FP64;
    # 40GB 1,555 GB/s; 80GB PCIe 1,935 GB/s; 80GB SXM 2,039 GB/s.
    GpuSpec("A100-SXM4-80GB", r"A100.*SXM", _p(19.5, 156, 312, 312, fp64=9.7), 2039e9, min_mem_gb=60,
            source="NVIDIA A100 datasheet"),
    GpuSpec("A100-PCIe-80GB", r"A100", _p(19.5, 156, 312, 312, fp64=9.7), 1935e9, min_mem_gb=60,
            source="NVIDIA A100 datasheet"),
    GpuSpec("A100-40GB", r"A100", _p(19.5, 156, 312, 312, fp64=9.7), 1555e9, source="NVIDIA A100 datasheet"),
    # NVIDIA L4 datasheet: 30.3 TFLOPS FP32, 60 TF32, 121 BF16/FP16, 242.5 FP8 (dense = half the
    # sparsity figures 120 / 242 / 485), 300 GB/s.
    GpuSpec("L4", r"\bL4\b", _p(30.3, 60, 121, 121, 242.5), 300e9, source="NVIDIA L4 datasheet"),
    # NVIDIA L40S datasheet: 91.6 TFLOPS FP32, 183 TF32, 362 BF16/FP16, 733 FP8 (dense), 864 GB/s.
    GpuSpec("L40S", r"L40S", _p(91.6, 183, 362, 362, 733), 864e9, source="NVIDIA L40S datasheet"),
    # NVIDIA H100 datasheet (dense = half the sparsity figures): SXM5 (132 SMs) 67 TFLOPS FP32,
    # 494.5 TF32, 989.5 BF16/FP16, 1,979 FP8, 34 FP64, 3.35 TB/s; PCIe (114 SMs) 51 / 378 / 756 /
    # 1,513 / 26, 2.0 TB/s; NVL 60 / 417.5 / 835 / 1,670 / 30, 3.9 TB/s.
    GpuSpec("H100-NVL", r"H100.*NVL", _p(60, 417.5, 835, 835, 1670, 30), 3.9e12, source="NVIDIA H100 datasheet"),
    GpuSpec("H100-PCIe", r"H100.*PCIE", _p(51, 378, 756, 756, 1513, 26), 2.0e12, source="NVIDIA H100 datasheet"),
    GpuSpec("H100-PCIe", r"H100", _p(51, 378, 756, 756, 1513, 26), 2.0e12, sms=114, source="NVIDIA H100 datasheet"),
    GpuSpec("H100-SXM5", r"H100", _p(67, 494.5, 989.5, 989.5, 1979, 34), 3.35e12, source="NVIDIA H100 datasheet"),
    # NVIDIA H200 datasheet: SXM 67 TFLOPS FP32, 494.5 TF32, 989.5 BF16/FP16, 1,979 FP8 (dense),
    # 34 FP64, 4.8 TB/s HBM3e (NVL: 60 / 417.5 / 835 / 1,670, 4.8 TB/s).
    GpuSpec("H200-NVL", r"H200.*NVL", _p(60, 417.5, 835, 835, 1670, 30), 4.8e12, source="NVIDIA H200 datasheet"),
    GpuSpec("H200-SXM", r"H200", _p(67, 494.5, 989.5, 989.5, 1979, 34), 4.8e12, source="NVIDIA H200 datasheet"),
    # NVIDIA HGX B200 specifications, per GPU (dense = half the sparsity figures): 75 TFLOPS FP32,
    # 1,100 TF32, 2,250 BF16/FP16, 4,500 FP8, 37 FP64, 8 TB/s HBM3e.
    GpuSpec("B200", r"B200", _p(75, 1100, 2250, 2250, 4500, 37), 8.0e12, source="NVIDIA HGX B200 specifications"),
)


def find_spec(props: dict[str, Any]) -> GpuSpec | None:
    """The table entry for one ``deviceProperties`` record, None for a GPU not in the table."""
    name = str(props.get("name") or "")
    mem_gb = float(props.get("totalGlobalMem") or 0) / 1e9
    sms = props.get("numSms")
    for spec in GPUS:
        if not re.search(spec.pattern, name, re.I):
            continue
        if spec.sms is not None and sms != spec.sms:
            continue
        if spec.min_mem_gb and mem_gb < spec.min_mem_gb:
            continue
        return spec
    return None


def trace_gpu(devices: list[Any]) -> dict[str, Any] | None:
    """The ``deviceProperties`` record of the trace's GPU: the first with a name."""
    for d in devices or []:
        if isinstance(d, dict) and isinstance(d.get("name"), str) and d["name"]:
            return d
    return None


def gpu_from_properties(props: dict[str, Any]) -> MachineModel | None:
    """A datasheet machine model for the GPU described by ``props``; None when it is not in GPUS."""
    spec = find_spec(props)
    if spec is None:
        return None
    described = {k: props[k] for k in ("name", "numSms", "totalGlobalMem", "computeMajor", "computeMinor",
                                       "clockRate", "memoryClockRate", "memoryBusWidth") if k in props}
    mem = f", {props['totalGlobalMem'] / 2**30:.0f} GiB" if isinstance(props.get("totalGlobalMem"), int | float) else ""
    sms = f", {props['numSms']} SMs" if props.get("numSms") else ""
    identity = {"device": "cuda:0", "gpu": props.get("name"), "table_entry": spec.key, "source": "datasheet"}
    return MachineModel(
        device="cuda:0", name=f"{props.get('name')}{sms}{mem} — table entry {spec.key} ({spec.source})",
        fingerprint=fingerprint_of(identity), peak_flops=dict(spec.peak_flops), mem_bw=spec.mem_bw,
        dispatch_overhead_s=FALLBACK_CUDA["dispatch_overhead_s"], launch_latency_s=FALLBACK_CUDA["launch_latency_s"],
        source="datasheet",
        notes={"source": f"peak figures of {spec.source} for {spec.key} (dense, no sparsity), picked from the "
                         "trace's deviceProperties; the launch latency is the documented fallback"},
        details={"table_entry": spec.key, "device_properties": described})
