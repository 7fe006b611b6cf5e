"""The machine models an analysis measures a trace against: those of the machine that recorded it.

A device's model is, in order: the one the caller gives (``--machine``); for the GPU, the one the
trace names (``deviceProperties``, or our ``devices``: a cached calibration of that GPU, else its
datasheet entry); else this machine's (its cached calibration or the documented fallback), but
only when this machine recorded the trace. A trace recorded elsewhere gets the documented fallback
named as the recording machine's, with a warning saying how to bring that machine's calibration:
this machine's figures, measured or not, say nothing about another machine's CPU.

"Recorded here", per file: ours record the CPU (``cuvil.cpu``: model, ISA, cores, architecture),
which must be this one; files without it (older ones of ours, torch.profiler's) must name this
host (``host``, torch.profiler's ``host_name``: a trace without one, as torch 1.x wrote, may come
from anywhere). Host names repeat across machines (every VM here is ``vm``), so a file that also
names GPUs this machine does not have was recorded elsewhere. A trace built in memory has no
files and counts as this machine's. Never imports torch.
"""

from __future__ import annotations

import socket
from typing import Any

import numpy as np

from cuvil_pgc._cpu_identity import cpu_identity
from cuvil_pgc.trace.columns import Trace
from cuvil_pgc.trace.schema import Kind


def trace_machines(trace: Trace, machine: Any) -> tuple[tuple[Any, Any], list[str]]:
    """(cpu model, gpu model or None) and warnings about fallbacks (see the module docstring)."""
    from cuvil_pgc.analyze.machine import default_machine, elsewhere_machine, uncalibrated_warning

    has_gpu = bool(np.isin(trace.events["kind"], (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET)).any())
    elsewhere = recorded_elsewhere(trace)
    warnings: list[str] = []
    models = []
    for device in ("cpu", "cuda") if has_gpu else ("cpu",):
        if machine is not None and _device_of(machine) == device:
            models.append(machine)
            continue
        model = _trace_gpu_model(trace, warnings) if device == "cuda" else None
        if model is None and elsewhere is not None:
            model = elsewhere_machine(device, elsewhere)
            warnings.append(f"the trace was recorded on {elsewhere} and does not describe its "
                            f"{'CPU' if device == 'cpu' else 'GPU'}: bottleneck figures use documented fallback "
                            "peaks, not this machine's; for measured ones run `cuvil-pgc calibrate -o machine.json"
                            f"{'' if device == 'cpu' else ' --device cuda'}` on that machine and pass "
                            "`--machine machine.json`")
        elif model is None:
            model = default_machine(device)
            if _is_fallback(model):
                warnings.append(uncalibrated_warning(device))
        models.append(model)
    return (models[0], models[1] if has_gpu else None), warnings


def recorded_elsewhere(trace: Trace) -> str | None:
    """The machine(s) that recorded the trace, named for a message, when any is not this one; None
    when this machine recorded every file."""
    here = socket.gethostname()
    others = [where for s in trace.sources
              if (where := _recorded_on(s.metadata if isinstance(s.metadata, dict) else {}, here))]
    unique = list(dict.fromkeys(others))
    return None if not unique else ", ".join(unique[:3]) + (" and others" if len(unique) > 3 else "")


def _recorded_on(meta: dict[str, Any], here: str) -> str | None:
    """The machine that recorded one file, named, or None when it is this one."""
    host, cpu = meta.get("host"), meta.get("cpu")
    named = f"host {host!r}" if isinstance(host, str) and host else "an unnamed machine (no host name in the trace)"
    if isinstance(cpu, dict):
        if cpu != cpu_identity():
            return f"{named} ({cpu.get('cpu', 'an unknown CPU')}, {cpu.get('cores', '?')} cores)"
    elif host != here:
        return named
    gpus = {d["name"] for d in meta.get("devices") or []
            if isinstance(d, dict) and d.get("kind", "cuda") == "cuda" and isinstance(d.get("name"), str)}
    if gpus and not gpus <= set(_local_gpu_names()):
        return f"{named} (with {', '.join(sorted(gpus))})"
    return None


def _local_gpu_names() -> list[str]:
    from cuvil_pgc.analyze.machine import local_gpu_names

    return local_gpu_names()


def _trace_gpu_model(trace: Trace, warnings: list[str]) -> Any:
    """The GPU the trace names in ``deviceProperties``: a calibration of that GPU in the cache (one
    ``cuvil-pgc calibrate --device cuda`` on a machine with it), else the datasheet figures of its
    entry in ``gpu_specs.GPUS``; None when the trace names no GPU (with a warning when it names
    one the table does not know)."""
    from cuvil_pgc.analyze import gpu_specs
    from cuvil_pgc.analyze.machine import cached_gpu_model

    props = gpu_specs.trace_gpu([d for s in trace.sources if isinstance(s.metadata, dict)
                                 for d in (s.metadata.get("devices") or [])])
    if props is None:
        return None
    sms = props.get("numSms")
    cached = cached_gpu_model(props["name"], sms if isinstance(sms, int) else None)
    if cached is not None:
        return cached
    model = gpu_specs.gpu_from_properties(props)
    if model is None:
        warnings.append(f"the trace's GPU {props['name']!r} is not in the table of known GPUs "
                        "(cuvil_pgc.analyze.gpu_specs): using the documented fallback figures")
    return model


def _device_of(machine: Any) -> str:
    return "cuda" if str(getattr(machine, "device", "cpu")).startswith("cuda") else "cpu"


def _is_fallback(model: Any) -> bool:
    return getattr(model, "source", "measured") == "fallback"
