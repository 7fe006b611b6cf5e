"""Keep third-party output of long offline work (candidate builds) off the terminal.

While ``recompile`` or the demo builds candidates, Inductor prints AUTOTUNE blocks, torch
internals raise FutureWarnings and AOTInductor's C++ runtime writes ``... API call failed`` on
fd 2. :func:`third_party_output` sends all of it (fd 1 and 2, ``sys.stdout``/``sys.stderr``,
Python warnings from outside cuvil_pgc) into a log file next to the build, and gives the command
a stream on the real terminal for its own progress and warnings (``cuvil_pgc`` log records and
warnings raised by cuvil_pgc code still reach the terminal, each message once). ``verbose=True``
captures nothing: everything streams as it comes.

Offline code only: the file descriptors of the whole process are redirected meanwhile.
:func:`kineto_chatter` is the narrow one for recording: around enabling and disabling
torch.profiler only, it drops Kineto's routine ``USDT:``/``STAGE:``/``INFO:`` lines and passes the rest on.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import re
import shutil
import sys
import tempfile
import textwrap
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO, Any

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))   # this module sits at the package root


@dataclass
class Captured:
    """Where the output went: ``log_path`` (None when streaming) and the terminal stream."""

    log_path: str | None
    terminal: IO[str]

    def lines(self) -> int:
        """Lines written to the log so far (0 when nothing was captured)."""
        if self.log_path is None or not os.path.exists(self.log_path):
            return 0
        with open(self.log_path, "rb") as f:
            return sum(1 for _ in f)

    def summary(self) -> str | None:
        """The line to print at the end (None when nothing third-party was written)."""
        n = self.lines()
        if not n:
            return None
        return f"third-party output of the candidate builds ({n} lines): {self.log_path} (--verbose streams it)"


class _OnceHandler(logging.Handler):
    """cuvil_pgc's own log records on the terminal, each message once."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(logging.WARNING)
        self.stream, self.seen = stream, set()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message in self.seen:
            return
        self.seen.add(message)
        try:
            prefixed = message.startswith(("cuvil-pgc", "warning:"))
            line = ("" if prefixed else "warning: ") + message
            # at words, to the terminal's width ($COLUMNS, else 80 when piped), as the CLI's notes
            width = shutil.get_terminal_size((80, 24)).columns
            self.stream.write(textwrap.fill(line, width, break_long_words=False, break_on_hyphens=False) + "\n")
            self.stream.flush()
        except Exception:
            pass


@contextlib.contextmanager
def third_party_output(log_path: str, *, verbose: bool = False) -> Iterator[Captured]:
    """Capture everything written meanwhile into ``log_path`` (appended); see the module docstring."""
    if verbose:
        yield Captured(None, sys.stderr)
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    terminal, opened = _terminal_stream()
    traced = _trace_faults(terminal)
    log = open(log_path, "a", buffering=1, encoding="utf-8", errors="replace")  # noqa: SIM115
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    old_streams = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = log
    logger = logging.getLogger("cuvil_pgc")
    handler, propagate = _OnceHandler(terminal), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_warning(terminal, log)
            yield Captured(log_path, terminal)
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate
        for stream in (log, terminal):
            with contextlib.suppress(Exception):
                stream.flush()
        sys.stdout, sys.stderr = old_streams
        _untrace_faults(*traced)
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)
        log.close()
        if opened:
            terminal.close()
        if os.path.exists(log_path) and os.path.getsize(log_path) == 0:
            os.unlink(log_path)


def log_path_for(build_path: str) -> str:
    """``out/model.cuvilpkg`` -> ``out/model.build.log`` (the log sits next to the build)."""
    stem, ext = os.path.splitext(build_path)
    return (stem if ext else build_path) + ".build.log"


def _trace_faults(terminal: IO[str]) -> tuple[bool, bool]:
    """Where a native fault ends the process meanwhile (a runtime's compiler dying with SIGSEGV or
    SIGFPE), print the Python stack it happened in on the terminal (:mod:`faulthandler`): the
    runtime's own words are in the log, and the shell says only "Segmentation fault". Returns
    (whether it was enabled before, whether this enabled it)."""
    was = faulthandler.is_enabled()
    try:
        faulthandler.enable(file=terminal)
    except (AttributeError, OSError, ValueError):    # no file descriptor (a test runner's stream)
        return was, False
    return was, True


def _untrace_faults(was: bool, enabled: bool) -> None:
    if not enabled:
        return
    faulthandler.disable()          # before the terminal stream it writes to is closed
    if was:
        with contextlib.suppress(AttributeError, OSError, ValueError):
            faulthandler.enable(file=sys.stderr)


def _terminal_stream() -> tuple[IO[str], bool]:
    """A stream that still reaches the terminal once fd 2 is redirected, and whether we opened it
    (sys.stderr itself when it is not a file descriptor's stream, as under a test runner)."""
    try:
        fd = sys.stderr.fileno()
    except Exception:
        return sys.stderr, False
    return os.fdopen(os.dup(fd), "w", buffering=1, encoding="utf-8", errors="replace"), True


def _show_warning(terminal: IO[str], log: IO[str]) -> Any:
    """``warnings.showwarning``: cuvil_pgc's own warnings on the terminal (once), the rest in the log."""
    seen: set[str] = set()

    def show(message: Any, category: type, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        text = warnings.formatwarning(message, category, filename, lineno, line)
        if os.path.abspath(filename).startswith(_PACKAGE_DIR):
            if str(message) not in seen:
                seen.add(str(message))
                terminal.write(f"warning: {message}\n")
            return
        log.write(text)
    return show


# Kineto's routine log lines: ``USDT:2026-12-02 00:42:31 31309:31309 SyncActivityProfilerHandler.cpp:52]
# profiler_start``. Their level (USDT) is above anything KINETO_LOG_LEVEL filters, so they are caught.
_KINETO_ROUTINE = re.compile(rb"^(USDT|STAGE|INFO):\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \d+:\d+ \S+\.cpp:\d+\] ")


@contextlib.contextmanager
def kineto_chatter() -> Iterator[None]:
    """Keep Kineto's routine log lines (``USDT: ... profiler_start``) off the terminal while the
    block runs (enabling or disabling torch.profiler): fd 2 goes to a temporary file meanwhile, and
    every other line written there is passed on to ``sys.stderr`` afterwards. Never raises of its
    own: when fd 2 cannot be redirected the block runs as is."""
    try:
        with contextlib.suppress(Exception):
            sys.stderr.flush()
        held = tempfile.TemporaryFile()   # noqa: SIM115
        saved = os.dup(2)
        os.dup2(held.fileno(), 2)
    except Exception:
        yield
        return
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        with contextlib.suppress(Exception):
            held.seek(0)
            other = [line for line in held.read().splitlines(keepends=True) if not _KINETO_ROUTINE.match(line)]
            if other:
                sys.stderr.write(b"".join(other).decode("utf-8", "replace"))
                sys.stderr.flush()
        held.close()
