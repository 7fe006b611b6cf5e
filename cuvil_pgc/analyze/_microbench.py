"""Microbenchmarks behind ``calibrate``: matmul rate, streaming bandwidth, per-op fixed cost.

Each benchmark runs within a time budget and takes many short samples. A figure is the median of
the *undisturbed* samples: those during which the process held its threads (process CPU time at
least ``UNDISTURBED`` x threads x wall time). On a quiet machine that is every sample and the
figure is the plain median. On a shared, oversubscribed machine most samples are slowed by
other processes; if fewer than a quarter ran undisturbed, the figure falls back to the fastest
sample and ``estimator`` says so (``measure`` adds a note), because a roof describes what the
hardware can do, not how busy it was. Every figure keeps its evidence (problem size, samples,
median of all samples, fastest sample) so a calibration can be audited.

CPU samples are timed with ``time.perf_counter`` and ``time.process_time``; CUDA samples with
``torch.cuda.Event`` pairs (GPU time), except the per-op costs, which are host wall time.
"""

from __future__ import annotations

import gc
import os
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from typing import Any

UNDISTURBED = 0.8      # CPU time / (threads x wall) at or above which a sample counts as undisturbed


@dataclass
class Measurement:
    """One calibrated figure and what it was computed from."""

    value: float            # the figure: FLOP/s, bytes/s or seconds per op
    time_s: float           # the sample time the figure comes from (see estimator)
    estimator: str          # "median" of undisturbed samples, or "best" sample on a busy machine
    median_s: float         # median of all samples
    best_s: float           # fastest sample
    samples: int
    undisturbed: int        # samples during which the process held its threads
    threads: int            # threads the benchmark ran with
    size: str               # the problem size, e.g. "1024x1024x1024"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Sample:
    wall_s: float
    cpu_s: float | None     # process CPU time; None where not comparable (GPU time)


class Unsupported(Exception):
    """The device cannot run this benchmark at all (e.g. a dtype with no kernel)."""


