"""Roofline data of an Analysis: the machine's roofs and where regions and ops sit under them.

``roofline_data(analysis) -> dict`` derives, from an :class:`Analysis` alone (no trace), what a
roofline chart plots::

    {"roofs":   [{"device", "dtype", "peak_flops", "mem_bw", "ridge", "source"}],
     "regions": [{"path", "device", "intensity", "flops_s", "total_us", "bottleneck", "confidence"}],
     "ops":     [{"name", "region", "device", "intensity", "flops_s", "total_us", "calls"}]}

Intensity is FLOP/byte, ``flops_s`` the achieved FLOP/s. A region is a point when its evidence
has both an arithmetic intensity and an achieved FLOP/s (FLOPs and bytes known for some of its
ops or kernels). An op point comes from a region's ``top_ops`` entry whose FLOPs and bytes are
both known: intensity ``flops / bytes`` and achieved ``flops / total time`` over all its calls,
so the per-op dispatch cost is part of the time, as it is at run time. Ops are taken from the
hottest ``MAX_OP_REGIONS`` regions, which keeps the chart readable on big models.
"""

from __future__ import annotations

import math
from typing import Any

MAX_OP_REGIONS = 40


def roofline_data(analysis: Any) -> dict[str, Any]:
    """Roofs per device and dtype, region points and op points (see the module docstring)."""
    return {"roofs": machine_roofs(analysis.machine), "regions": _region_points(analysis),
            "ops": _op_points(analysis)}


def machine_roofs(machine: dict[str, Any]) -> list[dict[str, Any]]:
    """One roof per device and dtype with a known peak, from ``analysis.machine``."""
    roofs = []
    for key, m in (machine or {}).items():
        if not isinstance(m, dict):
            continue
        bw = _positive(m.get("mem_bw"))
        for dtype, peak in sorted((m.get("peak_flops") or {}).items()):
            peak = _positive(peak)
            if peak is None or bw is None:
                continue
            roofs.append({"device": "cuda" if str(key).startswith("cuda") else "cpu", "dtype": str(dtype),
                          "peak_flops": peak, "mem_bw": bw, "ridge": peak / bw,
                          "source": m.get("source"), "name": m.get("name")})
    return roofs


def _region_points(analysis: Any) -> list[dict[str, Any]]:
    points = []
    for r in analysis.regions:
        ev = r.evidence or {}
        intensity, achieved = _positive(ev.get("intensity")), _positive(ev.get("achieved_flops_s"))
        if intensity is None or achieved is None:
            continue
        points.append({"path": r.path, "device": ev.get("device", "cpu"), "intensity": intensity,
                       "flops_s": achieved, "total_us": float(r.total_us), "bottleneck": r.bottleneck,
                       "confidence": float(r.confidence)})
    return points


def _op_points(analysis: Any) -> list[dict[str, Any]]:
    points = []
    for r in analysis.regions[:MAX_OP_REGIONS]:
        for op in r.top_ops or []:
            flops, nbytes = _positive(op.get("flops")), _positive(op.get("bytes"))
            total_us = _positive(op.get("total_us"))
            if flops is None or nbytes is None or total_us is None:
                continue
            points.append({"name": str(op.get("name", "")), "region": r.path,
                           "device": "cuda" if op.get("kind") == "kernel" else "cpu",
                           "intensity": flops / nbytes, "flops_s": flops / (total_us * 1e-6),
                           "total_us": total_us, "calls": float(op.get("calls") or 0.0)})
    return points


def _positive(x: Any) -> float | None:
    """``x`` as a positive finite float, else None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) and x > 0 else None
