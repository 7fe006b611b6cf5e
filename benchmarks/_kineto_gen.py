"""Large Kineto (torch.profiler) traces for the load and analyze benchmarks.

``kineto_trace(min_events)`` profiles a small MLP with the real torch.profiler
(``record_shapes=True``, ``record_function`` annotations per step and per block), looping until
the exported Chrome trace holds at least ``min_events`` events, and caches the file under
``/tmp/cuvil_bench``. ``replicated_trace(src, times)`` writes a larger trace by repeating the
events of ``src`` with shifted timestamps (for scaling runs without hours of profiling).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec

CACHE_DIR = Path(os.environ.get("CUVIL_BENCH_CACHE", "/tmp/cuvil_bench"))
_EVENTS_PER_STEP_GUESS = 72      # refined after a probe run; only decides how long to profile


def kineto_trace(min_events: int = 300_000, *, cache_dir: Path = CACHE_DIR) -> Path:
    """Path of a cached torch.profiler Chrome trace with at least ``min_events`` events."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = cache_dir / f"kineto_cpu_{min_events}.json"
    if path.exists() and path.stat().st_size > 0:
        return path
    steps = max(1, min_events // _EVENTS_PER_STEP_GUESS)
    while True:
        tmp = path.with_suffix(".tmp.json")
        _profile(steps, tmp)
        n = count_events(tmp)
        if n >= min_events:
            os.replace(tmp, path)
            return path
        steps = int(steps * min_events / max(n, 1) * 1.05) + 1


class _EventsOnly(msgspec.Struct):
    traceEvents: list[msgspec.Raw]  # noqa: N815 - the JSON key


def count_events(path: Path) -> int:
    """Events in a Chrome trace (decoded as raw slices: cheap in time and memory)."""
    with open(path, "rb") as f:
        return len(msgspec.json.decode(f.read(), type=_EventsOnly).traceEvents)


def _profile(steps: int, out: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    blocks = torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.LayerNorm(64)) for _ in range(3))
    head = torch.nn.Linear(64, 10)
    x = torch.randn(16, 64)
    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(steps):
            with record_function("step"):
                h = x
                for i, block in enumerate(blocks):
                    with record_function(f"block{i}"):
                        h = block(h) + h
                with record_function("head"):
                    head(h).softmax(-1)
    prof.export_chrome_trace(str(out))


def replicated_trace(src: Path, times: int, *, cache_dir: Path = CACHE_DIR) -> Path:
    """A trace holding ``times`` copies of ``src``'s events, each copy shifted past the previous."""
    out = cache_dir / f"{src.stem}_x{times}.json"
    if out.exists() and out.stat().st_size > 0:
        return out
    with open(src, "rb") as f:
        doc = json.load(f)
    events = doc.pop("traceEvents")
    timed = [e for e in events if isinstance(e.get("ts"), (int, float))]
    lo = min(e["ts"] for e in timed)
    hi = max(e["ts"] + e.get("dur", 0) for e in timed)
    span = hi - lo + 1.0
    tmp = out.with_suffix(".tmp")
    with open(tmp, "w") as f:
        head = json.dumps(doc)[:-1]
        f.write(head + (", " if doc else "") + '"traceEvents": [\n')
        first = True
        for k in range(times):
            shift = k * span
            for e in events:
                if k and e.get("ph") == "M":
                    continue
                e2 = dict(e)
                if "ts" in e2 and isinstance(e2["ts"], (int, float)):
                    e2["ts"] = round(e2["ts"] + shift, 3)
                f.write(("" if first else ",\n") + json.dumps(e2))
                first = False
        f.write("\n]}\n")
    os.replace(tmp, out)
    return out
