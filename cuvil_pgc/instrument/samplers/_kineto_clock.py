"""Kineto's operator times on the session's clock, measured through marks in the profiler's own stream.

Kineto stamps ops with its approximate clock (the TSC on x86) and converts them to Unix time with
its own (TSC, wall) pairs; regions are stamped with ``perf_counter_ns``. Mapping one onto the
other through the wall clock (Kineto's pairs, then the session's (monotonic, wall) pair) is off by
whatever the wall clock did in between (a step, an NTP slew) plus both pairings' error: a few µs
on a quiet machine, more on a loaded one. A region a few µs long then loses its ops to its parent
or to none (a CI run read an op inside a 5 µs region as outside every region).

So the sampler stamps marks into the profiler itself: a RecordFunction range entered between two
``perf_counter_ns`` reads, :data:`MARKS` times right after the profiler starts and again right
before it stops. A mark's Kineto start lies inside its bracket, so each mark bounds the offset
between the clocks; the bounds of one end's marks are intersected (the narrowest bracket decides
where they disagree). Ops map by the offset interpolated between the two ends, which also takes
out a rate difference between the clocks over the recording. Measured here (torch 2.13 CPU) a
bracket is 0.3-1 µs. Without marks (a torch without ``_RecordFunctionFast``, or marks lost), ops
map through the wall clock as before and the sampler's status says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

MARK_PREFIX = "cuvil_pgc::clock_mark#"
MARKS = 8


def stamp_marks(phase: str) -> list[tuple[str, int, int]]:
    """Enter :data:`MARKS` profiler ranges, each between two monotonic reads; returns
    ``(name, before_ns, after_ns)`` per mark, or [] where this torch cannot record one. Never
    raises: ``stop`` calls it before it stops the profiler, and ops are placed without marks."""
    marks = []
    now = time.perf_counter_ns
    try:
        from torch._C._profiler import _RecordFunctionFast

        for i in range(MARKS):
            name = f"{MARK_PREFIX}{phase}{i}"
            mark = _RecordFunctionFast(name)
            before = now()
            mark.__enter__()
            after = now()
            mark.__exit__(None, None, None)
            marks.append((name, before, after))
    except Exception:
        return []
    return marks


@dataclass(frozen=True)
class Anchor:
    """At Kineto time ``kineto_ns`` (Unix ns), monotonic = Kineto - ``offset_ns``, within ± ``error_ns``."""

    kineto_ns: int
    offset_ns: int
    error_ns: int


def anchor(marks: list[tuple[str, int, int]], recorded: dict[str, int]) -> Anchor | None:
    """The offset one end's marks pin down (None when none of them was recorded)."""
    found = [(recorded[name], before, after) for name, before, after in marks if name in recorded]
    if not found:
        return None
    lo = max(k - after for k, _, after in found)      # offset = k - m with m in [before, after]
    hi = min(k - before for k, before, _ in found)
    if lo > hi:     # the marks disagree (the clocks moved between them): trust the narrowest bracket
        k, before, after = min(found, key=lambda m: m[2] - m[1])
        lo, hi = k - after, k - before
    kineto = sorted(k for k, _, _ in found)[len(found) // 2]
    return Anchor(kineto_ns=kineto, offset_ns=(lo + hi) // 2, error_ns=(hi - lo + 1) // 2)


@dataclass(frozen=True)
class OpClock:
    """Kineto Unix nanoseconds → trace microseconds."""

    start_mono_ns: int
    start_unix_ns: int
    anchors: tuple[Anchor, ...] = ()

    @classmethod
    def measured(cls, clock: Any, start_marks: list, stop_marks: list, recorded: dict[str, int]) -> OpClock:
        """The clock the marks give (``clock``: the session's SessionClock)."""
        ends = (anchor(start_marks, recorded), anchor(stop_marks, recorded))
        return cls(clock.start_mono_ns, clock.start_unix_ns, tuple(a for a in ends if a is not None))

    def to_us(self, unix_ns: np.ndarray) -> np.ndarray:
        """Trace µs of Kineto start/end times (int64 Unix ns: float64 cannot hold them to the ns)."""
        unix_ns = np.asarray(unix_ns, dtype=np.int64)
        if not self.anchors:
            return (unix_ns - self.start_unix_ns) / 1000.0
        first = self.anchors[0]
        rel = (unix_ns - first.kineto_ns).astype(np.float64)
        if len(self.anchors) == 1 or self.anchors[-1].kineto_ns == first.kineto_ns:
            offset = np.zeros_like(rel)
        else:   # offsets relative to the first anchor, interpolated; held constant beyond the ends
            last = self.anchors[-1]
            offset = np.interp(rel, [0.0, float(last.kineto_ns - first.kineto_ns)],
                               [0.0, float(last.offset_ns - first.offset_ns)])
        mono_rel = float(first.kineto_ns - first.offset_ns - self.start_mono_ns)
        return (rel - offset + mono_rel) / 1000.0

    def status(self) -> dict[str, Any]:
        """What the sampler's status reports about the alignment."""
        if not self.anchors:
            return {"aligned_by": "wall clock", "note": "no clock marks recorded; ops are placed through "
                    "the wall clock and may sit a few µs off their regions"}
        out: dict[str, Any] = {"aligned_by": "clock marks",
                               "error_us": round(max(a.error_ns for a in self.anchors) / 1000.0, 3)}
        if len(self.anchors) == 2:
            out["drift_us"] = round((self.anchors[1].offset_ns - self.anchors[0].offset_ns) / 1000.0, 3)
        out["wall_offset_us"] = round((self.anchors[0].offset_ns - (self.start_unix_ns - self.start_mono_ns)) / 1000.0, 3)
        return out
