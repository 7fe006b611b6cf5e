"""How far a region's program for other sizes stays faster than the original module.

The search chose the region's program by timing it at the captured sizes. Far from them the work
is another: a decoding step's program (ONNX Runtime, its cache opened into tensors) ran a 4-layer
Llama's step 2.4x faster than eager at a cache of 32 tokens, 1.3x at 1800, and 0.65x at 7000,
where eager's attention kernel scales better than the exported graph's. The accuracy guard checks
those sizes (:mod:`.other_shapes`); this times them, and a range ends where its program stops
being faster: calls above it run the original module.

Sizes up to :data:`TIMED_FROM` times the captured one keep the search's verdict (fixed costs rule
there, and timing them would only add the noise of a few samples); beyond it the program and the
original are timed, interleaved, at the range's top first (one timing where the program is faster
all the way, the common case), then at doubling sizes up from :data:`TIMED_FROM` times the captured
size, and the crossover is bisected to an eighth of the size. The timing is a seam
(``timed(size) -> (program seconds, original seconds)``): tests give it the times they need.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuvil_pgc.recompile.measure import time_interleaved

#: sizes up to this many times the captured one are not timed
TIMED_FROM = 4
#: interleaved samples of each, per size timed
ROUNDS = 5


def _slower(times: tuple[float, float]) -> bool:
    """Whether the program's median is above the original's. No margin: the original timed here is
    the region's original module, a few percent slower than the model's own forward that a call
    beyond the range runs (a 4-layer Llama's step, opened and rebuilt: 0.1-0.2 ms of 7-10), and a
    margin on top of that kept a range 5-8% slower than eager at its top."""
    return times[0] > times[1]


def faster_up_to(n: int, hi: int, timed: Callable[[int], tuple[float, float]]) -> tuple[int, str | None]:
    """The largest size up to ``hi`` (a range's top, ``n`` its captured size) at which the program
    is not slower than the original (``timed(size)``: the program's and the original's seconds at
    that size), and why the sizes above it are left out (None: none is)."""
    start = TIMED_FROM * n
    if hi < start:
        return hi, None
    times = timed(hi)
    if not _slower(times):
        return hi, None
    ok, slower = start - 1, hi
    size = start
    while size < hi:                      # the first doubling size the program is slower at
        found = timed(size)
        if _slower(found):
            slower, times = size, found
            break
        ok, size = size, 2 * size
    while slower - ok > max(1, ok // 8):
        mid = (ok + slower) // 2
        found = timed(mid)
        if _slower(found):
            slower, times = mid, found
        else:
            ok = mid
    return ok, (f"its program ran slower than the original module above {ok} ({times[0] * 1e3:.3g} ms against "
                f"{times[1] * 1e3:.3g} ms at {slower})")


def timer(program: Callable[[tuple[Any, ...]], Any], original: Callable[[tuple[Any, ...]], Any],
          args_at: Callable[[int], tuple[Any, ...]], rounds: int = ROUNDS) -> Callable[[int], tuple[float, float]]:
    """``timed(size)`` for :func:`faster_up_to`: the medians of ``rounds`` interleaved calls of
    ``program`` and ``original`` at the inputs ``args_at(size)``, each warmed first
    (:func:`~.measure.time_interleaved`, one call per sample)."""
    import torch

    def timed(size: int) -> tuple[float, float]:
        args = args_at(size)
        with torch.no_grad():
            samples = time_interleaved({"program": lambda: program(args), "original": lambda: original(args)},
                                       rounds=rounds, warmup=1, inner=1, settle_s=0.0)
        return samples["program"].median_s, samples["original"].median_s
    return timed
