"""Analysis of many traces on an engine: ``analyze_many(paths, engine="local"|"ray")``.

The map (:func:`cuvil_pgc.analyze.reduce.map_trace`: one trace loaded and analysed where it lies;
a trace file, or one trace of a Parquet export directory) runs one trace at a time per worker, so
a worker's memory is bounded by the largest trace it reads; the reduce (:func:`~cuvil_pgc.analyze.reduce.reduce_partials`) runs in the caller and is
order-independent, so the merged Analysis is the same whichever engine ran the map.

- ``local`` (default): a process pool over this machine's cores (``workers``, default
  ``os.cpu_count()``); ``workers=1`` runs the map in this process.
- ``ray``: one Ray task per trace (``num_cpus=1``) on the cluster ``ray.init(address=...)``
  reaches (``address`` or ``RAY_ADDRESS``; with neither, a local one). Paths must be readable by
  the workers (shared storage); the package must be installed on every node.

``analysis.trace["engine"]`` holds what ran it and the timings (the only part that differs
between engines): name, workers, traces, wall_s, map CPU seconds, the largest worker RSS.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from cuvil_pgc._pool import Progress, pool_map, pool_size
from cuvil_pgc.analyze.analysis import Analysis
from cuvil_pgc.analyze.reduce import Partial, map_trace, reduce_partials
from cuvil_pgc.errors import ConfigError, TraceError
from cuvil_pgc.trace.discover import trace_files

ENGINES = ("local", "ray")


def analyze_many(inputs: Sequence[str | os.PathLike[str]], engine: str = "local", *, workers: int | None = None,
                 address: str | None = None, machine: Any = None, filter: str | None = None,
                 progress: Progress | None = None) -> Analysis:
    """Analyse every trace of ``inputs`` on ``engine`` and merge the results (module docstring)."""
    if engine not in ENGINES:
        raise ConfigError(f"--engine {engine!r} is not an engine", fix=f"use one of: {', '.join(ENGINES)}")
    paths = work_units(inputs)
    if not paths:
        raise TraceError("no trace files given", fix="pass trace files, a directory or a glob")
    if workers is not None and workers < 1:
        raise ConfigError(f"--workers {workers} must be at least 1")
    machine_doc = machine.to_json() if machine is not None else None
    t0 = time.perf_counter()
    if engine == "ray":
        from cuvil_pgc.analyze._ray_engine import run_map

        partials, used = run_map(paths, machine_doc, filter, address, progress)
    else:
        partials, used = _local_map(paths, machine_doc, filter, workers, progress)
    analysis = reduce_partials(partials)
    timings = [p["timing"] for p in partials]
    analysis.trace["engine"] = {
        "name": engine, "workers": used, "traces": len(paths), "wall_s": time.perf_counter() - t0,
        "map_cpu_s": sum(t["cpu_s"] for t in timings), "max_worker_rss_bytes": max(t["max_rss_bytes"] for t in timings),
    }
    return analysis


def work_units(inputs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """What the map runs over: trace files (files, globs, directories of traces) and, for a Parquet
    export directory, each trace in it (:func:`cuvil_pgc.trace.parquet.trace_units`)."""
    from cuvil_pgc.trace import parquet

    units: list[str] = []
    for item in inputs:
        text = os.fspath(item)
        units += parquet.trace_units(text) if parquet.is_dataset(text) else trace_files([text])
    seen: set[str] = set()
    return [u for u in units if not (u in seen or seen.add(u))]


def _local_map(paths: list[str], machine: dict | None, filter: str | None, workers: int | None,
               progress: Progress | None) -> tuple[list[Partial], int]:
    return pool_map(map_trace, paths, workers, progress, args=(machine, filter)), pool_size(workers, len(paths))
