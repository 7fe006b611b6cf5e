"""On-demand capture windows for long-running processes.

A process started with ``CUVIL_PGC_ON_DEMAND=1`` (checked when cuvil_pgc is imported: its one import-time side effect) or using
``profile(on_demand=True)`` keeps regions in always-on aggregate mode (instrument.aggregate) and
opens a detailed capture window — region events, operator capture, samplers — when

- it receives ``SIGUSR2``, or
- a request file ``<control dir>/cuvil-pgc-<pid>.request`` appears (``cuvil-pgc capture --pid``
  writes one: ``{"id": hex str, "seconds": float, "steps": int | null}``).

The control directory is private (instrument._control: per-user by default, 0700, checked for
owner and mode before use; never the shared temp directory). A request is read only from a
regular file of at most 4 KiB owned by this process's user or root, opened without following
links and without blocking; anything else is rejected and removed, and each distinct failure is
logged once with a count (``failures``). A window lasts ``seconds`` (default 10, at most a day) or
``steps`` calls of ``step()``, then its trace (mode 0600) is written to
``<control dir>/cuvil-pgc-<pid>.<window>.trace.json`` and, for a request file, the answer
``cuvil-pgc-<pid>.<id>.done`` (``{"trace": path}`` or ``{"error": why}``, mode 0600) beside it.
If the directory is unsafe the controller logs why and stays off (``unavailable``); it never
raises into the host program. Options go to the windows (``profile`` options) except
:data:`AGGREGATE_OPTIONS`, which go to the always-on aggregate; ``otel=True`` goes to both (metrics
from the aggregate, spans from the windows).

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
import math
import os
import re
import signal
import threading
import time
from typing import Any

import orjson

from cuvil_pgc.errors import CuvilError
from cuvil_pgc.instrument import _control
from cuvil_pgc.instrument._control import ENV_CONTROL_DIR, FailureLog, Rejected
from cuvil_pgc.instrument.aggregate import AggregateSession
from cuvil_pgc.instrument.config import ENV_ON_DEMAND, SessionConfig, on_demand_requested
from cuvil_pgc.instrument.session import Session

log = logging.getLogger("cuvil_pgc")

__all__ = ["ENV_CONTROL_DIR", "ENV_ON_DEMAND", "OnDemandController", "control_dir", "start_from_env"]
DEFAULT_SECONDS = 10.0
MAX_SECONDS = 86_400.0
MAX_STEPS = 10**9
POLL_S = 0.1
REQUEST_ID_RE = re.compile(r"[0-9a-f]{1,32}")
#: Options of ``profile(on_demand=True, ...)`` that go to the always-on aggregate, not the windows.
AGGREGATE_OPTIONS = ("max_paths", "otel_metrics_exporter", "model", "build_version")


def control_dir() -> str:
    """This process's control directory (instrument._control.default_control_dir)."""
    return _control.default_control_dir()


def request_path(pid: int, directory: str | None = None) -> str:
    return os.path.join(directory or control_dir(), f"cuvil-pgc-{pid}.request")


def done_path(pid: int, request_id: str, directory: str | None = None) -> str:
    return os.path.join(directory or control_dir(), f"cuvil-pgc-{pid}.{request_id}.done")


