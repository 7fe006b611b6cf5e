"""Capture what native code writes to the process's stderr (fd 2) while a candidate first runs.

AOTInductor's runtime reports a failing kernel call on stderr from C++ (e.g.
``aoti_torch_cpu_mkldnn_rnn_layer(...) API call failed at ...wrapper.cpp``) and then raises. The
search rejects such a candidate and records why; the native message belongs in that reason, not
in the user's terminal. Offline code only: fd 2 is redirected for the whole process meanwhile.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator


class Captured:
    text = ""


@contextlib.contextmanager
def native_stderr(captured: Captured | None = None) -> Iterator[Captured]:
    """Redirect fd 2 into a temporary file; afterwards ``captured.text`` (given or new) holds what
    was written, also when the block raised."""
    captured = Captured() if captured is None else captured
    with tempfile.TemporaryFile() as sink:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(sink.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            captured.text = sink.read().decode("utf-8", "replace")


#: a line that only says where native code raised (OpenVINO's ``Exception from src/inference/src/
#: cpp/core.cpp:117:``, its ``Check '...' failed at src/...:42:``): the message is on a later line
_LOCATION_ONLY = re.compile(r"^(Exception from \S+:\d+:|Check '.*' failed at \S+:\d+:)$")


def first_line(text: str, limit: int = 300) -> str:
    """The first non-empty line of ``text`` that is more than a native source location, cut to
    ``limit`` characters (the first non-empty line where every line is one)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    line = next((ln for ln in lines if not _LOCATION_ONLY.match(ln)), lines[0] if lines else "")
    return line if len(line) <= limit else line[: limit - 3] + "..."


def exception_line(exc: BaseException, limit: int = 300) -> str:
    """``RuntimeError: <its first line>``: an exception as a reason names it."""
    return f"{type(exc).__name__}: {first_line(str(exc), limit)}"
