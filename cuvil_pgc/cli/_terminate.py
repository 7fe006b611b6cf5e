"""SIGTERM ends a long offline command the way Ctrl-C does: through Python.

Left to its default, SIGTERM (``timeout``, a CI job's cancel, ``kill``) ends the process at once, and
what the search had recorded as started (``recompile.records.STARTED``) would look to the next
search like a candidate whose native fault ended the process: it would be left out for good. Raised
as :class:`SystemExit` instead, the search marks it unfinished on the way out and the next search
measures it again. A process stuck in native code takes the signal when the call returns; one that
never returns is for SIGKILL, and then the started record is right.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator


@contextlib.contextmanager
def terminated_as_exit() -> Iterator[None]:
    """Meanwhile SIGTERM raises ``SystemExit(143)`` in the main thread; the previous handler is put
    back after. Elsewhere than the main thread (where Python cannot set handlers) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.getsignal(signal.SIGTERM)

    def raise_exit(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, raise_exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
