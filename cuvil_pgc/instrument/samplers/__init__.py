"""Samplers that run beside the user's code during a session (see base.Sampler).

``build_samplers(config)`` is the editable default list: which sampler runs for which options.
Each sampler module imports its heavy dependency (torch, cupti, pynvml) only when started.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cuvil_pgc.instrument.samplers.base import Sampler, SamplerContext

if TYPE_CHECKING:
    from cuvil_pgc.instrument.config import SessionConfig

__all__ = ["Sampler", "SamplerContext", "build_samplers"]


def build_samplers(config: SessionConfig) -> list[Sampler]:
    """The samplers a session with this configuration runs, in start order."""
    samplers: list[Sampler] = []
    for factory in _FACTORIES:
        samplers.extend(factory(config))
    return samplers


def _ops(config: SessionConfig) -> list[Sampler]:
    if not config.ops:
        return []
    from cuvil_pgc.instrument.samplers.torch_ops import TorchOpSampler

    return [TorchOpSampler()]


def _cpu(config: SessionConfig) -> list[Sampler]:
    """CPU utilization whenever sampling is on (GPU machines too); the CPU stand-in for SM utilization."""
    if config.sample_hz <= 0:
        return []
    from cuvil_pgc.instrument.samplers.cpu import CpuUtilSampler

    return [CpuUtilSampler(config.sample_hz)]


def _gpu(config: SessionConfig) -> list[Sampler]:
    """CUPTI kernels and NVML counters: never with gpu="off", with "auto" only where CUDA is present."""
    if config.gpu == "off":
        return []
    from cuvil_pgc.instrument.samplers import cupti_kernels, nvml

    if config.gpu == "auto" and not nvml.cuda_present():
        return []
    return [cupti_kernels.CuptiKernelSampler(), nvml.NvmlSampler(config.sample_hz)]


def _compile(config: SessionConfig) -> list[Sampler]:
    """torch.compile phases, graph breaks, recompiles and cache hits; imports no torch until it compiles."""
    if not config.compile:
        return []
    from cuvil_pgc.instrument.samplers.compile import CompileSampler

    return [CompileSampler()]


# The default list: (config) -> samplers. Sampler issues append their factories here.
# _gpu starts first: torch.profiler (the op sampler) claims CUPTI on a CUDA build as soon as it starts,
# and CUPTI 13.4 takes one subscriber only; Kineto then records CPU ops without CUPTI.
_FACTORIES = [_gpu, _ops, _cpu, _compile]
