"""Which CPU this is, read once without torch: the model, the ISA features that decide matmul speed,
core count and architecture. Our traces record it (``cuvil.cpu``) so that an analysis knows whether
this machine's calibration describes the CPU that recorded them (:mod:`cuvil_pgc.analyze.machine`
fingerprints calibrations with it)."""

from __future__ import annotations

import functools
import os
import platform
from typing import Any

# ISA features that decide matmul speed per dtype; the identity keeps only these.
ISA_FLAGS = frozenset({
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16",
    "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_fp16", "amx_int8",
    "asimd", "asimdhp", "sve", "sve2", "bf16", "i8mm",          # aarch64 "Features"
})


def cpuinfo() -> dict[str, str]:
    """First value of each field of /proc/cpuinfo's first processor ({} where there is none, e.g.
    macOS). Reading stops at the first blank line: the file repeats itself for every core."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.partition(":")
                if sep:
                    fields.setdefault(key.strip(), value.strip())
                elif not line.strip() and ("flags" in fields or "Features" in fields):
                    break
    except OSError:
        pass
    return fields


@functools.cache
def cpu_identity() -> dict[str, Any]:
    """{"cpu": model name, "isa": sorted matmul-relevant flags, "cores": os.cpu_count(), "arch"}."""
    info = cpuinfo()
    flags = set((info.get("flags") or info.get("Features") or "").split())
    return {"cpu": info.get("model name") or platform.processor() or platform.machine(),
            "isa": sorted(flags & ISA_FLAGS), "cores": os.cpu_count(), "arch": platform.machine()}
