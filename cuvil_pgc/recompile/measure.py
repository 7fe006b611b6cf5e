"""Timing shared by the search and ``cuvil-pgc compare``: interleaved runs, medians, bootstrap CIs.

Contract: :func:`time_interleaved` warms every callable up, then runs rounds in which each callable
takes one sample (a sample is the mean of ``inner`` back-to-back calls), in an order that changes
every round (AB, BA, …), so slow drifts of a shared, noisy machine hit every contender alike. The
orders are a Williams design (:func:`balanced_orders`): over its rows every contender runs right
after every other equally often. A contender's time depends on its predecessor (the caches it
leaves cold, the threads it leaves spinning); a plain rotation keeps one fixed predecessor for each
contender, which measured the same ONNX Runtime session 14% slower when it always followed
OpenVINO than when it followed a torch contender. Before each timed sample, the contender runs
untimed for :data:`SETTLE_S` (:func:`_settle`): the thread pools of the contender before it spin
on after its run (OpenMP's, OpenVINO's), on the cores this one needs, and no deployment has
another runtime's threads spinning beside its model. A GRU tagger at 2 threads on 2 cores, four
contenders in one process, four passes (ms): ONNX Runtime 0.43-3.71 unsettled, 0.28-0.34
settled (0.27 in a process of its own), OpenVINO 0.70-0.78 / 0.42-0.43 (0.44), AOTInductor
0.59-0.66 / 0.36-0.41 (0.39), eager 1.71-1.83 / 1.45-1.53 (1.54). Sleeping instead made it worse
(eager 10 ms): idle cores wake slowly. When
CUDA is initialized in the process, every sample is bracketed by ``torch.cuda.synchronize``.
Statistics are medians; :func:`ratio_ci` bootstraps the ratio of two medians. Nothing here
asserts on times: callers compare contenders measured in the same run.
"""

from __future__ import annotations

import functools
import math
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cuvil_pgc.recompile._stderr import exception_line

#: a sample should last at least this long so the timer's resolution does not matter, and not much
#: longer: on a shared machine a short sample is less likely to contain a preemption
MIN_SAMPLE_S = 0.0005
#: seconds a contender runs untimed before each of its samples, so the threads its predecessor left
#: spinning settle (see the module's docstring); its own call's cost when that is longer
SETTLE_S = 0.003
DEFAULT_ROUNDS = 25
DEFAULT_BOOTSTRAP = 2000


