"""What torch.profiler records beyond operators when asked: Python functions and allocations.

``with_stack=True`` makes Kineto record ``python_function`` events (the Python call tree around
the operators); they are written as X events of category ``python_function``. ``profile_memory``
makes it record ``[memory]`` instant events (bytes allocated, negative for frees); they are
written as the ``memory_allocated`` counter: the running sum of those bytes per device, which is
what the process holds beyond what it held when the session started.
"""

from __future__ import annotations

from typing import Any

from cuvil_pgc.instrument.samplers._kineto_clock import OpClock
from cuvil_pgc.instrument.samplers.base import SamplerContext

CAT_PYTHON = "python_function"
COUNTER_MEMORY = "memory_allocated"


def extra_events(kineto_events: Any, ctx: SamplerContext, clock: OpClock) -> list[dict[str, Any]]:
    """``python_function`` X events and ``memory_allocated`` counter events on the trace clock
    (``clock``: Kineto's times on it)."""
    out: list[dict[str, Any]] = []
    starts: list[int] = []          # Kineto's Unix ns per event, put on the trace clock at once
    held: dict[int, int] = {}
    for ev in kineto_events:
        try:
            kind = ev.activity_type()
        except AttributeError:
            break
        if kind == CAT_PYTHON and ctx.config.with_stack:
            out.append({"ph": "X", "cat": CAT_PYTHON, "name": ev.name(), "pid": ctx.pid,
                        "tid": ev.device_resource_id(), "dur": max(ev.duration_ns(), 0) / 1000.0, "args": {}})
        elif ev.name() == "[memory]" and ctx.config.profile_memory:
            device = ev.device_index()
            held[device] = held.get(device, 0) + ev.nbytes()
            out.append({"ph": "C", "name": COUNTER_MEMORY, "pid": ctx.pid, "tid": 0,
                        "args": {"bytes": held[device], "device": device}})
        else:
            continue
        starts.append(ev.start_ns())
    for event, ts in zip(out, clock.to_us(starts).tolist(), strict=True):
        event["ts"] = ts
    return out
