"""A partial trace found where a session is about to write: whose it is, and moving a dead one aside.

A session streams into ``<path>.partial`` and renames it when it finishes; a crash (SIGKILL,
OOM kill, power loss) leaves it behind, and a production service must restart all the same.

Contract (``make_room(partial_path)``, called by the writer before it creates the partial):
- nothing there: returns None.
- stale: its writer is gone. The header (the first line) names this host and a pid that no
  longer runs (or is a zombie, or is this very process, whose earlier session gave it up), or
  the file has not changed for :data:`STALE_AFTER_S` while a live writer touches it every flush
  interval (at most 1 s) even with nothing to write. It is renamed, never deleted, to
  ``<stem>.crashed-<pid><suffix>.partial`` (``.crashed-<pid>.<n>`` if taken), where
  ``load_trace`` and ``cuvil-pgc summary`` recover it; returns a :class:`Leftover` saying so.
- live: another process writes it now; returns a Leftover with ``live=True`` and nothing moved.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
import zlib

from cuvil_pgc.trace.schema import PARTIAL_SUFFIX, split_trace_path

STALE_AFTER_S = 60.0
"""A partial not modified for this long has no live writer (writers touch it every <= 1 s)."""
_HEAD_BYTES = 1 << 16


@dataclasses.dataclass(frozen=True)
class Leftover:
    """What was found at a partial path, and what was done with it."""

    partial: str
    pid: int | None           # the writer named by its header (None: unreadable header)
    host: str | None
    live: bool
    reason: str               # why it is stale or live, in words
    moved_to: str | None = None


def make_room(partial: str) -> Leftover | None:
    """See the module docstring."""
    try:
        st = os.stat(partial)
    except FileNotFoundError:
        return None
    pid, host = _writer_of(partial)
    live, reason = _is_live(pid, host, time.time() - st.st_mtime)
    found = Leftover(partial=partial, pid=pid, host=host, live=live, reason=reason)
    if live:
        return found
    return dataclasses.replace(found, moved_to=_move_aside(partial, pid))


def _writer_of(partial: str) -> tuple[int | None, str | None]:
    """(pid, host) from the partial's header line, or (None, None) when it cannot be read."""
    try:
        with open(partial, "rb") as fh:
            head = fh.read(_HEAD_BYTES)
        if head[:2] == b"\x1f\x8b":
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, _HEAD_BYTES)
        line = head.split(b"\n", 2)[1].rstrip(b",")
        header = json.loads(line)["args"]
        pid, host = header.get("pid"), header.get("host")
        return (pid if type(pid) is int and pid > 0 else None), (host if isinstance(host, str) else None)
    except (OSError, ValueError, IndexError, KeyError, TypeError, AttributeError, zlib.error):
        return None, None


def _is_live(pid: int | None, host: str | None, idle_s: float) -> tuple[bool, str]:
    if pid is not None and host == socket.gethostname():
        if pid == os.getpid():
            return False, f"it was left by an earlier session of this process ({pid})"
        if not _running(pid):
            return False, f"process {pid}, which wrote it, is gone"
    if idle_s >= STALE_AFTER_S:
        return False, f"it has not changed for {idle_s:.0f} s (a live writer touches it every second)"
    who = f"process {pid} on {host}" if pid is not None else "another process"
    return True, f"{who} is writing it (changed {idle_s:.1f} s ago)"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:       # another user's live process
        return True
    except OSError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:      # a zombie (killed, not yet reaped) is gone
            return fh.read().rsplit(b")", 1)[-1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def _move_aside(partial: str, pid: int | None) -> str | None:
    """The new name of ``partial`` (None if another process moved it first)."""
    stem, suffix = split_trace_path(partial[: -len(PARTIAL_SUFFIX)])
    tag = f"crashed-{pid}" if pid is not None else f"crashed-{time.strftime('%Y%m%dT%H%M%S')}"
    for n in range(1000):
        target = f"{stem}.{tag}{'' if n == 0 else f'.{n}'}{suffix}{PARTIAL_SUFFIX}"
        try:
            os.link(partial, target)          # never replaces a file already there
        except FileExistsError:
            continue
        except FileNotFoundError:             # another process starting now moved it first
            return None
        except OSError:                       # no hard links here (some filesystems): rename
            if os.path.exists(target):
                continue
            os.rename(partial, target)
            return target
        try:
            os.unlink(partial)
        except FileNotFoundError:
            pass
        return target
    raise FileExistsError(f"no free name to move {partial} aside")
