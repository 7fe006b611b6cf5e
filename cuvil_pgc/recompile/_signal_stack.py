"""Keep the calling thread's alternate signal stack across a call that replaces it.

OpenVINO's CPU plugin, when a ``Core`` loads it (``compile_model``, ``get_property``), installs an
alternate signal stack of its own on the calling thread and frees it when the plugin goes. Dropped
on another thread (a build replaced by a worker thread, a garbage collection there), it left the
loading thread's alternate stack pointing at freed memory, and the next signal that thread took on
that stack (Python runs every handler of ``signal.signal`` there: SIGTERM, SIGINT, the on-demand
capture's SIGUSR2) killed the process with SIGSEGV: the kernel could not write the signal's frame.
Measured: a process with ``faulthandler`` enabled, an OpenVINO region made on the main thread and
dropped on another, then ``os.kill(own pid, SIGUSR1)`` with a Python handler: exit 139.

:func:`kept_signal_stack` puts the thread's own alternate stack (or none) back when the call
returns. Linux and macOS (``sigaltstack`` through ctypes); elsewhere, or when libc cannot be
reached, it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
from collections.abc import Iterator
from typing import Any


class _Stack(ctypes.Structure):       # stack_t
    _fields_ = [("ss_sp", ctypes.c_void_p), ("ss_flags", ctypes.c_int), ("ss_size", ctypes.c_size_t)]


def _sigaltstack() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        return libc.sigaltstack
    except (OSError, AttributeError):
        return None


_SIGALTSTACK = _sigaltstack()


def current_signal_stack() -> tuple[int, int, int] | None:
    """(address, flags, size) of the calling thread's alternate signal stack; None where unknown."""
    if _SIGALTSTACK is None:
        return None
    now = _Stack()
    if _SIGALTSTACK(None, ctypes.byref(now)) != 0:
        return None
    return now.ss_sp or 0, now.ss_flags, now.ss_size


@contextlib.contextmanager
def kept_signal_stack() -> Iterator[None]:
    """Run the body, then give the calling thread back the alternate signal stack it had."""
    saved = _Stack()
    if _SIGALTSTACK is None or _SIGALTSTACK(None, ctypes.byref(saved)) != 0:
        yield
        return
    try:
        yield
    finally:
        _SIGALTSTACK(ctypes.byref(saved), None)    # fails harmlessly (EPERM) only while on that stack
