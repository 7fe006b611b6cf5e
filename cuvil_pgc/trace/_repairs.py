"""Two defects of real Kineto traces that the reader repairs, counting what it changed.

- **Unstamped activities**: Kineto wrote GPU activities it had no timestamps for at ``ts: 0,
  dur: 0`` (pytorch/kineto#109, over a thousand kernels in a ResNet-50 trace). Read as they are,
  they put work at the Unix epoch beside a trace at 1.6e15 µs: its span, idle time and the time
  outside regions became 1.6e9 s. :func:`drop_unstamped` leaves out the ``ts: 0, dur: 0`` events
  of a trace whose every other event is more than :data:`ABSOLUTE_CLOCK_US` later (a trace that
  counts from 0 keeps its first event).
- **Overrunning stream events**: work on one GPU stream runs in order, yet traces hold kernels and
  copies whose end runs seconds past later events on their stream (seven such events made 62% of
  the GPU time of a 55,423-kernel trace in AMD-AGI/Hyperloom#1116). :func:`clip_overruns` cuts an
  event that holds two later events of its stream (``(pid, tid)``) whole and runs more than
  :data:`OVERRUN_MIN_US` past the next one's start at that start. Overlapping the next one is left
  alone: with programmatic dependent launch the next kernel starts before the previous one ends,
  and only waits for it; so is holding later work for less than a second: a CUDA graph's parallel
  branches may be reported on the stream it was launched on (a graph-captured all-reduce beside
  the compute it overlaps).

Both are said in the source's warnings with their counts (:func:`~._build.skipped_notes`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil_pgc.trace.schema import Kind

#: a trace whose earliest stamped event is past this many µs counts on an absolute clock (Unix
#: time, or time since boot after 1000 s), so ``ts: 0`` there is no time at all
ABSOLUTE_CLOCK_US = 1e9
#: how far past the next event's start (µs) an event holding later work must run to be cut
OVERRUN_MIN_US = 1e6
#: the key of ``Events.skipped`` counting the events :func:`drop_unstamped` left out (not a phase)
UNSTAMPED = "X at ts 0"
#: the kinds of row that run in order on a GPU stream
STREAM_KINDS = np.array([Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET], dtype=np.uint8)


def drop_unstamped(evs: Any) -> None:
    """Leave ``ts: 0, dur: 0`` events out of ``evs.xs`` where every other one is stamped after
    :data:`ABSOLUTE_CLOCK_US`, counting them in ``evs.skipped[UNSTAMPED]``."""
    xs = evs.xs
    zero = [e for e in xs if e.ts == 0 and not e.dur]
    if not zero or len(zero) == len(xs):
        return
    stamped = [e.ts for e in xs if not (e.ts == 0 and not e.dur)]
    if not all(type(t) in (int, float) for t in stamped) or min(stamped) <= ABSOLUTE_CLOCK_US:
        return
    evs.xs = [e for e in xs if not (e.ts == 0 and not e.dur)]
    evs.skipped[UNSTAMPED] = evs.skipped.get(UNSTAMPED, 0) + len(zero)
    evs.left_out.update(map(id, zero))


def clip_overruns(cols: dict[str, np.ndarray]) -> tuple[int, float]:
    """Cut each stream event of ``cols`` (µs ``ts``/``dur``) that holds two later events of its
    ``(pid, tid)`` whole (they start and end before it ends) and runs more than
    :data:`OVERRUN_MIN_US` past the next one's start at that start; returns (how many, the largest
    overrun past that start, µs)."""
    rows = np.flatnonzero(np.isin(cols["kind"], STREAM_KINDS))
    if len(rows) < 3:
        return 0, 0.0
    order = rows[np.lexsort((cols["ts"][rows], cols["tid"][rows], cols["pid"][rows]))]
    pid, tid, ts = cols["pid"][order], cols["tid"][order], cols["ts"][order]
    end = ts + cols["dur"][order]
    new_stream = np.r_[True, (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1])]
    stream = np.cumsum(new_stream) - 1
    # the earliest end among the later events of each one's stream: a minimum accumulated from the
    # back, on end ranks lifted by stream so that a later stream's ends never win
    rank = np.unique(end, return_inverse=True)[1].astype(np.int64)
    lifted = rank + stream * (len(rank) + 1)
    later_min = np.empty_like(lifted)
    later_min[:-1] = np.minimum.accumulate(lifted[::-1])[::-1][1:]
    later_min[-1] = np.iinfo(np.int64).max
    holding = np.flatnonzero(later_min < lifted)              # holds one later event whole: rare
    holding = holding[holding + 1 < len(ts)]
    holding = holding[end[holding] - ts[holding + 1] > OVERRUN_MIN_US]
    hit = [i for i in holding if _holds_two(i, ts, end, stream)]
    if not hit:
        return 0, 0.0
    at = np.array(hit)
    overrun = float((end[at] - ts[at + 1]).max())
    cols["dur"][order[at]] = ts[at + 1] - ts[at]
    return len(at), overrun


def _holds_two(i: int, ts: np.ndarray, end: np.ndarray, stream: np.ndarray) -> bool:
    """Whether event ``i`` (of events sorted by stream, then start) holds two later events of its
    stream whole; scans forward until it finds them or the stream moves past its end."""
    found, j = 0, i + 1
    while j < len(ts) and stream[j] == stream[i] and ts[j] < end[i]:
        if end[j] < end[i]:
            found += 1
            if found == 2:
                return True
        j += 1
    return False


def overrun_note(count: int, overrun_us: float) -> str:
    """The warning for :func:`clip_overruns`' repairs."""
    return (f"{count:,} GPU events hold two later events of their stream whole (running up to "
            f"{overrun_us / 1e3:,.1f} ms past the next one's start), which work run in order on a stream cannot: "
            "a tracer's timestamp defect; their durations were cut at the next event's start")