class OnDemandController:
    """Aggregates always; detailed windows on request (see module docstring)."""

    def __init__(self, directory: str | None = None, seconds: float = DEFAULT_SECONDS,
                 flush_s: float = 10.0, **window_options: Any) -> None:
        self.directory = os.path.abspath(directory or control_dir())
        self.seconds = seconds
        # The aggregate's own options; ``otel`` applies to both: metrics from the aggregate,
        # spans from the windows (as CUVIL_OTEL=1 does).
        aggregate_options = {k: window_options.pop(k) for k in AGGREGATE_OPTIONS if k in window_options}
        if "otel" in window_options:
            aggregate_options["otel"] = window_options["otel"]
        self.window_options = {"ops": True, **window_options}
        self.pid = os.getpid()
        self.uid = os.geteuid()
        self.failures = FailureLog()
        self.unavailable: str | None = None    # why the controller stayed off (unsafe directory)
        self._stuck: set[tuple[int, int, int, int]] = set()   # request files seen that cannot be removed
        self.aggregate = AggregateSession(os.path.join(self.directory, f"cuvil-pgc-{self.pid}.summary.json"),
                                          flush_s=flush_s, **aggregate_options)
        self.windows: list[str] = []
        self._window: Any = None
        self._deadline: float | None = None
        self._steps_left: int | None = None
        self._request_id: str | None = None
        self._pending: dict[str, Any] | None = None
        self._previous: Any = None
        self._installed = False
        self._busy = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._main_ident = threading.main_thread().ident

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> OnDemandController:
        try:
            _control.check_private_dir(self.directory, self.uid, create=True)
        except CuvilError as exc:
            self.unavailable = str(exc)
            log.warning("cuvil-pgc: on-demand capture is off: %s", exc)
            return self
        self.aggregate.start()
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.getsignal(signal.SIGUSR2)
            signal.signal(signal.SIGUSR2, self._on_signal)
            self._installed = True
        self._thread = threading.Thread(target=self._watch, name="cuvil-pgc-on-demand", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> str | None:
        if self.unavailable is not None:
            return None
        self._stop.set()
        if self._thread is not None:
            self._thread.join(2.0)
        if self._window is not None:
            self._close_window()
        if self._installed and signal.getsignal(signal.SIGUSR2) == self._on_signal:
            signal.signal(signal.SIGUSR2, self._previous)
        self.failures.summarize()
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
        if self._busy:      # a signal arriving while a window opens or closes: the watcher signals again
            return
        self._busy = True
        try:
            if self._window is None:
                self._open_window(self._take_request())
            elif self._deadline is not None and time.monotonic() >= self._deadline:
                self._close_window()
        except Exception as exc:   # never let profiling kill the host program
            self.failures.report(f"window-{type(exc).__name__}", f"a capture window failed: "
                                                                 f"{type(exc).__name__}: {exc}")
            self._answer({"error": f"{type(exc).__name__}: {exc}"})
        finally:
            self._busy = False
        previous = self._previous
        if callable(previous):
            previous(signum, frame)

    def _take_request(self) -> dict[str, Any]:
        request, self._pending = self._pending, None
        return request or self._read_request() or {}

    def _open_window(self, request: dict[str, Any]) -> None:
        self._request_id = request.get("id")
        self._steps_left = request.get("steps")
        seconds = request.get("seconds") or self.seconds
        self._deadline = None if self._steps_left else time.monotonic() + seconds
        options = dict(self.window_options)
        exporter = options.pop("otel_exporter", None)
        config = SessionConfig.from_env(path=self._window_path(), **options)
        self._window = Session(config, otel_exporter=exporter).start()

    def _window_path(self) -> str:
        """The next window file whose trace and partial are both absent (a leftover never blocks)."""
        n = len(self.windows)
        while True:
            path = os.path.join(self.directory, f"cuvil-pgc-{self.pid}.{n}.trace.json")
            if not (os.path.lexists(path) or os.path.lexists(path + ".partial")):
                return path
            n += 1

    def _close_window(self) -> None:
        window = self._window
        path = window.stop()
        self._window = None     # only now: until the trace is finished no other window may open
        self._deadline = self._steps_left = None
        if path:
            self.windows.append(path)
        self._answer({"trace": path} if path else {"error": "the window's trace could not be written; see the "
                                                            "process's log"})

    def _answer(self, doc: dict[str, Any]) -> None:
        request_id, self._request_id = self._request_id, None
        if request_id is None:
            return
        try:
            _control.write_control_file(done_path(self.pid, request_id, self.directory), orjson.dumps(doc))
        except OSError as exc:
            self.failures.report("answer", f"cannot write the answer to request {request_id}: {exc}")

    # -- watcher thread ------------------------------------------------------------------------
    def _watch(self) -> None:
        while not self._stop.wait(POLL_S):
            try:
                if self._window is None:
                    if self._pending is None:
                        self._pending = self._read_request()
                    if self._pending is not None:      # again each poll until the main thread takes it
                        self._signal_main()
                elif self._deadline is not None and time.monotonic() >= self._deadline:
                    self._signal_main()
            except Exception as exc:
                self.failures.report(f"watcher-{type(exc).__name__}", f"watcher: {type(exc).__name__}: {exc}")

    def _signal_main(self) -> None:
        if self._installed:
            signal.pthread_kill(self._main_ident, signal.SIGUSR2)
        elif self._window is None and self._pending is not None:
            # No handler (started off the main thread): windows record regions and samplers only.
            self._open_window(self._take_request())
        elif self._deadline is not None:
            self._close_window()

    def _read_request(self) -> dict[str, Any] | None:
        """The pending request, validated (see module docstring); None when there is none to act on."""
        path = request_path(self.pid, self.directory)
        identity = _control.file_identity(path)
        if identity is None:
            return None
        if identity in self._stuck:
            self.failures.report("stuck", f"{path} cannot be removed; it is ignored until it changes")
            return None
        try:
            data = _control.read_control_file(path, {self.uid, 0})
        except Rejected as exc:
            self.failures.report(exc.key, f"rejected a capture request: {exc}")
            self._remove(path, identity)
            return None
        if data is None:
            return None
        self._remove(path, identity)      # one that cannot be removed is acted on once, then ignored
        return self._parse(data, path)

    def _remove(self, path: str, identity: tuple[int, int, int, int]) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._stuck.add(identity)
            self.failures.report("unlink", f"cannot remove {path} ({exc.strerror or exc}); it is ignored "
                                           "until it changes")

    def _parse(self, data: bytes, path: str) -> dict[str, Any] | None:
        try:
            request = orjson.loads(data) if data.strip() else {}
        except orjson.JSONDecodeError:
            self.failures.report("json", f"ignoring {path}: not JSON")
            return None
        problem = _request_problem(request)
        if problem is not None:
            self.failures.report("invalid", f"ignoring {path}: {problem}")
            if isinstance(request, dict) and _valid_id(request.get("id")):
                self._request_id = request["id"]
                self._answer({"error": f"invalid request: {problem}"})
            return None
        return request


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) and REQUEST_ID_RE.fullmatch(value) is not None


def _request_problem(request: Any) -> str | None:
    """What is wrong with a decoded request, or None (fields: id, seconds, steps)."""
    if not isinstance(request, dict):
        return "a request must be a JSON object"
    if "id" in request and not _valid_id(request["id"]):
        return "id must be 1-32 lowercase hex digits"
    seconds, steps = request.get("seconds"), request.get("steps")
    if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, (int, float))
                                or not math.isfinite(seconds) or not 0 < seconds <= MAX_SECONDS):
        return f"seconds must be a number in (0, {MAX_SECONDS:.0f}]"
    if steps is not None and (type(steps) is not int or not 1 <= steps <= MAX_STEPS):
        return f"steps must be an integer in [1, {MAX_STEPS}]"
    return None


_auto: OnDemandController | None = None


def start_from_env() -> OnDemandController | None:
    """Start on-demand mode when CUVIL_PGC_ON_DEMAND=1 (``import cuvil_pgc`` calls it then)."""
    global _auto
    if _auto is None and on_demand_requested():
        try:
            _auto = OnDemandController().start()
        except Exception as exc:
            log.warning("cuvil-pgc: on-demand mode could not start: %s", exc)
    return _auto
