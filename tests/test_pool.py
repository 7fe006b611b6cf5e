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
