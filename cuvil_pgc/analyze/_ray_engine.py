"""The map of :mod:`cuvil_pgc.analyze.engine` as Ray tasks: one task per trace, one CPU each.

Connects with ``ray.init(address=...)`` (``address`` or ``RAY_ADDRESS``; neither: a local cluster
on this machine) unless Ray is already initialised, and disconnects only what it connected.
"""

from __future__ import annotations

from typing import Any

from cuvil_pgc.analyze.reduce import Partial, map_trace
from cuvil_pgc.errors import ConfigError, CuvilError


def run_map(paths: list[str], machine: dict | None, filter: str | None, address: str | None,
            progress: Any) -> tuple[list[Partial], int]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray", fix="pip install 'cuvil-pgc[ray]'") from None
    connected = not ray.is_initialized()
    if connected:
        try:
            ray.init(address=address, include_dashboard=False, log_to_driver=False,
                     logging_level="ERROR", configure_logging=False)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise ConfigError(f"cannot reach the Ray cluster at {address or 'RAY_ADDRESS/local'}: {exc}",
                              fix="start one (ray start --head) or pass --address HOST:PORT") from None
    try:
        workers = max(int(ray.cluster_resources().get("CPU", 1)), 1)
        task = ray.remote(num_cpus=1, max_retries=1)(map_trace)
        pending = {task.remote(path, machine, filter): path for path in paths}
        partials: list[Partial] = []
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                path = pending.pop(ref)
                partials.append(_get(ray, ref, path))
                if progress:
                    progress(len(partials), len(paths), path)
        return partials, min(workers, len(paths))
    finally:
        if connected:
            ray.shutdown()


def _get(ray: Any, ref: Any, path: str) -> Partial:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.as_instanceof_cause()
        if isinstance(cause, CuvilError):
            raise cause from None
        raise CuvilError(f"the Ray task analysing it failed: {type(cause).__name__}: {cause}", path=path,
                         fix="check that the path is readable from every Ray node") from None
