"""Session configuration: one typed dataclass, with its environment variables as constants."""

from __future__ import annotations

import os
from dataclasses import dataclass

from cuvil_pgc.errors import ConfigError

ENV_FLUSH_INTERVAL = "CUVIL_FLUSH_INTERVAL_S"   # seconds between writes to the partial file
ENV_BUFFER_EVENTS = "CUVIL_BUFFER_EVENTS"       # per-thread region buffer capacity
ENV_OTEL = "CUVIL_OTEL"                         # "1": export regions as OpenTelemetry spans
ENV_ON_DEMAND = "CUVIL_PGC_ON_DEMAND"           # "1": on-demand mode from import (instrument.on_demand)

GPU_MODES = ("auto", "on", "off")


def on_demand_requested() -> bool:
    """Whether the environment asks for on-demand mode (``CUVIL_PGC_ON_DEMAND`` set and not 0)."""
    return os.environ.get(ENV_ON_DEMAND, "") not in ("", "0")


@dataclass
class SessionConfig:
    """What a profiling session records and how.

    Attributes:
        path: output trace (``.trace.json`` or ``.trace.json.gz``).
        ops: capture aten operators with torch.profiler (every machine).
        gpu: ``auto`` uses CUPTI/NVML when a CUDA device is there; ``on`` requires them (recorded
            as unavailable with the reason if they cannot run); ``off`` never touches them.
        sample_hz: utilization sampling rate (NVML, CPU); 0 disables utilization sampling.
        compile: record torch.compile phases, cache hits and graph breaks.
        record_shapes: record operator input shapes (needed for FLOP and byte estimates).
        with_stack: also record the Python functions torch.profiler sees (``python_function``
            events, category ``python_function``), as torch.profiler's ``with_stack``.
        profile_memory: record allocations (torch.profiler's ``profile_memory``) as the
            ``memory_allocated`` counter (bytes the process holds, by allocation events).
        flush_interval_s: how often buffered events reach the partial file (crash safety bound).
        buffer_events: per-thread region buffer capacity; beyond it events are dropped and counted.
        otel: also export completed regions as OpenTelemetry spans.
        sample_every: record one root-region call in N per region name (its subtree follows).
        sample_rate: record each root-region call with probability p (its subtree follows).
        filter: a regular expression; only regions whose path matches, and ops / kernels whose
            name or region path matches, are written (``re.search``).
    """

    path: str = "cuvil.trace.json"
    ops: bool = True
    gpu: str = "auto"
    sample_hz: float = 20.0
    compile: bool = True
    record_shapes: bool = True
    with_stack: bool = False
    profile_memory: bool = False
    flush_interval_s: float = 0.25
    buffer_events: int = 1 << 18
    otel: bool = False
    sample_every: int | None = None
    sample_rate: float | None = None
    filter: str | None = None

    def __post_init__(self) -> None:
        self.path = os.fspath(self.path)
        if self.gpu not in GPU_MODES:
            raise ConfigError(f"gpu={self.gpu!r} is not one of {', '.join(GPU_MODES)}")
        if not 0 < self.flush_interval_s <= 1.0:
            raise ConfigError(f"flush_interval_s={self.flush_interval_s} must be in (0, 1] seconds",
                              fix="the crash-safety bound is one second")
        if self.buffer_events < 1:
            raise ConfigError(f"buffer_events={self.buffer_events} must be positive")
        if self.sample_hz < 0 or self.sample_hz > 10_000:
            raise ConfigError(f"sample_hz={self.sample_hz} must be between 0 and 10000")
        if self.sample_every is not None and self.sample_rate is not None:
            raise ConfigError("give sample_every or sample_rate, not both")
        if self.sample_every is not None and (not isinstance(self.sample_every, int) or self.sample_every < 1):
            raise ConfigError(f"sample_every={self.sample_every!r} must be an int >= 1")
        if self.sample_rate is not None and not 0 < self.sample_rate <= 1:
            raise ConfigError(f"sample_rate={self.sample_rate!r} must be in (0, 1]")
        if self.filter is not None:
            import re

            try:
                re.compile(self.filter)
            except re.error as exc:
                raise ConfigError(f"filter {self.filter!r} is not a valid regular expression ({exc})") from None

    @property
    def sampling_scale(self) -> float:
        """What one recorded root-region call stands for (1.0 without sampling)."""
        if self.sample_every:
            return float(self.sample_every)
        if self.sample_rate:
            return 1.0 / self.sample_rate
        return 1.0

    def sampling_policy(self):
        """The root-region sampling function for region.set_sampling, or None."""
        if self.sample_every and self.sample_every > 1:
            every, counts = self.sample_every, {}

            def keep_every(region) -> bool:
                seen = counts.get(region.name, 0)
                counts[region.name] = seen + 1
                return seen % every == 0
            return keep_every
        if self.sample_rate is not None and self.sample_rate < 1:
            import random

            rate, draw = self.sample_rate, random.random
            return lambda region: draw() < rate
        return None

    @classmethod
    def from_env(cls, **overrides: object) -> SessionConfig:
        """Defaults, then environment variables, then explicit keyword overrides."""
        values: dict[str, object] = {}
        env = os.environ
        if ENV_FLUSH_INTERVAL in env:
            values["flush_interval_s"] = _parse(ENV_FLUSH_INTERVAL, env[ENV_FLUSH_INTERVAL], float)
        if ENV_BUFFER_EVENTS in env:
            values["buffer_events"] = _parse(ENV_BUFFER_EVENTS, env[ENV_BUFFER_EVENTS], int)
        if env.get(ENV_OTEL, "") not in ("", "0"):
            values["otel"] = True
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]


def _parse(name: str, text: str, kind: type) -> object:
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"environment variable {name}={text!r} is not a valid {kind.__name__}") from None
