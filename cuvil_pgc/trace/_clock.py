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
  nanosecond (below 2**43 µs, 102 days from the file's zero, where the spacing is at most 1/1024 µs;
  this holds for every file carrying ``baseTimeNanoseconds``).
- Kineto µs with fractions beyond that (torch 2.1-2.3 counted from the Unix epoch, 1.7e15 µs, where a
  float64 holds a quarter of a microsecond): :func:`needs_exact` says so, and the reader re-reads
  the ``ts`` text exactly as whole ns (``_decode.exact_ns_times``), making it a Unix-ns file.
- Anything else: the values as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from cuvil_pgc.trace.columns import float_column
from cuvil_pgc.trace.schema import MAX_TIME_US

#: µs above which a float64 ``ts`` is off by more than 1e-6 µs (2**33 µs, 2.4 hours)
REBASE_FLOOR_US = float(2**33)
#: µs from which a float64 ``ts`` no longer holds the ns (spacing 1/512 µs and more)
EXACT_FLOOR_US = float(2**43)


@dataclass(frozen=True)
class FileClock:
    """The conversion of one file's ``ts`` values to µs on its own zero."""

    origin_ns: int | None = None     # the file counted in Unix ns: the ns of its ts = 0
    shift_us: int = 0                # Kineto µs rebased: the file's ts = shift_us is 0 here

    def us(self, values: Sequence[int | float]) -> np.ndarray:
        """``values`` (``ts`` as the file wrote them) in µs on this clock."""
        if self.origin_ns is not None:
            return (np.array([int(v) for v in values], dtype=np.int64) - self.origin_ns) / 1000.0
        ts = float_column(values)
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


def needs_exact(ts: np.ndarray, ns_floor: float) -> bool:
    """Whether µs ``ts`` (below ``ns_floor``) carry fractions a float64 cannot hold to the ns."""
    if not len(ts) or not np.isfinite(ts).all():
        return False
    high = float(ts.max())
    return EXACT_FLOOR_US <= high and float(ts.min()) <= ns_floor and bool((ts != np.floor(ts)).any())
