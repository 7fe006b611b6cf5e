"""cuvil-pgc's cache directory: where it is, what it holds, and a size bound.

``$CUVIL_CACHE_DIR``, else ``$XDG_CACHE_HOME/cuvil-pgc``, else ``~/.cache/cuvil-pgc``. It holds

- ``machine-*.json``: calibrated machine models (``cuvil-pgc calibrate``; a few kB each),
- ``records/``: measurements of earlier searches (the knowledge a second recompile reuses),
- ``artifacts/``: AOTInductor packages of measured candidates (megabytes each; rebuilt on a miss),
- ``loaded/``: builds unpacked here by older versions of ``load_build``
  (load_build now unpacks into a private temporary directory and removes it once loaded).

The regenerable kinds (``artifacts``, ``loaded``) are bounded: :func:`enforce_limit` removes the
least recently used entries until the total is at most ``$CUVIL_CACHE_MAX`` (default
:data:`DEFAULT_MAX`; ``500M``, ``2G``, plain bytes, or ``0`` for no bound). Calibrations and records
are never evicted, only cleared on request (``cuvil-pgc cache clear``).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from cuvil_pgc.errors import ConfigError

CACHE_DIR_ENV = "CUVIL_CACHE_DIR"
CACHE_MAX_ENV = "CUVIL_CACHE_MAX"
DEFAULT_MAX = 2 * 1024**3          # 2 GiB of artifacts and unpacked builds
KINDS = ("machine", "records", "artifacts", "loaded", "other")
EVICTABLE = ("artifacts", "loaded")
_UNITS = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}


def cache_dir() -> Path:
    """The cache directory (see the module docstring). Raises ConfigError when it exists but
    another user could write into it (see :func:`not_private`): what it holds steers what
    ``recompile`` builds and signs, and what the analyzer assumes of the machine."""
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        path = Path(explicit).expanduser()
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        path = Path(base) / "cuvil-pgc"
    why = not_private(path)
    if why is not None:
        raise ConfigError(f"the cache directory {path} {why}: another user could plant the artifacts, records and "
                          "calibrations cuvil-pgc would use", fix=f"set {CACHE_DIR_ENV} to a directory only you can "
                          "write (mkdir -m 700 DIR), or fix the owner and mode of this one")
    return path


def not_private(path: Path) -> str | None:
    """Why the directory ``path`` (followed if a link) is open to other users, or None when it is
    this user's and only this user (or this user's own group) can write it, or does not exist."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be checked ({type(exc).__name__}: {exc})"
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != os.geteuid():
        return f"belongs to another user (uid {st.st_uid}, this process runs as uid {os.geteuid()})"
    if st.st_mode & stat.S_IWOTH:
        return f"is writable by every user (mode {stat.S_IMODE(st.st_mode):o})"
    if st.st_mode & stat.S_IWGRP and st.st_gid != os.getegid():
        return f"is writable by the group {st.st_gid} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


@dataclass
class Entry:
    """One removable unit: a file, or a directory of ``loaded``."""

    kind: str
    path: Path
    bytes: int
    used: float        # last use (the later of access and modification time)


@dataclass
class KindUsage:
    kind: str
    entries: int
    bytes: int
    oldest: float | None
    newest: float | None


def parse_size(text: str, name: str = CACHE_MAX_ENV) -> int:
    """``500M`` / ``2G`` / ``123`` -> bytes (powers of 1024)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise ConfigError(f"{name}={text!r} is not a size", fix="write e.g. 500M, 2G or a number of bytes")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def duration_seconds(text: str, units: str = "smhdw", bare: bool = False) -> float | None:
    """``45m`` -> 2700.0: a number and one of ``units`` (seconds, minutes, hours, days, weeks), or
    where ``bare`` a number alone, in seconds; None when ``text`` is not such a duration."""
    m = re.fullmatch(rf"\s*(\d+(?:\.\d+)?)\s*([{units}]{'?' if bare else ''})\s*", text.lower())
    return float(m.group(1)) * _SECONDS[m.group(2) or "s"] if m else None


def parse_age(text: str) -> float:
    """``30d`` / ``12h`` / ``45m`` / ``90s`` -> seconds."""
    seconds = duration_seconds(text)
    if seconds is None:
        raise ConfigError(f"--older-than {text!r} is not an age", fix="write e.g. 30d, 12h or 45m")
    return seconds


def max_bytes() -> int:
    """The bound on the evictable kinds: ``$CUVIL_CACHE_MAX`` or :data:`DEFAULT_MAX` (0: none)."""
    text = os.environ.get(CACHE_MAX_ENV)
    return DEFAULT_MAX if not text else parse_size(text)


def entries(root: Path | None = None) -> list[Entry]:
    """Everything in the cache, as removable entries."""
    root = cache_dir() if root is None else root
    if not root.is_dir():
        return []
    out = []
    for child in sorted(root.iterdir()):
        if child.is_dir() and child.name in ("records", "artifacts", "loaded"):
            units = sorted(child.iterdir()) if child.name != "records" else [child]
            out += [_entry(child.name, unit) for unit in units]
        else:
            out.append(_entry("machine" if child.name.startswith("machine-") else "other", child))
    return out


def usage(root: Path | None = None) -> list[KindUsage]:
    """Size and age of each kind (kinds with nothing in them included)."""
    found = entries(root)
    out = []
    for kind in KINDS:
        mine = [e for e in found if e.kind == kind]
        used = [e.used for e in mine]
        out.append(KindUsage(kind, len(mine), sum(e.bytes for e in mine), min(used, default=None),
                             max(used, default=None)))
    return out


def clear(*, older_than_s: float | None = None, kinds: tuple[str, ...] = KINDS,
          root: Path | None = None, now: float | None = None) -> tuple[int, int]:
    """Remove entries of ``kinds`` (unused for ``older_than_s`` if given); returns (entries, bytes)."""
    now = time.time() if now is None else now
    gone = [e for e in entries(root) if e.kind in kinds and (older_than_s is None or now - e.used > older_than_s)]
    for e in gone:
        _remove(e.path)
    return len(gone), sum(e.bytes for e in gone)


def enforce_limit(limit: int | None = None, root: Path | None = None) -> tuple[int, int]:
    """Evict the least recently used artifacts and unpacked builds until they fit ``limit``
    (default :func:`max_bytes`); returns (entries, bytes) removed. Never raises."""
    try:
        limit = max_bytes() if limit is None else limit
        if limit <= 0:
            return 0, 0
        evictable = sorted((e for e in entries(root) if e.kind in EVICTABLE), key=lambda e: e.used)
        total = sum(e.bytes for e in evictable)
        removed = freed = 0
        for e in evictable:
            if total <= limit:
                break
            _remove(e.path)
            total -= e.bytes
            removed, freed = removed + 1, freed + e.bytes
        return removed, freed
    except (OSError, ConfigError):
        return 0, 0


def touch(path: str | os.PathLike[str]) -> None:
    """Mark a cache entry as used now (LRU order); never raises."""
    try:
        os.utime(path)
    except OSError:
        pass


def _entry(kind: str, path: Path) -> Entry:
    if path.is_dir():
        files = [p for p in path.rglob("*") if p.is_file()]
        stats = [p.stat() for p in files] or [path.stat()]
        return Entry(kind, path, sum(s.st_size for s in stats) if files else 0,
                     max(max(s.st_atime, s.st_mtime) for s in stats))
    st = path.stat()
    return Entry(kind, path, st.st_size, max(st.st_atime, st.st_mtime))


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
