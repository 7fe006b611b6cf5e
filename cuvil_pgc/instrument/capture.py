"""The requesting side of on-demand capture (``cuvil-pgc capture --pid PID``).

It finds the process's private control directory (instrument._control), writes a request file
there (0600, atomically, so the process never reads half of it) and waits for the answer file
naming the window's trace. The answer is believed only when it is a regular file owned by the
process's user (or root) in that directory, and names a window trace of that process in that
directory owned by that user; anything else is refused. It never sends a signal: a process not
running in on-demand mode would be killed by SIGUSR2's default action.

Who may ask: the process's own user, or root. Root asking for another user's process finds that
process's control directory from its environment (``/proc/PID/environ``) unless ``--dir`` says.
"""

from __future__ import annotations

import os
import re
import stat
import time
import uuid

import orjson

from cuvil_pgc.errors import ConfigError, CuvilError
from cuvil_pgc.instrument import _control
from cuvil_pgc.instrument._control import ENV_CONTROL_DIR, Rejected
from cuvil_pgc.instrument.on_demand import MAX_SECONDS, done_path, request_path


def request_capture(pid: int, seconds: float = 10.0, steps: int | None = None, directory: str | None = None,
                    timeout: float = 60.0) -> str:
    """Request a window from process ``pid`` and return the path of its trace."""
    if not 0 < seconds <= MAX_SECONDS or (steps is not None and steps < 1):
        raise ConfigError(f"--seconds must be in (0, {MAX_SECONDS:.0f}] and --steps >= 1")
    if pid < 1:
        raise ConfigError(f"--pid must be a process id (a positive integer), got {pid}")
    owner = process_owner(pid)
    directory = _checked_directory(pid, owner, directory)
    request_id = uuid.uuid4().hex[:12]
    target = request_path(pid, directory)
    _control.write_control_file(target, orjson.dumps({"id": request_id, "seconds": seconds, "steps": steps}),
                                owner=owner)
    answer = done_path(pid, request_id, directory)
    wait_s = (0 if steps else seconds) + timeout
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        doc = _read_answer(answer, owner)
        if doc is not None:
            return _trace_of(doc, pid, owner, directory, answer)
        time.sleep(0.05)
    try:
        os.remove(target)
    except FileNotFoundError:
        pass
    raise CuvilError(f"process {pid} did not answer within {wait_s:.1f} s", path=target,
                     fix=f"start it with CUVIL_PGC_ON_DEMAND=1 and the same control directory {directory} "
                         f"({ENV_CONTROL_DIR})")


def process_owner(pid: int) -> int:
    """The uid a process runs as (CuvilError when there is no such process)."""
    if os.path.isdir("/proc/self"):
        try:
            return os.stat(f"/proc/{pid}").st_uid
        except FileNotFoundError:
            raise CuvilError(f"no process with pid {pid}", fix="check the pid (ps, pgrep)") from None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        raise CuvilError(f"no process with pid {pid}", fix="check the pid (ps, pgrep)") from None
    except PermissionError:
        pass
    return os.geteuid()     # no /proc here: the owner checks of the control files still decide


def _checked_directory(pid: int, owner: int, directory: str | None) -> str:
    me = os.geteuid()
    if owner != me and me != 0:
        name = _control.user_name(owner)
        raise CuvilError(f"process {pid} runs as {name} (uid {owner}), and you are {_control.user_name(me)} "
                         f"(uid {me}): only {name} or root may open a capture window in it",
                         fix=f"run `sudo -u {name} cuvil-pgc capture --pid {pid}` (or the same as root)")
    if directory is None:
        directory = _control.default_control_dir() if owner == me else _directory_of(pid, owner)
    if not os.path.isdir(directory):
        raise CuvilError(f"process {pid} has no control directory here", path=directory,
                         fix="it is not in on-demand mode (CUVIL_PGC_ON_DEMAND=1), or it uses another "
                             f"{ENV_CONTROL_DIR}: pass that directory with --dir")
    return _control.check_private_dir(directory, owner)


def _directory_of(pid: int, owner: int) -> str:
    """Root asking for another user's process: its control directory, from its environment."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read(1 << 20)
    except OSError as exc:
        raise CuvilError(f"cannot read the environment of process {pid} to find its control directory "
                         f"({exc.strerror or exc})",
                         fix=f"pass --dir DIR: its {ENV_CONTROL_DIR}, or $XDG_RUNTIME_DIR/cuvil-pgc of its "
                             "user") from None
    env = dict(item.decode("utf-8", "replace").partition("=")[::2] for item in raw.split(b"\0") if b"=" in item)
    return _control.default_control_dir(env, owner)


def _read_answer(path: str, owner: int) -> dict | None:
    try:
        data = _control.read_control_file(path, {owner, 0})
    except Rejected as exc:
        raise CuvilError(f"refusing the answer file: {exc}", path=path,
                         fix="someone else wrote it; check who can write the control directory") from None
    if data is None:
        return None
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise CuvilError("the answer file is not JSON", path=path) from None
    os.remove(path)
    if not isinstance(doc, dict):
        raise CuvilError("the answer file is not a JSON object", path=path)
    return doc


def _trace_of(doc: dict, pid: int, owner: int, directory: str, answer: str) -> str:
    trace = doc.get("trace")
    if not trace:
        error = doc.get("error")
        raise CuvilError(f"process {pid} could not write its capture window"
                         + (f": {error}" if isinstance(error, str) else ""), fix="see its log")
    expected = re.compile(rf"cuvil-pgc-{pid}\.\d+\.trace\.json(\.gz)?")
    ok = isinstance(trace, str) and os.path.dirname(os.path.abspath(trace)) == os.path.abspath(directory) \
        and expected.fullmatch(os.path.basename(trace)) is not None
    if ok:
        try:
            st = os.lstat(trace)
            ok = stat.S_ISREG(st.st_mode) and st.st_uid == owner
        except OSError:
            ok = False
    if not ok:
        raise CuvilError(f"the answer names {str(trace)[:200]!r}, which is not a capture window of process {pid} "
                         f"in {directory}: refusing it", path=answer)
    return trace
