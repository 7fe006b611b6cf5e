"""Durable file writes: trace files, summaries, builds and the build store all go through here."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
#: Environment variable: permission bits of trace files, octal (default 600: only the owner reads them).
ENV_TRACE_MODE = "CUVIL_PGC_TRACE_MODE"
DEFAULT_TRACE_MODE = 0o600


def trace_file_mode() -> int:
    """Permission bits for new trace files: $CUVIL_PGC_TRACE_MODE (e.g. ``644``) or 0600."""
    text = os.environ.get(ENV_TRACE_MODE, "").strip()
    try:
        mode = int(text, 8) if text else DEFAULT_TRACE_MODE
    except ValueError:
        mode = -1
    return mode if 0 <= mode <= 0o777 else DEFAULT_TRACE_MODE


def create_private(path: str) -> int:
    """Create ``path`` exclusively (never through a symbolic link) with :func:`trace_file_mode`; returns the fd."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                   trace_file_mode())


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Make a rename in ``directory`` durable (best effort: some network filesystems cannot)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o666) -> None:
    """Replace ``path`` with ``data``: readers see the old file or the new one, never a mix.

    ``mode`` (less the umask) is the new file's permission bits: 0o600 keeps it private."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    try:
        with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode), "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
