"""One clock per session: monotonic nanoseconds for regions, anchored to wall time.

Regions are stamped with ``time.perf_counter_ns()`` (equal to ``time.monotonic_ns()`` on Linux).
Kineto (``_KinetoEvent.start_ns()``) and CUPTI report other clocks; the session records one
(monotonic, wall) pair at start so every source converts to the trace clock: microseconds since
the session started.
"""

from __future__ import annotations

import time
from dataclasses import dataclass


@dataclass(frozen=True)
class SessionClock:
    start_mono_ns: int
    start_unix_ns: int

    @classmethod
    def now(cls) -> SessionClock:
        """Pair the monotonic and wall clocks, bracketing the wall read to halve the error."""
        before = time.perf_counter_ns()
        wall = time.time_ns()
        after = time.perf_counter_ns()
        return cls(start_mono_ns=(before + after) // 2, start_unix_ns=wall)

    def mono_to_us(self, ns: int | float) -> float:
        """A perf_counter_ns / monotonic_ns reading as trace microseconds."""
        return (ns - self.start_mono_ns) / 1000.0

    def unix_to_us(self, ns: int | float) -> float:
        """A Unix-epoch nanosecond reading (Kineto, CUPTI after offset) as trace microseconds."""
        return (ns - self.start_unix_ns) / 1000.0
