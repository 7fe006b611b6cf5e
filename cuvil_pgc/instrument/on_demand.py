"""On-demand capture windows for long-running processes.

A process started with ``CUVIL_PGC_ON_DEMAND=1`` (checked when cuvil_pgc is imported) or using
``profile(on_demand=True)`` keeps regions in always-on aggregate mode (instrument.aggregate) and
opens a detailed capture window — region events, operator capture, samplers — when

- it receives ``SIGUSR2``, or
- a request file ``<control dir>/cuvil-pgc-<pid>.request`` appears (``cuvil-pgc capture --pid``
  writes one: ``{"id": str, "seconds": float, "steps": int | null}``).

A window lasts ``seconds`` (default 10) or ``steps`` calls of ``step()``, then its trace is
written to ``<control dir>/cuvil-pgc-<pid>.<window>.trace.json`` and, for a request file, the
answer ``cuvil-pgc-<pid>.<id>.done`` (``{"trace": path}``) is written beside it.

torch.profiler records operators only on the thread that started it, so windows open and close
on the main thread, inside the SIGUSR2 handler; the watcher thread turns request files and
deadlines into a SIGUSR2 sent to the main thread only (``signal.pthread_kill``).

The host program's own handling is kept: the previous SIGUSR2 handler is called after ours
(unless it was the default action, which would kill the process, or SIG_IGN); the handler is
installed only when imported from the main thread — elsewhere only request files work — and is
restored by ``stop()``. The watcher is one daemon thread named ``cuvil-pgc-on-demand``.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import threading
import time
from typing import Any

import orjson

from cuvil_pgc.instrument.aggregate import AggregateSession

log = logging.getLogger("cuvil_pgc")

ENV_ON_DEMAND = "CUVIL_PGC_ON_DEMAND"
ENV_CONTROL_DIR = "CUVIL_PGC_CONTROL_DIR"
DEFAULT_SECONDS = 10.0
POLL_S = 0.1


def control_dir() -> str:
    return os.environ.get(ENV_CONTROL_DIR) or tempfile.gettempdir()


def request_path(pid: int, directory: str | None = None) -> str:
    return os.path.join(directory or control_dir(), f"cuvil-pgc-{pid}.request")


def done_path(pid: int, request_id: str, directory: str | None = None) -> str:
    return os.path.join(directory or control_dir(), f"cuvil-pgc-{pid}.{request_id}.done")


class OnDemandController:
    """Aggregates always; detailed windows on request (see module docstring)."""

    def __init__(self, directory: str | None = None, seconds: float = DEFAULT_SECONDS,
                 flush_s: float = 10.0, **window_options: Any) -> None:
        self.directory = directory or control_dir()
        self.seconds = seconds
        self.window_options = {"ops": True, **window_options}
        self.pid = os.getpid()
        self.aggregate = AggregateSession(os.path.join(self.directory, f"cuvil-pgc-{self.pid}.summary.json"),
                                          flush_s=flush_s)
        self.windows: list[str] = []
        self._window: Any = None
        self._deadline: float | None = None
        self._steps_left: int | None = None
        self._request_id: str | None = None
        self._pending: dict[str, Any] | None = None
        self._previous: Any = None
        self._installed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main_ident = threading.main_thread().ident

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> OnDemandController:
        self.aggregate.start()
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGUSR2)
            signal.signal(signal.SIGUSR2, self._on_signal)
            self._installed = True
        self._thread = threading.Thread(target=self._watch, name="cuvil-pgc-on-demand", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> str:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self._window is not None:
            self._close_window()
        if self._installed and signal.getsignal(signal.SIGUSR2) == self._on_signal:
            signal.signal(signal.SIGUSR2, self._previous)
        return self.aggregate.stop()

    def __enter__(self) -> OnDemandController:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def step(self) -> None:
        """End of one step of the host loop: counts down a window opened for N steps."""
        if self._window is not None and self._steps_left is not None:
            self._steps_left -= 1
            if self._steps_left <= 0:
                self._close_window()

    # -- main thread: the signal handler -----------------------------------------------------
    def _on_signal(self, signum: int, frame: Any) -> None:
        try:
            if self._window is None:
                self._open_window(self._take_request())
            elif self._deadline is not None and time.monotonic() >= self._deadline:
                self._close_window()
        except Exception as exc:   # never let profiling kill the host program
            log.warning("cuvil-pgc: on-demand window failed: %s: %s", type(exc).__name__, exc)
        previous = self._previous
        if callable(previous):
            previous(signum, frame)

    def _take_request(self) -> dict[str, Any]:
        request, self._pending = self._pending, None
        return request or self._read_request() or {}

    def _open_window(self, request: dict[str, Any]) -> None:
        from cuvil_pgc.instrument.session import profile

        path = os.path.join(self.directory, f"cuvil-pgc-{self.pid}.{len(self.windows)}.trace.json")
        self._request_id = request.get("id")
        steps = request.get("steps")
        self._steps_left = int(steps) if steps else None
        seconds = float(request.get("seconds") or self.seconds)
        self._deadline = None if self._steps_left else time.monotonic() + seconds
        self._window = profile(path, **self.window_options).start()

    def _close_window(self) -> None:
        window, self._window = self._window, None
        path = window.stop()
        self._deadline = self._steps_left = None
        if path:
            self.windows.append(path)
        if self._request_id is not None:
            _write_json(done_path(self.pid, self._request_id, self.directory), {"trace": path})
            self._request_id = None

    # -- watcher thread ------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                if self._window is None and self._pending is None:
                    request = self._read_request()
                    if request is not None:
                        self._pending = request
                        self._signal_main()
                elif self._deadline is not None and time.monotonic() >= self._deadline:
                    self._signal_main()
            except Exception as exc:
                log.warning("cuvil-pgc: on-demand watcher: %s: %s", type(exc).__name__, exc)

    def _signal_main(self) -> None:
        if self._installed:
            signal.pthread_kill(self._main_ident, signal.SIGUSR2)
        elif self._window is None and self._pending is not None:
            # No handler (started off the main thread): windows record regions and samplers only.
            self._open_window(self._take_request())
        elif self._deadline is not None:
            self._close_window()

    def _read_request(self) -> dict[str, Any] | None:
        path = request_path(self.pid, self.directory)
        try:
            with open(path, "rb") as f:
                data = f.read()
            os.remove(path)
        except FileNotFoundError:
            return None
        try:
            request = orjson.loads(data) if data.strip() else {}
            return request if isinstance(request, dict) else {}
        except orjson.JSONDecodeError:
            log.warning("cuvil-pgc: ignoring unreadable capture request %s", path)
            return {}


def _write_json(path: str, obj: Any) -> None:
    from pathlib import Path

    from cuvil_pgc._fsutil import write_atomic

    write_atomic(Path(path), orjson.dumps(obj))


_auto: OnDemandController | None = None


def start_from_env() -> OnDemandController | None:
    """Start on-demand mode when CUVIL_PGC_ON_DEMAND=1 (called once at import)."""
    global _auto
    if _auto is None and os.environ.get(ENV_ON_DEMAND, "") not in ("", "0"):
        try:
            _auto = OnDemandController().start()
        except Exception as exc:
            log.warning("cuvil-pgc: on-demand mode could not start: %s", exc)
    return _auto
