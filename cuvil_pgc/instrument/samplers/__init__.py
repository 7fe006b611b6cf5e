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


# The default list: (config) -> samplers. Sampler issues append their factories here.
_FACTORIES = [_ops, _cpu]
