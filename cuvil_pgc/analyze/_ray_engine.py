"""The map of :mod:`cuvil_pgc.analyze.engine` as Ray tasks: one task per trace, one CPU each.

Connects with ``ray.init(address=...)`` (``address`` or ``RAY_ADDRESS``; neither: a local cluster
on this machine) unless Ray is already initialised, and disconnects only what it connected.

Before ``ray.init`` a ``HOST:PORT`` (or ``ray://HOST:PORT``) address is probed with a TCP connect
of :data:`PROBE_TIMEOUT_S` seconds, so an address nothing listens on fails at once with that
reason (``ray.init`` itself retries for minutes). When the port answers but ``ray.init`` fails,
the error says whether the cluster refused this process's authentication: recent Ray (2.60)
starts clusters with token authentication whenever a token exists, which a driver joins only
with ``RAY_AUTH_MODE=token`` and the cluster's token (``~/.ray/auth_token``,
``RAY_AUTH_TOKEN_PATH`` or ``RAY_AUTH_TOKEN``).
"""

from __future__ import annotations

import os
import re
import socket
from typing import Any

from cuvil_pgc.analyze.reduce import Partial, map_trace
from cuvil_pgc.errors import ConfigError, CuvilError

PROBE_TIMEOUT_S = 5.0
_AUTH_FAILURE = re.compile(r"Unauthenticated|InvalidAuthToken|AuthenticationError|authentication token",
                           re.IGNORECASE)
AUTH_FIX = ("set RAY_AUTH_MODE=token in this process's environment, with the cluster's token in "
            "~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN (ray get-auth-token on the head prints it)")


def run_map(paths: list[str], machine: dict | None, filter: str | None, address: str | None,
            progress: Any) -> tuple[list[Partial], int]:
    try:
        import ray
    except ImportError:
        raise ConfigError("--engine ray needs Ray", fix="pip install 'cuvil-pgc[ray]'") from None
    connected = not ray.is_initialized()
    if connected:
        _connect(ray, address)
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


def _connect(ray: Any, address: str | None) -> None:
    target = address or os.environ.get("RAY_ADDRESS") or None
    endpoint = host_and_port(target)
    if endpoint is not None:
        probe(*endpoint, shown=target or "")
    auth_error = getattr(ray.exceptions, "AuthenticationError", RuntimeError)      # recent Ray only
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR", configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError, auth_error) as exc:
        raise _join_error(exc, ray, target, answered=endpoint is not None) from None


def _join_error(exc: BaseException, ray: Any, target: str | None, answered: bool) -> ConfigError:
    """Why ``ray.init`` failed, told apart: authentication, a port that answers but is no Ray
    cluster (or another Ray version), or a local cluster that did not start."""
    where = target or "a new local cluster"
    if auth_failure(exc, ray):
        if os.environ.get("RAY_AUTH_MODE") != "token":
            return ConfigError(f"the Ray cluster at {where} refused this process: it requires token authentication "
                               f"and RAY_AUTH_MODE is {os.environ.get('RAY_AUTH_MODE')!r} here", fix=AUTH_FIX)
        return ConfigError(f"Ray token authentication with the cluster at {where} failed: "
                           f"{_first_sentence(exc)}",
                           fix="use the cluster's token: ~/.ray/auth_token, RAY_AUTH_TOKEN_PATH or RAY_AUTH_TOKEN "
                               "(ray get-auth-token on the head prints it)")
    if answered:
        return ConfigError(f"{target} answers, but ray.init could not join a Ray cluster there: {_first_line(exc)}",
                           fix="pass the head's GCS address (ray status on the head prints it; port 6379 by "
                               "default), with the same Ray version here as on the cluster; a cluster with token "
                               f"authentication also needs: {AUTH_FIX}")
    return ConfigError(f"cannot start or reach the Ray cluster at {where}: {_first_line(exc)}",
                       fix="start one (ray start --head) or pass --address HOST:PORT")


def host_and_port(address: str | None) -> tuple[str, int] | None:
    """(host, port) of a ``HOST:PORT``, ``[IPv6]:PORT`` or ``ray://HOST:PORT`` address; None for
    ``auto``, ``local``, no address, or anything else ``ray.init`` interprets on its own."""
    if not address:
        return None
    text = address.removeprefix("ray://")
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or "/" in text:
        return None
    return host.strip("[]"), int(port)


def probe(host: str, port: int, shown: str, timeout: float = PROBE_TIMEOUT_S) -> None:
    """A ConfigError unless a TCP connection to ``host:port`` opens within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return
    except TimeoutError:
        why = f"no answer within {timeout:g} s"
    except OSError as exc:
        why = exc.strerror or str(exc)
    raise ConfigError(f"cannot reach the Ray cluster at {shown}: {why}",
                      fix="check --address (the head's GCS HOST:PORT; ray status on the head prints it) and that "
                          "the cluster runs (ray start --head) and is reachable from here")


def auth_failure(exc: BaseException, ray: Any) -> bool:
    """Whether ``exc`` (or what caused it) is Ray refusing this process's authentication."""
    auth_error = getattr(getattr(ray, "exceptions", None), "AuthenticationError", None)
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if (auth_error is not None and isinstance(current, auth_error)) or _AUTH_FAILURE.search(str(current)):
            return True
        current = current.__cause__ or current.__context__
    return False


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _first_sentence(exc: BaseException) -> str:
    return _first_line(exc).split(". ")[0].rstrip(".")


def _get(ray: Any, ref: Any, path: str) -> Partial:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.as_instanceof_cause()
        if isinstance(cause, CuvilError):
            raise cause from None
        raise CuvilError(f"the Ray task analysing it failed: {type(cause).__name__}: {cause}", path=path,
                         fix="check that the path is readable from every Ray node") from None
