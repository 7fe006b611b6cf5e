"""One clock per session: monotonic nanoseconds for regions, anchored to wall time.

Regions are stamped with ``time.perf_counter_ns()`` (equal to ``time.monotonic_ns()`` on Linux).
Kineto (``_KinetoEvent.start_ns()``) and CUPTI report other clocks; the session records one
(monotonic, wall) pair at start so every source converts to the trace clock: microseconds since
the session started.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

PAIRING_TRIES = 16          # tries at pairing the clocks; the narrowest bracket wins
GOOD_BRACKET_NS = 2_000     # a bracket this narrow ends the tries (the pair is within 1 µs)


@dataclass(frozen=True)
class SessionClock:
    start_mono_ns: int
    start_unix_ns: int

    @classmethod
    def now(cls) -> SessionClock:
        """Pair the monotonic and wall clocks: the wall read bracketed by two monotonic reads, the
        narrowest bracket of a few tries. One try is off by half its bracket, which a preemption
        between the reads makes milliseconds on a busy machine: every Kineto op would then be that
        far from the regions it ran in, and ops at a region's edge land in its neighbour."""
        best: tuple[int, int, int] | None = None
        for _ in range(PAIRING_TRIES):
            before = time.perf_counter_ns()
            wall = time.time_ns()
            after = time.perf_counter_ns()
            if best is None or after - before < best[0]:
                best = (after - before, (before + after) // 2, wall)
            if best[0] <= GOOD_BRACKET_NS:
                break
        return cls(start_mono_ns=best[1], start_unix_ns=best[2])

    def mono_to_us(self, ns: int | float) -> float:
        """A perf_counter_ns / monotonic_ns reading as trace microseconds."""
        return (ns - self.start_mono_ns) / 1000.0

    def unix_to_us(self, ns: int | float) -> float:
        """A Unix-epoch nanosecond reading (Kineto, CUPTI after offset) as trace microseconds."""
        return (ns - self.start_unix_ns) / 1000.0
