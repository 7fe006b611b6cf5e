"""Scheduled capture windows: one trace file per active window of a schedule.

``profile("run.trace.json", schedule=schedule(wait=5, warmup=1, active=3), on_trace_ready=cb)``
returns a :class:`ScheduledSession`; the user calls ``session.step()`` at the end of each step.
Each window is an ordinary :class:`~cuvil_pgc.instrument.session.Session` writing
``run.<window>.trace.json``: warm-up steps start its samplers without keeping anything; recording
starts with the first active step; the window is finished at the end of its last active step and
handed to ``on_trace_ready(path)``. Retention keeps at most ``max_files`` window files and
``max_bytes`` bytes of them, removing the oldest first and never the file just written.
"""

from __future__ import annotations

import dataclasses
import glob
import logging
import os
import re
from collections.abc import Callable
from typing import Any

from cuvil_pgc.errors import ConfigError
from cuvil_pgc.instrument.config import SessionConfig
from cuvil_pgc.instrument.schedule import Action, Schedule
from cuvil_pgc.instrument.session import Session
from cuvil_pgc.trace.schema import split_trace_path

log = logging.getLogger("cuvil_pgc")


class ScheduledSession:
    """A schedule of capture windows; ``step()`` advances it (see module docstring)."""

    def __init__(self, config: SessionConfig, schedule: Schedule,
                 on_trace_ready: Callable[[str], Any] | None = None, max_files: int | None = None,
                 max_bytes: int | None = None, otel_exporter: Any = None) -> None:
        if max_files is not None and max_files < 1:
            raise ConfigError(f"max_files={max_files} must be >= 1")
        if max_bytes is not None and max_bytes < 1:
            raise ConfigError(f"max_bytes={max_bytes} must be >= 1")
        self.config = config
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.max_files = max_files
        self.max_bytes = max_bytes
        self.step_num = 0
        self.paths: list[str] = []          # window files written, in order
        self.removed: list[str] = []        # window files removed by retention
        self._otel_exporter = otel_exporter
        self._stem, self._suffix = split_trace_path(config.path)
        self._window: Session | None = None
        self._window_index = 0
        self._action = Action.NONE

    def start(self) -> ScheduledSession:
        self._apply(self.schedule(0))
        return self

    def step(self) -> None:
        """End of one step of the user's loop: close, open or advance windows as scheduled."""
        finished = self._action is Action.RECORD_AND_SAVE
        self.step_num += 1
        if finished:
            self._close_window()
        self._apply(self.schedule(self.step_num))

    def stop(self) -> None:
        """Finish a window still open (it is written with what it holds)."""
        if self._window is not None:
            self._close_window()
        self._action = Action.NONE

    def __enter__(self) -> ScheduledSession:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def window_path(self, index: int) -> str:
        return f"{self._stem}.{index}{self._suffix or '.trace.json'}"

    def _apply(self, action: Action) -> None:
        self._action = action
        if action is Action.NONE:
            if self._window is not None:     # a schedule never does this; finish rather than lose
                self._close_window()
            return
        recording = action in (Action.RECORD, Action.RECORD_AND_SAVE)
        if self._window is None:
            config = dataclasses.replace(self.config, path=self.window_path(self._window_index))
            self._window = Session(config, otel_exporter=self._otel_exporter).start(record_regions=recording)
        elif recording:
            self._window.begin_recording()

    def _close_window(self) -> None:
        window, self._window = self._window, None
        self._window_index += 1
        path = window.stop()
        if path is None:
            return
        self.paths.append(path)
        self._enforce_retention(path)
        if self.on_trace_ready is not None:
            try:
                self.on_trace_ready(path)
            except Exception as exc:   # the callback is the user's; never let it stop the loop
                log.warning("cuvil-pgc: on_trace_ready(%s) raised %s: %s", path, type(exc).__name__, exc)

    def _enforce_retention(self, newest: str) -> None:
        if self.max_files is None and self.max_bytes is None:
            return
        files = _window_files(self._stem, self._suffix or ".trace.json")
        sizes = {f: _size(f) for f in files}
        total = sum(sizes.values())
        for path in files:      # oldest first
            too_many = self.max_files is not None and len(files) > self.max_files
            too_big = self.max_bytes is not None and total > self.max_bytes
            if not (too_many or too_big) or os.path.abspath(path) == os.path.abspath(newest):
                break
            try:
                os.remove(path)
            except OSError as exc:
                log.warning("cuvil-pgc: retention could not remove %s: %s", path, exc)
                continue
            self.removed.append(path)
            files = [f for f in files if f != path]
            total -= sizes[path]


def _window_files(stem: str, suffix: str) -> list[str]:
    """Finished window files of this stem, oldest window first."""
    pattern = re.compile(re.escape(os.path.basename(stem)) + r"\.(\d+)" + re.escape(suffix) + "$")
    found = []
    for path in glob.glob(glob.escape(stem) + ".*" + suffix):
        m = pattern.match(os.path.basename(path))
        if m:
            found.append((int(m.group(1)), path))
    return [p for _, p in sorted(found)]


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
