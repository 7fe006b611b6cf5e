"""Per-name state of the build store, its pointer rules, and the file primitives that keep it consistent.

State (``<store>/<name>/state.json``) records the versions the store holds and its *pointers*:
``current`` (moved by promote) and tags such as ``canary`` or ``stable`` (moved by tag). Every
pointer has its own high-water mark, the highest version it ever pointed to. Moving a pointer
forward (promote, tag) must reach at least its high-water mark: a deployment never goes back by
accident. Going below it is possible only through :func:`rollback_pointer`, which the store logs.
Tags follow the same rule as ``current`` because a deployment that follows ``store://NAME@stable``
is exposed to a backwards move exactly as one following ``current`` is.

Writes are atomic (temp file + fsync + ``os.replace``); mutations happen under an exclusive
``fcntl.flock`` on ``<store>/<name>/.lock``, which the kernel releases if the holder dies.
"""

from __future__ import annotations

import fcntl
import getpass
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import msgspec

from cuvil_pgc._fsutil import write_atomic
from cuvil_pgc.errors import StoreError

STATE_SCHEMA = 1
CURRENT = "current"
TAG_RE = re.compile(r"[a-z][a-z0-9_-]{0,31}")
Version = Annotated[int, msgspec.Meta(ge=1)]


class VersionRecord(msgspec.Struct, forbid_unknown_fields=True):
    manifest_sha256: str
    size: int
    created: str
    pushed_at: str
    pushed_by: str
    signed: bool
    key_id: str | None = None


class Pointer(msgspec.Struct, forbid_unknown_fields=True):
    version: Version
    high_water: Version
    history: list[Version] = []   # earlier values, most recent last: what a plain rollback returns to


class NameState(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    schema: int = STATE_SCHEMA
    versions: dict[int, VersionRecord] = {}
    pointers: dict[str, Pointer] = {}


class LogEntry(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """One line of ``log.jsonl`` (see _store_log for the chain and how the state is replayed)."""

    time: str
    op: str                 # push | promote | tag | rollback | checkpoint
    name: str
    version: int            # 0 for a checkpoint
    user: str
    host: str
    pid: int
    pointer: str | None = None
    previous: int | None = None
    manifest_sha256: str | None = None
    reason: str | None = None
    prev: str | None = None                 # sha256 of the line before (None: the first line, or a legacy line)
    record: VersionRecord | None = None     # push: what state.json records for the version
    after: Pointer | None = None            # promote/tag/rollback: the pointer after the move
    state: NameState | None = None          # checkpoint: the whole state (migration, repair --from-state)


class PointerMove(msgspec.Struct):
    """What promote/tag/rollback did: ``changed`` is False when the pointer already had that value."""

    name: str
    pointer: str
    previous: int | None
    version: int
    changed: bool


def advance_pointer(state: NameState, pointer: str, version: int, *, store: str) -> PointerMove:
    """Move ``pointer`` forward to ``version``; refuses versions below its high-water mark."""
    require_version(state, version, store=store)
    old = state.pointers.get(pointer)
    if old is not None and old.version == version:
        return PointerMove(state.name, pointer, version, version, changed=False)
    if old is not None and version < old.high_water:
        verb = "promote" if pointer == CURRENT else f"tag {pointer}"
        raise StoreError(f"anti-rollback: cannot {verb} {state.name} v{version}, below the high-water mark "
                         f"v{old.high_water} of {pointer}", path=store,
                         fix=f"to go back on purpose, run `cuvil-pgc builds rollback {state.name} --to {version}"
                             f"{'' if pointer == CURRENT else ' --tag ' + pointer}`; rollbacks are logged")
    history = [] if old is None else [*old.history, old.version]
    high = version if old is None else max(old.high_water, version)
    state.pointers[pointer] = Pointer(version=version, high_water=high, history=history)
    return PointerMove(state.name, pointer, None if old is None else old.version, version, changed=True)


def rollback_pointer(state: NameState, pointer: str, to: int | None, *, store: str) -> PointerMove:
    """Move ``pointer`` back: to its previous value, or to ``to`` (below its high-water mark)."""
    old = state.pointers.get(pointer)
    if old is None:
        raise StoreError(f"{state.name} has no {pointer} version to roll back", path=store,
                         fix="promote (or tag) a version first")
    if to is None:
        if not old.history:
            raise StoreError(f"{state.name} {pointer} has no earlier version to roll back to", path=store,
                             fix="name the target with --to VERSION")
        target, history = old.history[-1], old.history[:-1]
    else:
        require_version(state, to, store=store)
        if to == old.version:
            raise StoreError(f"{state.name} {pointer} is already v{to}", path=store)
        if to >= old.high_water:
            raise StoreError(f"v{to} is not below the high-water mark v{old.high_water}: that is a move forward",
                             path=store, fix="use `cuvil-pgc builds promote` (or `tag`) to move forward")
        target, history = to, [v for v in [*old.history, old.version] if v < to]
    state.pointers[pointer] = Pointer(version=target, high_water=old.high_water, history=history)
    return PointerMove(state.name, pointer, old.version, target, changed=True)


def require_version(state: NameState, version: int, *, store: str) -> None:
    if version not in state.versions:
        held = ", ".join(str(v) for v in sorted(state.versions)) or "none"
        raise StoreError(f"{state.name} v{version} is not in the store (versions: {held})", path=store,
                         fix="push the build first: cuvil-pgc builds push BUILD --store DIR")


def check_tag(tag: str) -> None:
    if tag == CURRENT:
        raise StoreError("'current' is moved by promote, not tag", fix="run `cuvil-pgc builds promote NAME VERSION`")
    if TAG_RE.fullmatch(tag) is None:
        raise StoreError(f"tag {tag!r} is not usable", fix="use 1-32 lowercase letters, digits, '_' or '-'")


def repair_hint(path: Path) -> str:
    """The command that rebuilds ``<store>/<name>/state.json`` from the log beside ``path``."""
    return f"`cuvil-pgc builds repair {path.parent.name} --store {path.parent.parent}` rebuilds it from log.jsonl"


def read_state(path: Path, name: str) -> NameState:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return NameState(name=name)
    except OSError as exc:      # a directory in its place, no permission, an I/O error
        raise StoreError(f"store state cannot be read ({exc.strerror or exc})", path=path,
                         fix=repair_hint(path)) from None
    try:
        state = msgspec.json.decode(data, type=NameState)
    except msgspec.DecodeError as exc:
        raise StoreError(f"store state is corrupt ({exc})", path=path, fix=repair_hint(path)) from None
    if state.name != name or state.schema != STATE_SCHEMA:
        raise StoreError(f"store state describes {state.name!r} schema {state.schema}, expected {name!r} "
                         f"schema {STATE_SCHEMA}", path=path, fix=repair_hint(path))
    return state


def write_state(path: Path, state: NameState) -> None:
    write_atomic(path, msgspec.json.format(msgspec.json.encode(state), indent=2) + b"\n")


def log_entry(op: str, name: str, version: int, **fields: object) -> LogEntry:
    return LogEntry(time=utc_iso(), op=op, name=name, version=version, user=current_user(),
                    host=socket.gethostname(), pid=os.getpid(), **fields)


def utc_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def current_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):   # containers without a passwd entry
        return f"uid{os.getuid()}"


@contextmanager
def exclusive_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """Hold ``flock(LOCK_EX)`` on ``path`` (created if needed); StoreError after ``timeout_s``."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise StoreError(f"the store stayed locked for {timeout_s:.0f} s", path=path,
                                     fix="another push or promote is running; retry when it ends") from None
                time.sleep(0.01 + secrets.randbelow(20) / 1000)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
