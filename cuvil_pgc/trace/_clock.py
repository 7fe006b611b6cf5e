"""How one file's ``ts`` values become the µs of its rows, flows and counters (one rule for all three).

Contract: :func:`file_clock` looks at a file's row (and counter) timestamps and returns a
:class:`FileClock`; ``clock.us(values)`` converts any of the file's ``ts`` values (rows, flow points,
counters) the same way, so a flow still lands on the row it was written at.

- Unix nanoseconds (earliest ``ts`` above ``ns_floor``): integers, exact, from the earliest one.
- Kineto µs with fractions on a large clock: Kineto writes ``ts`` in µs with the nanoseconds as three
  decimals (``88437691101.749``). Read into a float64, such a value is off by up to half its spacing
  (1.5e-5 µs at 8.8e10 µs), and a 10 ns launch delay came out as 0.009989 µs. Above
  :data:`REBASE_FLOOR_US` the file's times are taken from the whole µs at or below its earliest one
  (``shift_us``) and rounded to the nanosecond: exact while the raw spacing is under half a
  nanosecond (below 2**42 µs, 51 days from the file's zero, which holds for every file carrying
  ``baseTimeNanoseconds``). Files of torch 2.1-2.3 counted from the Unix epoch (1.7e15 µs) keep
  what a float64 held, a quarter of a microsecond.
- Anything else: the values as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cuvil_pgc.trace.schema import MAX_TIME_US

#: µs above which a float64 ``ts`` is off by more than 1e-6 µs (2**33 µs, 2.4 hours)
REBASE_FLOOR_US = float(2**33)


@dataclass(frozen=True)
class FileClock:
    """The conversion of one file's ``ts`` values to µs on its own zero."""

    origin_ns: int | None = None     # the file counted in Unix ns: the ns of its ts = 0
    shift_us: int = 0                # Kineto µs rebased: the file's ts = shift_us is 0 here

    def us(self, values: Sequence[int | float]) -> np.ndarray:
        """``values`` (``ts`` as the file wrote them) in µs on this clock."""
        if self.origin_ns is not None:
            return (np.array([int(v) for v in values], dtype=np.int64) - self.origin_ns) / 1000.0
        ts = np.array(values, dtype=np.float64)
        if self.shift_us:
            return np.round((ts - self.shift_us) * 1000.0) / 1000.0
        return ts

    def us_one(self, value: int | float) -> float:
        """One ``ts`` value in µs on this clock."""
        return float(self.us([value])[0])


def kineto_us_clock(ts: np.ndarray, *more: np.ndarray) -> FileClock:
    """The clock of a Kineto file counted in µs whose rows start at ``ts`` (and counters at ``more``):
    rebased to the nanosecond when its times are large and fractional (module docstring)."""
    columns = [c for c in (ts, *more) if len(c)]
    if not columns or not all(np.isfinite(c).all() for c in columns):
        return FileClock()
    low, high = min(float(c.min()) for c in columns), max(float(c.max()) for c in columns)
    if low < 0 or high < REBASE_FLOOR_US or high > MAX_TIME_US or not any((c != np.floor(c)).any() for c in columns):
        return FileClock()
    return FileClock(shift_us=math.floor(low))
