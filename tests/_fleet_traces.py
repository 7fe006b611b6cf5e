"""Small trace files of several runs, ranks and days, in our format, for the fleet tests.

``write_trace(path, rank=..., steps=..., slow=..., start_unix_ns=...)`` writes a finished
``.trace.json``: per step a ``request`` region with ``decode`` (and, on rank ``slow``, a longer
``decode/attention``) regions, a few ``aten::`` operators attributed to them, a compile phase and
a utilization counter, with seeded durations so every file differs.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

DAY_NS = 86_400 * 10**9
START_NS = 1_796_000_000 * 10**9


def write_trace(path: Path, *, rank: int = 0, world_size: int = 1, steps: int = 20, slow: int | None = None,
                start_unix_ns: int = START_NS, seed: int = 0, scale: float = 1.0) -> Path:
    rng = random.Random(seed * 1000 + rank)
    pid, tid = 1000 + rank, 1
    events = [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": "MainThread"}}]
    ts, rid = 10.0, 0
    for step in range(steps):
        rid += 1
        root = rid
        decode = rng.uniform(80, 120) * scale * (1.6 if rank == slow else 1.0)
        total = decode + rng.uniform(20, 40) * scale
        events.append({"ph": "X", "cat": "region", "name": "request", "pid": pid, "tid": tid, "ts": ts, "dur": total,
                       "args": {"path": "request", "id": root, "parent": None, "step": step}})
        rid += 1
        events.append({"ph": "X", "cat": "region", "name": "decode", "pid": pid, "tid": tid, "ts": ts + 5,
                       "dur": decode, "args": {"path": "request/decode", "id": rid, "parent": root}})
        for k, op in enumerate(("aten::linear", "aten::relu", "aten::linear")):
            events.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": pid, "tid": tid,
                           "ts": ts + 6 + k * decode / 4, "dur": decode / 5,
                           "args": {"region": "request/decode", "flops": 2_000_000 if op == "aten::linear" else None,
                                    "bytes": 400_000, "shapes": [[8, 64], [64, 64]]}})
        events.append({"ph": "C", "name": "cpu_util", "pid": pid, "tid": 0, "ts": ts, "args": {"value": 50 + step % 7}})
        ts += total + rng.uniform(5, 15)
    events.append({"ph": "X", "cat": "compile", "name": "dynamo", "pid": pid, "tid": tid, "ts": 1.0, "dur": 5.0,
                   "args": {"compile_id": "0/0", "phase": "dynamo", "cache": "miss", "reason": "first call"}})
    meta = {"schema_version": 1, "host": f"host{rank // 2}", "pid": pid, "rank": rank, "world_size": world_size,
            "python": "3.11", "torch": None, "devices": [], "start_unix_ns": start_unix_ns, "command": ["test"],
            "dropped": {}, "samplers": {}}
    path.write_text(json.dumps({"traceEvents": events, "cuvil": meta}))
    return path


def write_run(directory: Path, run: str = "job", ranks: int = 2, *, slow: int | None = None, day: int = 0,
              steps: int = 20, scale: float = 1.0, seed: int = 0) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    return [write_trace(directory / f"{run}.rank{r}.trace.json", rank=r, world_size=ranks, steps=steps, slow=slow,
                        start_unix_ns=START_NS + day * DAY_NS + r * 1000, seed=seed + day, scale=scale)
            for r in range(ranks)]
