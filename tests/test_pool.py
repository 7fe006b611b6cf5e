"""The process pool for work over many traces: its workers know they are workers, so a large trace
read there is read by that one process (the pool already uses the cores)."""

from __future__ import annotations

import os

from cuvil_pgc import _pool
from cuvil_pgc.trace import _parallel


def _where(item: int) -> tuple[int, bool, bool]:
    return os.getpid(), _pool.in_pool_worker(), _parallel.reads_in_parallel_here()


def test_pool_workers_read_large_traces_in_one_process(monkeypatch) -> None:
    monkeypatch.setenv(_parallel.ENV_READ_WORKERS, "2")
    assert not _pool.in_pool_worker()
    results = _pool.pool_map(_where, [1, 2, 3], workers=2)
    assert {pid for pid, _, _ in results} != {os.getpid()}
    assert all(worker and not parallel for _, worker, parallel in results)
    assert _pool.pool_map(_where, [1], workers=2) == [(os.getpid(), False, _parallel.reads_in_parallel_here())]


_MARK: list[str] = []


def _inherited(item: int) -> list[str]:
    return list(_MARK)             # a forked worker has the parent's list; a started one imports it afresh


def _paused_display_run() -> tuple[list, int, bool, list]:
    """In a fresh process (no thread of another test): pool_map with a pausable thread registered,
    then with one that is not."""
    import threading

    state = {"starts": 0}

    def start() -> None:
        state["stop"] = threading.Event()
        state["thread"] = threading.Thread(target=state["stop"].wait, daemon=True)
        state["thread"].start()
        state["starts"] += 1

    def stop() -> None:
        state["stop"].set()
        state["thread"].join()

    _MARK[:] = ["parent"]
    start()
    with _pool.pausable_thread(stop, start):
        paused = _pool.pool_map(_inherited, [1, 2], workers=2)
        restarted = state["starts"], state["thread"].is_alive()
    unregistered = _pool.pool_map(_inherited, [1, 2], workers=2)
    stop()
    return paused, restarted[0], restarted[1], unregistered


def test_a_paused_display_thread_lets_the_pool_fork() -> None:
    """A thread registered as pausable (a progress display's) is stopped while the workers fork and
    started again; an unregistered thread makes the pool start its workers another way (forkserver)."""
    import pickle
    import subprocess
    import sys
    from pathlib import Path

    code = "import pickle, sys; from tests.test_pool import _paused_display_run; " \
           "sys.stdout.buffer.write(pickle.dumps(_paused_display_run()))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                          capture_output=True, timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()[-2000:]
    paused, starts, alive, unregistered = pickle.loads(proc.stdout)
    assert paused == [["parent"], ["parent"]]           # forked: the workers have the parent's state
    assert starts == 2 and alive                         # the thread was started again after the fork
    assert unregistered == [[], []]                      # not forked: the workers imported this module


def test_usable_cores_follow_a_containers_cpu_quota(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(_parallel.ENV_READ_WORKERS, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)), raising=False)
    quota = tmp_path / "cpu.max"
    monkeypatch.setattr(_pool, "CGROUP_CPU_MAX", str(quota))
    assert _pool.usable_cores() == 64                     # no cgroup file: the affinity
    quota.write_text("max 100000\n")
    assert _pool.usable_cores() == 64                     # no quota
    quota.write_text("150000 100000\n")
    assert _pool.usable_cores() == 2                      # 1.5 CPUs: rounded up
    assert _pool.pool_size(None, 100) == 2 and _parallel.read_workers() == 2
    quota.write_text("garbage\n")
    assert _pool.usable_cores() == 64
