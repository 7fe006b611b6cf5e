"""One process pool for work over many trace files (``analyze --engine local``, ``export``).

``pool_map(func, items, workers)`` calls ``func(item)`` for every item in ``workers`` processes
(default: :func:`usable_cores`; 1 or a single item: in this process) and returns the results in
completion order, calling ``progress(done, total, item)`` after each. Workers are forked from a
single-threaded caller (a progress display's thread pauses for it: :func:`paused_for_fork`), else
started by forkserver (spawn where there is none): never a fork of a process with threads. Each
handles one item at a time, so its memory is bounded by the largest item. The first exception
raised by ``func`` propagates.
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")
Progress = Callable[[int, int, str], None]     # (done, total, item just finished)


_in_worker = False


def fork_is_safe() -> bool:
    """Whether this process may fork: the platform has fork and no other thread runs here (a fork
    copies only the calling thread; locks the others hold would stay held in the child)."""
    return threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()


_pausable: list[tuple[Callable[[], None], Callable[[], None]]] = []


@contextmanager
def pausable_thread(stop: Callable[[], None], start: Callable[[], None]) -> Iterator[None]:
    """While the block runs, :func:`paused_for_fork` may stop a thread of ours with ``stop()`` (which
    must join it) and start it again with ``start()``: a progress display's refresh thread, which
    would otherwise keep large traces from being read by forked workers."""
    entry = (stop, start)
    _pausable.append(entry)
    try:
        yield
    finally:
        _pausable.remove(entry)


@contextmanager
def paused_for_fork() -> Iterator[bool]:
    """Stop the pausable threads, yield whether this process may fork now (:func:`fork_is_safe`),
    and start them again after the block (which should only start the forked processes). A display
    that fails to stop or start is left as it is; nothing here raises."""
    restart = []
    for stop, start in list(_pausable):
        try:
            stop()
            restart.append(start)
        except Exception:
            pass
    try:
        yield fork_is_safe()
    finally:
        for start in reversed(restart):
            try:
                start()
            except Exception:
                pass


def in_pool_worker() -> bool:
    """True inside a worker of :func:`pool_map`: the pool already uses the cores (a large trace
    read there is read by that one process)."""
    return _in_worker


def _mark_worker() -> None:
    global _in_worker
    _in_worker = True


def _start_method(fork_safe: bool) -> str:
    """fork from a single-threaded process (fast; no re-import of the caller's __main__, which
    spawn and forkserver do: a script without a main guard, or stdin, would run again); else
    forkserver (spawn where there is none), since forking a process with threads can deadlock."""
    if fork_safe:
        return "fork"
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


#: cgroup v2 CPU quota of this process's container ("max 100000" or "200000 100000": quota, period)
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, capped by a container's CPU quota
    (cgroup v2 ``cpu.max``, rounded up), so a 2-CPU container on a 64-core host counts 2."""
    try:
        cores = len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    try:
        with open(CGROUP_CPU_MAX, encoding="ascii") as f:
            quota, period = f.read().split()[:2]
        if quota != "max" and int(period) > 0:
            cores = min(cores, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return cores


def pool_size(workers: int | None, items: int) -> int:
    return max(1, min(workers or usable_cores(), items))


def pool_map(func: Callable[..., T], items: Sequence[Any], workers: int | None = None,
             progress: Progress | None = None, args: tuple = ()) -> list[T]:
    """``[func(item, *args) ...]`` over a process pool, in completion order (module docstring)."""
    n = pool_size(workers, len(items))
    results: list[T] = []
    if n == 1:
        for item in items:
            results.append(func(item, *args))
            if progress:
                progress(len(results), len(items), item)
        return results
    with paused_for_fork() as safe:         # a progress display's thread stops while the workers fork
        pool = ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context(_start_method(safe)),
                                   initializer=_mark_worker)
        try:
            futures = {pool.submit(func, item, *args): item for item in items}   # the first starts every worker
        except BaseException:
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    with pool:
        try:
            for future in as_completed(futures):
                results.append(future.result())
                if progress:
                    progress(len(results), len(items), futures[future])
        except BaseException:
            for f in futures:
                f.cancel()
            raise
    return results