@contextmanager
def _quiet_gc() -> Iterator[None]:
    """No garbage-collector pauses inside timed loops."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def summarize(samples: list[Sample], threads: int, size: str, work: float = 0.0, per: int = 0
              ) -> Measurement:
    """A Measurement of ``work / time`` (a rate) or, with ``per``, of ``time / per`` (a cost)."""
    walls = [s.wall_s for s in samples]
    calm = [s.wall_s for s in samples if s.cpu_s is None or s.cpu_s >= UNDISTURBED * threads * s.wall_s]
    if len(calm) >= max(3, len(samples) // 4):
        chosen, estimator = statistics.median(calm), "median"
    else:
        chosen, estimator = min(walls), "best"
    value = chosen / per if per else work / chosen
    return Measurement(value=value, time_s=chosen, estimator=estimator, median_s=statistics.median(walls),
                       best_s=min(walls), samples=len(samples), undisturbed=len(calm), threads=threads,
                       size=size)


class Stopwatch:
    """Times one call of a function on a device, synchronised."""

    def __init__(self, device: str) -> None:
        import torch

        self.device = device
        self.cuda = device.startswith("cuda")
        self.threads = 1 if self.cuda else torch.get_num_threads()
        if self.cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)
            self._sync = torch.cuda.synchronize

    def sample(self, fn: Callable[[], object]) -> Sample:
        if not self.cuda:
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            return Sample(time.perf_counter() - wall, time.process_time() - cpu)
        self._sync()
        self._start.record()
        fn()
        self._end.record()
        self._end.synchronize()
        return Sample(self._start.elapsed_time(self._end) / 1e3, None)

    def samples(self, fn: Callable[[], object], count: int, deadline: float) -> list[Sample]:
        """Up to ``count`` samples (at least 3), stopping early once ``deadline`` has passed."""
        taken: list[Sample] = []
        with _quiet_gc():
            while len(taken) < count and (len(taken) < 3 or time.perf_counter() < deadline):
                taken.append(self.sample(fn))
        return taken


def matmul_rate(watch: Stopwatch, dtype: Any, sizes: tuple[int, ...], budget_s: float) -> Measurement:
    """The best FLOP/s of ``torch.mm`` over square sizes, growing while the budget allows.

    Raises:
        Unsupported: the device has no matmul kernel for ``dtype``.
    """
    import torch

    deadline = time.perf_counter() + budget_s
    best: Measurement | None = None
    last: Measurement | None = None
    gen = torch.Generator(device=watch.device).manual_seed(0)
    for i, n in enumerate(sizes):
        if last is not None:     # stop before a size whose samples would not fit the budget
            predicted = last.median_s * (n / sizes[i - 1]) ** 3
            if 3 * predicted > deadline - time.perf_counter():
                break
        a, b = (torch.randn(n, n, device=watch.device, generator=gen).to(dtype) for _ in range(2))
        out = torch.empty(n, n, device=watch.device, dtype=dtype)

        def mm(a: Any = a, b: Any = b, out: Any = out) -> object:
            return torch.mm(a, b, out=out)

        try:
            probe = watch.sample(mm).wall_s     # also the warm-up
        except (RuntimeError, NotImplementedError) as exc:
            raise Unsupported(str(exc).splitlines()[0]) from None
        per_size = (deadline - time.perf_counter()) / (len(sizes) - i)
        taken = watch.samples(mm, count=max(3, min(25, int(per_size / max(probe, 1e-9)))),
                              deadline=time.perf_counter() + per_size)
        last = summarize(taken, watch.threads, f"{n}x{n}x{n}", work=2.0 * n ** 3)
        best = last if best is None or last.value > best.value else best
    assert best is not None
    return best


def stream_buffers(device: str, nbytes: int) -> tuple[Any, Any, Any]:
    """Three float32 buffers of ``nbytes`` each, every page touched (so no page faults are timed)."""
    import torch

    elements = nbytes // 4
    return (torch.ones(elements, device=device), torch.full((elements,), 2.0, device=device),
            torch.zeros(elements, device=device))


def stream_bandwidth(watch: Stopwatch, buffers: tuple[Any, Any, Any], slice_bytes: int, budget_s: float
                     ) -> dict[str, Measurement]:
    """Sustained bandwidth of ``copy`` (2 bytes moved per byte) and ``add`` (3 per byte).

    The buffers (:func:`stream_buffers`) are far larger than the last-level cache; each sample
    moves one slice, walking through the buffers so every slice comes from memory, and all reads
    and writes are counted. Slices stay large (tens of MiB): a multi-threaded kernel of a
    millisecond or less waits for whichever of its threads the scheduler parked, and on a busy
    machine that swamps the figure.
    """
    import torch

    src, other, dst = buffers
    elements, per_slice = src.numel(), max(1, slice_bytes // 4)
    nbytes = elements * 4
    slices = [slice(i, i + per_slice) for i in range(0, elements - per_slice + 1, per_slice)]
    kernels: dict[str, tuple[int, Callable[[slice], object]]] = {
        "copy": (2, lambda s: dst[s].copy_(src[s])),
        "add": (3, lambda s: torch.add(src[s], other[s], out=dst[s])),
    }
    size = f"{per_slice * 4 >> 20} MiB slices of {nbytes >> 20} MiB buffers"
    results = {}
    for name, (moved, kernel) in kernels.items():
        deadline = time.perf_counter() + budget_s / len(kernels)
        taken: list[Sample] = []
        with _quiet_gc():
            while len(taken) < max(10, 3 * len(slices)) and (len(taken) < 3 or time.perf_counter() < deadline):
                s = slices[len(taken) % len(slices)]
                taken.append(watch.sample(lambda s=s, kernel=kernel: kernel(s)))
        results[name] = summarize(taken, watch.threads, size, work=moved * per_slice * 4.0)
    return results


def per_op_cost(device: str, chain: int, samples: int, synchronize: bool) -> Measurement:
    """Host wall time per op of a chain of ``torch.add`` on one-element tensors.

    On the CPU this is the eager dispatch overhead (Python call, dispatcher, allocation). On CUDA
    without ``synchronize`` it is the host cost of enqueuing a kernel; with it, the cost per
    kernel of a launch-bound chain, waited for at the end.
    """
    import torch

    x = torch.zeros(1, device=device)
    one = torch.ones(1, device=device)
    sync = torch.cuda.synchronize if synchronize else (lambda: None)

    def run_chain() -> None:
        y = x
        for _ in range(chain):
            y = torch.add(y, one)
        sync()

    host = Stopwatch("cpu")       # host time whatever the device; the chain runs on one thread
    with torch.no_grad():
        for _ in range(3):
            run_chain()
        taken = host.samples(run_chain, count=samples, deadline=float("inf"))
    return summarize(taken, 1, f"chain of {chain} torch.add on 1-element tensors", per=chain)


# ---------------------------------------------------------------- the calibration plan

@dataclass(frozen=True)
class Plan:
    """Problem sizes and time budgets (seconds) of one calibration."""

    fp32_sizes: tuple[int, ...]
    fp32_budget_s: float
    low_sizes: tuple[int, ...]          # bf16 / fp16
    low_budget_s: float                 # per dtype
    buffer_bytes: int
    slice_bytes: int
    bandwidth_budget_s: float
    chain: int
    chain_samples: int


PLANS = {   # (device kind, quick) -> Plan; CPU totals stay under 30 s (quick: 5 s), one-thread
            # re-measurements on a busy machine (see _one_thread_floor) included
    ("cpu", False): Plan((256, 512, 1024, 1536), 4.0, (128, 256, 512, 1024), 1.5,
                         256 << 20, 32 << 20, 3.0, 100, 400),
    ("cpu", True): Plan((256, 512, 1024), 0.8, (128, 256), 0.3, 64 << 20, 16 << 20, 0.6, 100, 100),
    ("cuda", False): Plan((1024, 2048, 4096, 8192), 3.0, (1024, 2048, 4096, 8192), 3.0,
                          1 << 30, 1 << 30, 2.0, 100, 400),
    ("cuda", True): Plan((1024, 2048, 4096), 1.0, (1024, 2048, 4096), 1.0, 256 << 20, 256 << 20,
                         0.5, 100, 100),
}
SLOW_FRACTION = 0.5    # a low-precision matmul slower than this share of fp32 gets a note


def measure(device: str, quick: bool) -> dict[str, Any]:
    """Run the plan for ``device`` and return MachineModel fields (figures, notes, details)."""
    import torch

    if not device.startswith("cuda"):
        return _measure(device, PLANS[("cpu", quick)])
    with torch.cuda.device(device):     # leaves the caller's current device alone
        return _measure(device, PLANS[("cuda", quick)])


def _measure(device: str, plan: Plan) -> dict[str, Any]:
    import torch

    watch = Stopwatch(device)
    notes: dict[str, str] = {}
    details: dict[str, Any] = {"plan": _json_ready(asdict(plan)), "load_average": _load_average(), "phases_s": {}}
    with _phase(details, "matmul"):
        peaks = _peaks(watch, plan, notes, details)
    with _phase(details, "bandwidth"):
        bandwidth = _bandwidth(watch, plan)
    details["bandwidth"] = {name: m.to_json() for name, m in bandwidth.items()}
    with _phase(details, "dispatch"):
        dispatch = per_op_cost(device, plan.chain, plan.chain_samples, synchronize=False)
    details["dispatch"] = dispatch.to_json()
    launch = None
    if watch.cuda:
        with _phase(details, "launch"):
            launch = per_op_cost(device, plan.chain, plan.chain_samples, synchronize=True)
        details["launch"] = launch.to_json()
        details["allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
    _note_contention(notes, details, [*details["matmul"].values(), *details["bandwidth"].values(),
                                      details["dispatch"]])
    return {"peak_flops": peaks, "mem_bw": max(m.value for m in bandwidth.values()),
            "dispatch_overhead_s": dispatch.value, "launch_latency_s": launch and launch.value,
            "threads": torch.get_num_threads(), "notes": notes, "details": details}


def _json_ready(doc: dict[str, Any]) -> dict[str, Any]:
    """Tuples become lists, so a model equals itself after a JSON round trip."""
    return {k: list(v) if isinstance(v, tuple) else v for k, v in doc.items()}


@contextmanager
def _phase(details: dict[str, Any], name: str) -> Iterator[None]:
    start = time.perf_counter()
    try:
        yield
    finally:
        details["phases_s"][name] = round(time.perf_counter() - start, 3)


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):       # not on every platform
        return None


def _note_contention(notes: dict[str, str], details: dict[str, Any], figures: list[dict[str, Any]]) -> None:
    busy = [f for f in figures if f["estimator"] == "best"]
    if busy:
        notes["contention"] = (f"the machine was busy during calibration (load average "
                               f"{details['load_average']} on {os.cpu_count()} CPUs): {len(busy)} of "
                               f"{len(figures)} figures come from the fastest sample, not the median; "
                               "rerun `cuvil-pgc calibrate` on an idle machine for steadier figures")


def _peaks(watch: Stopwatch, plan: Plan, notes: dict[str, str], details: dict[str, Any]) -> dict[str, float]:
    import torch

    fp32 = _matmul_peak(watch, torch.float32, plan.fp32_sizes, plan.fp32_budget_s)
    peaks, details["matmul"] = {"fp32": fp32.value}, {"fp32": fp32.to_json()}
    for key, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        try:
            found = _matmul_peak(watch, dtype, plan.low_sizes, plan.low_budget_s)
        except Unsupported as exc:
            notes[key] = f"unsupported: torch.mm in {key} fails on {watch.device} ({exc})"
            continue
        peaks[key], details["matmul"][key] = found.value, found.to_json()
        share = found.value / fp32.value
        if share < SLOW_FRACTION:
            notes[key] = (f"slow: {share:.3f}x the fp32 rate; {watch.device} has no fast {key} matmul, "
                          f"so {key} autocast slows matmuls down here")
    return peaks


def _matmul_peak(watch: Stopwatch, dtype: Any, sizes: tuple[int, ...], budget_s: float) -> Measurement:
    def run(stopwatch: Stopwatch, share: float) -> dict[str, Measurement]:
        return {"mm": matmul_rate(stopwatch, dtype, sizes, budget_s * share)}

    return _one_thread_floor(watch, run)["mm"]


def _bandwidth(watch: Stopwatch, plan: Plan) -> dict[str, Measurement]:
    nbytes = plan.buffer_bytes
    if watch.cuda:      # three buffers: stay well inside small GPUs' memory
        import torch

        nbytes = min(nbytes, torch.cuda.get_device_properties(watch.device).total_memory // 16)
    buffers = stream_buffers(watch.device, nbytes)      # shared by the one-thread rerun

    def run(stopwatch: Stopwatch, share: float) -> dict[str, Measurement]:
        return stream_bandwidth(stopwatch, buffers, plan.slice_bytes, plan.bandwidth_budget_s * share)

    return _one_thread_floor(watch, run)


def _one_thread_floor(watch: Stopwatch, run: Callable[[Stopwatch, float], dict[str, Measurement]]
                      ) -> dict[str, Measurement]:
    """Run a throughput benchmark; on a busy CPU, also at one thread (half the budget), keeping the better.

    With N threads, each parallel region waits for whichever thread the scheduler parked, so on an
    oversubscribed machine an N-thread kernel can run slower than one thread would, though the
    hardware can always do at least what one thread does. ``run(stopwatch, budget_share)``.
    """
    import torch

    found = run(watch, 1.0)
    if watch.cuda or watch.threads == 1 or all(m.estimator == "median" for m in found.values()):
        return found
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = run(Stopwatch(watch.device), 0.5)
    finally:
        torch.set_num_threads(before)
    return {k: single[k] if single[k].value > m.value else m for k, m in found.items()}
