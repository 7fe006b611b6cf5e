"""Programs of their own for the input sizes a service calls often.

A region's program for other sizes (:mod:`.other_shapes`) leaves its sizes free, and a runtime
runs a free-size program well below what it runs one compiled for the sizes it gets: OpenVINO
2026.4 on this repository's machine (one thread, interleaved, medians), the same IR reshaped to
the call's sizes against it free: a 2-layer BERT at 40-53 tokens 1.33-1.39x faster, DistilBERT
1.32-1.82x, GPT-2 1.40-1.65x, the zoo transformer 1.53-1.71x; compiling one size took 30-60 ms.
ONNX Runtime 1.32 gains less from its sizes fixed (free-dimension overrides): GPT-2 1.22-1.28x,
the zoo transformer 1.06-1.18x, BERT and DistilBERT 1.01-1.06x; a session took 5-14 ms.

So a loaded build counts its calls per size, and a size called :data:`COMPILE_AFTER` times gets a
program compiled for exactly its sizes, on a background thread: the service's calls meanwhile run
the free-size program as before, and wait for nothing. The new program answers no call before it
passes the accuracy guard, against the original module, at the inputs of the call that asked for
it (the check the build ran on the free-size program at its probes; a size the check refuses
stays on the free-size program, and after :data:`MAX_REFUSED` refusals the region compiles no
more). The check calls the original module once per size, on the background thread, under
``no_grad``: a hook on it sees that call. A region holds at most ``capacity`` such programs (each holds its own copy of the
compiled weights: by default 8, fewer where their weights would pass 1 GiB,
:func:`default_capacity`); when it is full, a size gets one only once it has been called more than twice
as often as the least-called size that has one, which it then replaces: a service whose sizes
vary more than that keeps its most frequent sizes instead of compiling in a loop.

:class:`SizePrograms` decides and keeps; what a program is, and how it is checked, the region's
runtime says (``compile(shapes) -> runner``, ``check(runner, args)``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch

from cuvil_pgc.recompile._stderr import exception_line

log = logging.getLogger(__name__)

#: calls at a size before it gets a program of its own
COMPILE_AFTER = 3
#: programs per region, by default (``load_build(size_programs=...)``; 0 turns them off)
CAPACITY = 8
#: by default a region keeps no more programs than copies of its weights fit in this many bytes:
#: each program holds its own compiled weights. Measured RSS per program: a 2-layer BERT (2 MB of
#: weights) 5.9 MB on OpenVINO, 4.0 MB on ONNX Runtime; a 4-layer BERT (65 MB) 56 MB and 83 MB
#: (ONNX Runtime's sessions are made from the program's bytes, which the region keeps)
WEIGHTS_BUDGET = 1 << 30
#: refused sizes after which a region compiles no more programs
MAX_REFUSED = 3
#: distinct sizes a region counts (beyond them a new size is not counted: ``uncounted``)
MAX_COUNTED = 4096


#: set inside :func:`compiling_now`: a size is compiled and checked at its first call, on the caller's thread
_NOW: contextvars.ContextVar[bool] = contextvars.ContextVar("cuvil_size_programs_now", default=False)


@contextlib.contextmanager
def compiling_now() -> Iterator[None]:
    """Inside it, a region's first call at a size without a program of its own compiles and checks
    one for it there and then, and answers with it once it passed: a service that knows the sizes
    it will be called at makes their programs at start-up (``load_build(size_examples=...)``),
    not after :data:`COMPILE_AFTER` calls each on the background thread. Capacity, refusals and the
    replacement rule hold as for programs made in the background."""
    token = _NOW.set(True)
    try:
        yield
    finally:
        _NOW.reset(token)


def default_capacity(weight_bytes: int, kept: int = 0) -> int:
    """The programs a region whose weights take ``weight_bytes`` keeps by default: :data:`CAPACITY`,
    fewer where their copies of the weights, and the ``kept`` copies its runtime holds to make them
    (ONNX Runtime: the program's bytes), would pass :data:`WEIGHTS_BUDGET` (0: none)."""
    return max(0, min(CAPACITY, WEIGHTS_BUDGET // max(weight_bytes, 1) - kept))


class SizePrograms:
    """A region's programs for single sizes (see the module docstring).

    ``compile(shapes)`` makes the runner for the positional tensors' shapes; ``check(runner,
    args)`` raises where it answers the positional call ``args`` differently from the original module; ``submit(job)``
    runs a job off the caller's thread (default: one background thread for the process)."""

    def __init__(self, compile: Callable[[tuple[tuple[int, ...], ...]], Any],
                 check: Callable[[Any, tuple[Any, ...]], Any], *, capacity: int = CAPACITY,
                 after: int = COMPILE_AFTER, label: str = "a region",
                 submit: Callable[[Callable[[], None]], None] | None = None) -> None:
        self._compile, self._check, self.capacity, self.after, self.label = compile, check, capacity, after, label
        self._submit = submit or _WORKER.submit
        self._ready: dict[tuple[Any, ...], Any] = {}         # size -> its checked program
        #: size -> the region's lean call of its program (None: it has none), which the region
        #: makes on the program's first call (:meth:`lean`)
        self.leans: dict[tuple[Any, ...], Any] = {}
        self._counts: dict[tuple[Any, ...], int] = {}        # size -> calls at it
        self._pending: set[tuple[Any, ...]] = set()
        self._refused: set[tuple[Any, ...]] = set()
        self._floor = 0          # calls at the least-called size with a program, when it was last found
        self._idle = threading.Condition()
        self.compiled = self.evicted = self.uncounted = self.dropped = 0
        #: why the region compiles no more programs (None: it does)
        self.stopped: str | None = None if capacity > 0 else "turned off (capacity 0)"
        _LIVE.add(self)

    def runner(self, tensors: tuple[torch.Tensor, ...], args: tuple[Any, ...]) -> Any:
        """The program for the sizes of ``tensors`` (the positional tensors of the call ``args``),
        or None: the free-size program answers. Counts the call; never raises, and never waits
        outside :func:`compiling_now`."""
        key = tuple(t.shape for t in tensors)
        ready = self._ready.get(key)
        counts = self._counts
        n = counts.get(key, 0) + 1
        if n == 1 and len(counts) >= MAX_COUNTED:
            self.uncounted += 1
            return ready
        counts[key] = n
        if ready is not None or self.stopped is not None or key in self._refused:
            return ready
        if _NOW.get():
            return self._now(key, args)
        if n < self.after or key in self._pending:
            return None
        if not self._room(n):
            return None
        try:
            self._ask(key, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args))
        except Exception:        # the caller's call goes on: this size is asked for again next call
            self.dropped += 1
        return None

    def _now(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> Any:
        """The program for ``key``, compiled and checked on this thread (see :func:`compiling_now`),
        or None (refused, or no room for it); one the worker is making is waited for."""
        if key in self._pending:
            with self._idle:
                self._idle.wait_for(lambda: key not in self._pending)
        elif self._room(self._counts[key]):
            with self._idle:
                self._pending.add(key)
            self._make(key, args)
        return self._ready.get(key)

    def _room(self, n: int) -> bool:
        """Whether a size called ``n`` times gets a program now: the region has room for one more,
        or the size replaces its least-called one (see :meth:`_replaces`)."""
        return len(self._ready) + len(self._pending) < self.capacity or (not self._pending and self._replaces(n))

    def lean(self, key: tuple[Any, ...]) -> Any:
        """The lean call kept for the size ``key`` (the call's tensors' shapes), counting the call;
        None where there is none."""
        lean = self.leans.get(key)
        if lean is not None:
            self._counts[key] = self._counts.get(key, 0) + 1
        return lean

    def program(self, key: tuple[Any, ...]) -> Any:
        """The program of the size ``key``, or None (not counted as a call)."""
        return self._ready.get(key)

    def _replaces(self, n: int) -> bool:
        """Whether a size called ``n`` times replaces the least-called size with a program (the
        floor only grows, so it is found again only where its last value says yes)."""
        if n <= 2 * self._floor:
            return False
        counts = self._counts
        self._floor = min((counts.get(k, 0) for k in list(self._ready)), default=0)
        return bool(self._ready) and n > 2 * self._floor

    def _ask(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> None:
        with self._idle:
            self._pending.add(key)
        try:
            self._submit(lambda: self._make(key, args))
        except BaseException:
            self._done(key)
            raise

    def _make(self, key: tuple[Any, ...], args: tuple[Any, ...]) -> None:
        """Compile, check and keep the program for ``key`` (on the worker)."""
        try:
            runner = self._compile(tuple(tuple(s) for s in key))
            self._check(runner, args)
        except Exception as exc:
            self._refuse(key, exc)
        else:
            self._keep(key, runner)
        finally:
            self._done(key)

    def _keep(self, key: tuple[Any, ...], runner: Any) -> None:
        ready, counts = self._ready, self._counts
        while ready and len(ready) >= self.capacity:
            victim = min(ready, key=lambda k: counts.get(k, 0))
            del ready[victim]
            self.leans.pop(victim, None)
            self.evicted += 1
        ready[key] = runner
        self.compiled += 1
        self._floor = min((counts.get(k, 0) for k in ready), default=0)

    def _refuse(self, key: tuple[Any, ...], exc: Exception) -> None:
        self._refused.add(key)
        reason = exception_line(exc, 200)
        if len(self._refused) >= MAX_REFUSED:
            self.stopped = f"{len(self._refused)} sizes refused, the last: {reason}"
        if len(self._refused) == 1 or self.stopped:
            log.warning("cuvil-pgc: %s: a program of its own for sizes %s was refused (%s); calls at those sizes "
                        "run its program for other sizes%s", self.label, _sizes(key), reason,
                        "; it compiles no more" if self.stopped else "")

    def _done(self, key: tuple[Any, ...]) -> None:
        with self._idle:
            self._pending.discard(key)
            self._idle.notify_all()

    @property
    def refused(self) -> int:
        return len(self._refused)

    def sizes(self) -> list[tuple[tuple[int, ...], ...]]:
        """The sizes that have a program of their own."""
        return [tuple(tuple(s) for s in key) for key in list(self._ready)]

    def _forked(self) -> None:
        """In a forked child: the programs being made are not (the worker thread stayed in the
        parent), and the lock may have been held there at the fork."""
        self._idle = threading.Condition()
        self._pending = set()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until no program is being made (for benchmarks and tests); False on ``timeout``."""
        with self._idle:
            return self._idle.wait_for(lambda: not self._pending, timeout)


def _sizes(key: tuple[Any, ...]) -> str:
    return ", ".join(str(tuple(s)) for s in key)


class _Worker:
    """One daemon thread per process that runs submitted jobs in order (a process that exits while
    one runs does not wait for it; a forked child starts its own, and asks again for the programs
    its parent was making: a prefork server loads its build before it forks its workers)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._pid = 0

    def submit(self, job: Callable[[], None]) -> None:
        if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
            with self._lock:
                if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                    self._jobs = queue.SimpleQueue()
                    self._thread = threading.Thread(target=self._run, args=(self._jobs,),
                                                    name="cuvil-size-programs", daemon=True)
                    self._pid = os.getpid()
                    self._thread.start()
        self._jobs.put(job)

    @staticmethod
    def _run(jobs: queue.SimpleQueue[Callable[[], None]]) -> None:
        while True:
            job = jobs.get()
            try:
                job()
            except BaseException:        # a job reports its own failures; the thread goes on
                log.exception("cuvil-pgc: making a program for one input size failed")


_WORKER = _Worker()
#: every region's programs, for a forked child to reset (:meth:`SizePrograms._forked`)
_LIVE: weakref.WeakSet[SizePrograms] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for sizes in list(_LIVE):
        sizes._forked()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
