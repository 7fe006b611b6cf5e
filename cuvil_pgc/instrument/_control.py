"""The on-demand control channel: a private directory and files nobody else can plant or forge.

A process in on-demand mode and ``cuvil-pgc capture`` talk through small files in a *control
directory*. Contract:

- **Where.** ``$CUVIL_PGC_CONTROL_DIR`` when set; else ``$XDG_RUNTIME_DIR/cuvil-pgc`` when the
  runtime directory exists and belongs to the user; else ``<cache>/control`` under the user's
  cache (``$CUVIL_CACHE_DIR``, ``$XDG_CACHE_HOME/cuvil-pgc`` or ``~/.cache/cuvil-pgc``). Never the
  shared temp directory.
- **The directory** is created 0700 and, before every use, must be a real directory (not a
  symbolic link) owned by the expected user and writable by nobody else (no group or other write
  bit): then no other user can create, replace or remove files in it.
- **Files** (requests, answers) are read with ``O_NOFOLLOW | O_NONBLOCK``, only when they are
  regular files of at most :data:`MAX_CONTROL_BYTES` owned by an accepted user (the expected
  user or root); anything else is rejected with a reason (:class:`Rejected`). They are written
  0600 through a temporary file and one rename.
- :class:`FailureLog` logs each distinct failure once and counts the repeats, so a file that
  keeps failing (one the server cannot delete) costs one log line, not ten a second.
"""

from __future__ import annotations

import errno
import logging
import os
import pwd
import secrets
import stat

from cuvil_pgc.errors import CuvilError

log = logging.getLogger("cuvil_pgc")

ENV_CONTROL_DIR = "CUVIL_PGC_CONTROL_DIR"
#: Largest request or answer file read (real ones are under 200 bytes).
MAX_CONTROL_BYTES = 4096
_OPEN_FLAGS = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0) \
    | getattr(os, "O_NOCTTY", 0)


class Rejected(Exception):
    """A control file that must not be trusted; ``key`` names the kind of problem (for FailureLog)."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def default_control_dir(env: os._Environ[str] | dict[str, str] | None = None, uid: int | None = None) -> str:
    """The control directory of a process with environment ``env`` running as ``uid`` (see module docstring)."""
    env = os.environ if env is None else env
    uid = os.geteuid() if uid is None else uid
    explicit = env.get(ENV_CONTROL_DIR)
    if explicit:
        return explicit
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        try:
            st = os.lstat(runtime)
        except OSError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode) and st.st_uid == uid:
            return os.path.join(runtime, "cuvil-pgc")
    cache = env.get("CUVIL_CACHE_DIR")
    if not cache:
        home = env.get("HOME") or _home_of(uid)
        cache = os.path.join(env.get("XDG_CACHE_HOME") or os.path.join(home, ".cache"), "cuvil-pgc")
    return os.path.join(os.path.expanduser(cache), "control")


def _home_of(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_dir
    except KeyError:
        return os.path.expanduser("~")


def check_private_dir(path: str, owner: int, *, create: bool = False) -> str:
    """Make sure ``path`` is a directory only ``owner`` can change (creating it 0700 if asked).

    Returns the absolute path; raises CuvilError naming what is wrong otherwise."""
    path = os.path.abspath(path)
    if create:
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as exc:
            raise CuvilError(f"cannot create the control directory: {exc.strerror or exc}", path=path,
                             fix=f"set {ENV_CONTROL_DIR} to a directory you own") from None
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise CuvilError("the control directory does not exist", path=path) from None
    if stat.S_ISLNK(st.st_mode):
        problem = "is a symbolic link"
    elif not stat.S_ISDIR(st.st_mode):
        problem = "is not a directory"
    elif st.st_uid != owner:
        problem = f"belongs to {user_name(st.st_uid)} (uid {st.st_uid}), not {user_name(owner)} (uid {owner})"
    elif st.st_mode & 0o022:
        problem = (f"has mode {stat.S_IMODE(st.st_mode):04o}: other users could plant or replace control "
                   "files in it")
    else:
        return path
    raise CuvilError(f"unsafe control directory: it {problem}", path=path,
                     fix=f"use a directory only its owner can write (mode 0700), e.g. unset {ENV_CONTROL_DIR} "
                         "for the per-user default")


def read_control_file(path: str, owners: set[int]) -> bytes | None:
    """The bytes of a trustworthy control file, None when there is none; Rejected otherwise."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Rejected("symlink", f"{path} is a symbolic link; control files must be plain files") from None
        raise Rejected(f"open-{exc.errno}", f"{path} cannot be opened: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Rejected("not-regular", f"{path} is not a regular file (a FIFO, device or directory)")
        if st.st_uid not in owners:
            raise Rejected("owner", f"{path} belongs to {user_name(st.st_uid)} (uid {st.st_uid}), who may not "
                                    "control this process")
        if st.st_size > MAX_CONTROL_BYTES:
            raise Rejected("size", f"{path} holds {st.st_size:,} bytes, more than the {MAX_CONTROL_BYTES:,} "
                                   "a control file may have")
        data = os.read(fd, MAX_CONTROL_BYTES + 1)
        if len(data) > MAX_CONTROL_BYTES:
            raise Rejected("size", f"{path} grew past {MAX_CONTROL_BYTES:,} bytes while being read")
        return data
    finally:
        os.close(fd)


def write_control_file(path: str, data: bytes, owner: int | None = None) -> None:
    """Replace ``path`` with ``data``, mode 0600, through a temporary file and one rename.

    ``owner`` (root writing for another user's process) hands the file to that user, so that the
    process can read it and knows it came from root or itself."""
    from cuvil_pgc._fsutil import fsync_dir

    tmp = temp_name(os.path.dirname(path), os.path.basename(path))
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if owner is not None and owner != os.geteuid():
                os.fchown(f.fileno(), owner, -1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    fsync_dir(os.path.dirname(path))


def file_identity(path: str) -> tuple[int, int, int, int] | None:
    """What tells one version of a directory entry from another (None when it is gone)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size


def temp_name(directory: str, stem: str) -> str:
    return os.path.join(directory, f".{stem}.{secrets.token_hex(4)}.tmp")


class FailureLog:
    """Logs each distinct failure once; later occurrences are only counted (``counts``)."""

    def __init__(self, prefix: str = "cuvil-pgc: on-demand") -> None:
        self.prefix = prefix
        self.counts: dict[str, int] = {}

    def report(self, key: str, message: str) -> None:
        n = self.counts.get(key, 0) + 1
        self.counts[key] = n
        if n == 1:
            log.warning("%s: %s (reported once; repeats are counted)", self.prefix, message)

    def summarize(self) -> None:
        """One line per failure that repeated (called when the controller stops)."""
        for key, n in self.counts.items():
            if n > 1:
                log.warning("%s: failure %r happened %d times", self.prefix, key, n)
