"""A model's trace as ``cuvil-pgc profile`` records it: every submodule a region, CPU only.

The recorded times are replaced by counted ones (:func:`counted_times`): what a test reads from
the trace (which region is hot, what share of the model it takes) is then the same on any machine
under any load, as the tests' rules ask; the structure (regions, operators, their nesting and
order, shapes) is the one the profiler recorded."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from cuvil_pgc import instrument_module, profile

OP_US = 10.0        # every operator without operators inside it takes this long
GAP_US = 1.0        # and this much passes between two events on a thread


def record_trace(model: torch.nn.Module, inputs: tuple[Any, ...], path: str | Path, calls: int = 1) -> str:
    """Profile ``calls`` calls of ``model`` on ``inputs`` into ``path``, with counted times; the
    path, as a string."""
    handle = instrument_module(model)
    try:
        with profile(str(path), ops=True, gpu="off", sample_hz=0), torch.no_grad():
            for _ in range(calls):
                model(*inputs)
    finally:
        handle.remove()
    counted_times(Path(path))
    return str(path)


def counted_times(path: Path) -> None:
    """Rewrite the complete events of a CPU trace on a clock that counts: an event without events
    inside it lasts ``OP_US``, one with events inside lasts as long as they do with ``GAP_US``
    before, between and after them. Nesting is read from the recorded times, per thread."""
    doc = json.loads(path.read_text())
    threads: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for event in doc["traceEvents"]:
        if event.get("ph") == "X":
            threads.setdefault((event.get("pid"), event.get("tid")), []).append(event)
    for events in threads.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        top: list[dict[str, Any]] = []
        inside: dict[int, list[dict[str, Any]]] = {}
        open_: list[dict[str, Any]] = []
        for event in events:
            while open_ and event["ts"] >= open_[-1]["ts"] + open_[-1]["dur"]:
                open_.pop()
            (inside.setdefault(id(open_[-1]), []) if open_ else top).append(event)
            open_.append(event)
        clock = GAP_US
        for event in top:
            clock = _lay(event, clock, inside) + GAP_US
    path.write_text(json.dumps(doc))


def _lay(event: dict[str, Any], start: float, inside: dict[int, list[dict[str, Any]]]) -> float:
    """Place ``event`` and what it holds from ``start``; where it ends."""
    children = inside.get(id(event), [])
    clock = start + GAP_US if children else start + OP_US
    for child in children:
        clock = _lay(child, clock, inside) + GAP_US
    event["ts"], event["dur"] = start, clock - start
    return clock
