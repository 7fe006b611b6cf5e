"""The requesting side of on-demand capture (``cuvil-pgc capture --pid PID``).

It writes a request file for the process (atomically, so the process never reads half of it)
and waits for the answer file naming the window's trace. It never sends a signal: a process not
running in on-demand mode would be killed by SIGUSR2's default action.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import orjson

from cuvil_pgc._fsutil import write_atomic
from cuvil_pgc.errors import ConfigError, CuvilError
from cuvil_pgc.instrument.on_demand import control_dir, done_path, request_path


def request_capture(pid: int, seconds: float = 10.0, steps: int | None = None, directory: str | None = None,
                    timeout: float = 60.0) -> str:
    """Request a window from process ``pid`` and return the path of its trace."""
    if seconds <= 0 or (steps is not None and steps < 1):
        raise ConfigError("--seconds must be > 0 and --steps >= 1")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise CuvilError(f"no process with pid {pid}", fix="check the pid (ps, pgrep)") from None
    except PermissionError:
        pass   # it exists; the request file decides whether it listens
    directory = directory or control_dir()
    request_id = uuid.uuid4().hex[:12]
    target = request_path(pid, directory)
    write_atomic(Path(target), orjson.dumps({"id": request_id, "seconds": seconds, "steps": steps}))
    answer = done_path(pid, request_id, directory)
    wait_s = (0 if steps else seconds) + timeout
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if os.path.exists(answer):
            with open(answer, "rb") as f:
                doc = orjson.loads(f.read())
            os.remove(answer)
            if not doc.get("trace"):
                raise CuvilError(f"process {pid} could not write its capture window", fix="see its log")
            return doc["trace"]
        time.sleep(0.05)
    if os.path.exists(target):
        os.remove(target)
    raise CuvilError(f"process {pid} did not answer within {wait_s:.1f} s",
                     path=target, fix=f"start it with CUVIL_PGC_ON_DEMAND=1 and the same {directory} "
                     "(CUVIL_PGC_CONTROL_DIR)")