@dataclass
class Samples:
    """Per-call times of one contender in seconds, one entry per round."""

    name: str
    seconds: list[float] = field(default_factory=list)
    #: the median of each worker process the samples were pooled from (:mod:`.process_race`);
    #: empty for a race in one process
    processes: list[float] = field(default_factory=list)

    @property
    def median_s(self) -> float:
        return median(self.seconds)

    @property
    def median_ms(self) -> float:
        return self.median_s * 1e3

    def ci95_s(self, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
        return bootstrap_ci(self.seconds, median, n_boot=n_boot, seed=seed)


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def bootstrap_ci(values: Sequence[float], stat: Callable[[Sequence[float]], float], *,
                 n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap confidence interval of ``stat(values)``."""
    rng = random.Random(seed)
    n = len(values)
    stats = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(n_boot))
    return _percentiles(stats, level)


def ratio_ci(a: Sequence[float], b: Sequence[float], *, n_boot: int = DEFAULT_BOOTSTRAP, seed: int = 0,
             level: float = 0.95) -> tuple[float, float]:
    """Bootstrap CI of median(a) / median(b), resampling rounds jointly (they were interleaved)."""
    rng = random.Random(seed)
    n = min(len(a), len(b))
    ratios = []
    for _ in range(n_boot):
        idx = [rng.randrange(n) for _ in range(n)]
        ratios.append(median([a[i] for i in idx]) / median([b[i] for i in idx]))
    ratios.sort()
    return _percentiles(ratios, level)


def _percentiles(ordered: list[float], level: float) -> tuple[float, float]:
    lo = ordered[int((1 - level) / 2 * (len(ordered) - 1))]
    hi = ordered[int((1 + level) / 2 * (len(ordered) - 1))]
    return lo, hi


def verdict(speedup_ci: tuple[float, float]) -> str:
    """B relative to A given the CI of A/B: ``faster`` if the CI is above 1, ``slower`` below, else ``same``."""
    lo, hi = speedup_ci
    if lo > 1.0:
        return "faster"
    if hi < 1.0:
        return "slower"
    return "same"


def calibrate_inner(fn: Callable[[], Any], min_sample_s: float = MIN_SAMPLE_S, cap: int = 10_000) -> int:
    """Calls per sample so that one sample lasts at least ``min_sample_s``."""
    start = time.perf_counter()
    fn()
    once = max(time.perf_counter() - start, 1e-7)
    return max(1, min(cap, math.ceil(min_sample_s / once)))


def time_interleaved(fns: Mapping[str, Callable[[], Any]], *, rounds: int = DEFAULT_ROUNDS, warmup: int = 5,
                     inner: int | None = None, sync: Callable[[], None] | None = None,
                     settle_s: float = SETTLE_S) -> dict[str, Samples]:
    """Time each zero-argument callable in interleaved rounds (balanced orders); returns per-call
    samples. Each sample follows ``settle_s`` of untimed calls of its contender (none where one
    contender runs alone: it is its own predecessor)."""
    names = list(fns)
    if len(names) < 2:
        settle_s = 0.0
    sync = sync or _cuda_sync()
    current = names[0] if names else ""
    try:
        for current in names:
            for _ in range(warmup):
                fns[current]()
        counts = {}
        for current in names:
            counts[current] = inner or calibrate_inner(fns[current])
        if inner is None:   # one common count keeps every contender's sample equally long-lived
            counts = dict.fromkeys(names, max(1, min(counts.values())))
        out = {name: Samples(name) for name in names}
        orders = balanced_orders(len(names))
        for r in range(rounds):
            for i in orders[r % len(orders)]:
                current = names[i]
                _settle(fns[current], settle_s, sync)
                out[current].seconds.append(_one_sample(fns[current], counts[current], sync))
    except Exception as exc:
        exc.cuvil_contender = current     # which one raised, for time_surviving
        raise
    return out


def time_surviving(fns: Mapping[str, Callable[[], Any]], *, keep: tuple[str, ...] = ("eager",),
                   timer: Callable[..., dict[str, Samples]] | None = None,
                   **options: Any) -> tuple[dict[str, Samples], dict[str, str]]:
    """``timer`` (:func:`time_interleaved`), leaving out a contender that raises (a program that
    passed its check call and fails at a later one) and timing the others again; returns the
    samples and, by contender, why each left out failed. One in ``keep`` that raises (eager: the
    model's own error) is raised."""
    from cuvil_pgc.recompile.dispatch_state import kept

    fns, failed = dict(fns), {}
    while len(fns) > 0:
        try:
            with kept("a timed contender"):
                return (timer or time_interleaved)(fns, **options), failed
        except Exception as exc:
            name = getattr(exc, "cuvil_contender", None)
            if name in keep or name not in fns:
                raise
            failed[name] = exception_line(exc)
            del fns[name]
    return {}, failed


def _settle(fn: Callable[[], Any], seconds: float, sync: Callable[[], None] | None) -> None:
    """Call ``fn`` untimed until ``seconds`` have passed (at least once where ``seconds`` > 0),
    each call synchronized where the work is asynchronous (GPU): unsynchronized, a 3 ms loop of
    kernel launches would queue far more than 3 ms of work for the sample to wait out."""
    if seconds <= 0:
        return
    end = time.perf_counter() + seconds
    while True:
        fn()
        if sync:
            sync()
        if time.perf_counter() >= end:
            return


def whole_cycles(rounds: int, n: int) -> int:
    """At least ``rounds`` rounds, in whole cycles of :func:`balanced_orders` for ``n`` contenders
    (so every contender follows every other equally often)."""
    cycle = len(balanced_orders(n))
    return -(-rounds // cycle) * cycle


def balanced_orders(n: int) -> list[list[int]]:
    """A Williams design for ``n`` contenders: rows that are orders of ``range(n)`` in which each
    contender runs first equally often and right after every other contender equally often (once
    over ``n`` rows for even ``n``; over ``2n`` rows, the mirrored rows added, for odd ``n``)."""
    if n <= 1:
        return [list(range(n))]
    first, low, high = [0], 1, n - 1       # 0, 1, n-1, 2, n-2, ...
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    rows = [[(x + r) % n for x in first] for r in range(n)]
    return rows if n % 2 == 0 else rows + [row[::-1] for row in rows]


def _cuda_sync() -> Callable[[], None] | None:
    """torch.cuda.synchronize when CUDA is in use in this process (GPU work is asynchronous)."""
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        return torch.cuda.synchronize
    return None


def _one_sample(fn: Callable[[], Any], n: int, sync: Callable[[], None] | None) -> float:
    if sync:
        sync()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    if sync:
        sync()
    return (time.perf_counter() - start) / n


def prepacked_gemm_overhead_us(rounds: int = 15) -> float | None:
    """µs a prepacked oneDNN linear call costs over a plain BLAS ``addmm`` on this CPU (>= 0).

    Inductor freezing hands GEMMs with constant weights to such kernels; their per-call cost is a
    property of the machine (tens of µs on some CPUs, a few on others), measured here on a small
    batch-1 GEMM, interleaved. None where oneDNN linear is unavailable.
    """
    import torch

    linear = getattr(torch.ops.mkldnn, "_linear_pointwise", None)
    if linear is None or not torch.backends.mkldnn.is_available():
        return None
    x, w, b = torch.randn(1, 128), torch.randn(128, 128), torch.randn(128)
    try:
        with torch.no_grad():
            samples = time_interleaved({"blas": lambda: torch.addmm(b, x, w.t()),
                                        "prepacked": lambda: linear(x, w, b, "none", [], "")}, rounds=rounds)
    except RuntimeError:
        return None
    return max(0.0, (samples["prepacked"].median_s - samples["blas"].median_s) * 1e6)


#: batch-1 convolutions the layout/prepacking probe times, (in, out, size, stride), 3x3: an RGB stem
#: and the mid-network shapes of a small image CNN
PROBE_CONVS = ((3, 16, 32, 1), (16, 32, 32, 2), (32, 32, 16, 1), (32, 64, 16, 2))


def conv_kernel_ratios(rounds: int = 15) -> dict[str, float] | None:
    """How this CPU's convolution kernels compare, geometric means over :data:`PROBE_CONVS`:

    - ``channels_last``: an NHWC aten convolution's time over the NCHW one's;
    - ``prepacked``: the prepacked oneDNN convolution Inductor freezing calls (weight reordered
      once) over the plain aten convolution, NCHW;
    - ``prepacked_channels_last``: the same, both NHWC.

    None where oneDNN's prepacked convolution is unavailable. On the 2-core AMD EPYC at one thread,
    three runs: 0.76-0.79, 1.19-1.30 and 1.25-1.32 (freezing's convolutions are slower there; the
    zoo CNN's AOTInductor package with freezing measured 4-19 % slower than without).
    """
    import torch

    mkldnn = torch.ops.mkldnn
    if not torch.backends.mkldnn.is_available() or not hasattr(mkldnn, "_reorder_convolution_weight"):
        return None
    logs: dict[str, list[float]] = {"channels_last": [], "prepacked": [], "prepacked_channels_last": []}
    try:
        with torch.no_grad():
            for cin, cout, size, stride in PROBE_CONVS:
                t = _probe_conv(torch, mkldnn, cin, cout, size, stride, rounds)
                logs["channels_last"].append(math.log(t["nhwc"] / t["nchw"]))
                logs["prepacked"].append(math.log(t["packed_nchw"] / t["nchw"]))
                logs["prepacked_channels_last"].append(math.log(t["packed_nhwc"] / t["nhwc"]))
    except RuntimeError:
        return None
    return {k: math.exp(sum(v) / len(v)) for k, v in logs.items()}


def _probe_conv(torch: Any, mkldnn: Any, cin: int, cout: int, size: int, stride: int, rounds: int) -> dict[str, float]:
    """Median seconds of one 3x3 convolution: plain NCHW and NHWC, prepacked NCHW and NHWC."""
    cl = torch.channels_last
    x, w, b = torch.randn(1, cin, size, size), torch.randn(cout, cin, 3, 3), torch.randn(cout)
    x_cl, w_cl = x.contiguous(memory_format=cl), w.contiguous(memory_format=cl)
    conv = torch.nn.functional.conv2d
    packed = {name: mkldnn._reorder_convolution_weight(weight, [1, 1], [stride, stride], [1, 1], 1, list(x.shape))
              for name, weight in (("nchw", w), ("nhwc", w_cl))}

    def prepacked(inp: Any, weight: Any) -> Any:
        return mkldnn._convolution_pointwise(inp, weight, b, [1, 1], [stride, stride], [1, 1], 1, "none", [], "")

    samples = time_interleaved({"nchw": lambda: conv(x, w, b, stride, 1), "nhwc": lambda: conv(x_cl, w_cl, b, stride, 1),
                                "packed_nchw": lambda: prepacked(x, packed["nchw"]),
                                "packed_nhwc": lambda: prepacked(x_cl, packed["nhwc"])}, rounds=rounds)
    return {k: s.median_s for k, s in samples.items()}


@functools.lru_cache(maxsize=256)
def gemm_us(m: int, k: int, n: int, device: str = "cpu", rounds: int = 10) -> float:
    """Median µs of one fp32 ``addmm`` (m x k by k x n) on ``device``, called from Python: what each
    GEMM of an unrolled recurrence costs (a batch-1 cell step is a matrix-vector product bound by
    reading its weight; on the 2-core AMD EPYC 1x128 by 128x512 takes 8.5 µs, 1x256 by 256x1024 30)."""
    import torch

    a, w, b = (torch.randn(*shape, device=device) for shape in ((m, k), (k, n), (n,)))
    with torch.no_grad():
        samples = time_interleaved({"gemm": lambda: torch.addmm(b, a, w)}, rounds=rounds)
    return samples["gemm"].median_s * 1e6
