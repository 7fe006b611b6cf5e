"""The build store: versions, deployment pointers, explicit rollback, and ``store://`` references.

Layout of a store (a plain directory; it may be a shared mount)::

    <store>/trusted.pub               optional: when present, only builds signed by this key get in or out
    <store>/.incoming/                copies being verified before they are published
    <store>/<name>/<version>.cuvilpkg immutable once listed in state.json
    <store>/<name>/state.json         versions and pointers (current, tags) with high-water marks
    <store>/<name>/log.jsonl          append-only, hash-chained history: the source of truth (_store_log)
    <store>/<name>/.lock              flock taken by every change to <name>

A version exists in the store when state.json lists it; a push copies the build into
``.incoming``, verifies the copy, then moves it into place and records it under the name's lock,
so concurrent pushes from many processes each land completely or are refused. Pointer rules
(anti-rollback) are in :mod:`cuvil_pgc.recompile._store_state`. Every change first checks, under
the lock, that the log chains and that state.json is what the log replays to (else StoreError
with the repair command, :meth:`BuildStore.repair`), then appends its entry and rewrites
state.json. Reading (list, resolve) takes no lock: state.json is only ever replaced atomically.

References: ``store://NAME`` (current), ``store://NAME@3`` (a version), ``store://NAME@stable`` (a tag).
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cuvil_pgc._fsutil import fsync_dir, write_atomic
from cuvil_pgc.errors import BuildError, StoreError
from cuvil_pgc.recompile import _store_log as slog
from cuvil_pgc.recompile import _store_state as st
from cuvil_pgc.recompile import signing
from cuvil_pgc.recompile.manifest import BUILD_NAME_RE, BUILD_SUFFIX
from cuvil_pgc.recompile.package import VerifiedBuild, open_build

ENV_STORE = "CUVIL_STORE"          # default store directory for `builds ...` and store:// references
REF_PREFIX = "store://"
TRUSTED_KEY = "trusted.pub"
LOCK_TIMEOUT_S = 60.0
_REF_RE = re.compile(rf"{re.escape(REF_PREFIX)}({BUILD_NAME_RE.pattern})(?:@([A-Za-z0-9_-]+))?")

__all__ = ["ENV_STORE", "BuildEntry", "BuildStore", "PushResult", "is_store_ref", "open_any_build", "parse_ref",
           "store_from_env"]


class PushResult(msgspec.Struct):
    name: str
    version: int
    path: str
    added: bool   # False: this exact build was already there (an idempotent re-push)
    signed: bool
    key_id: str | None


class BuildEntry(msgspec.Struct):
    """One row of ``builds list``: a stored version and the pointers at it."""

    name: str
    version: int
    pointers: list[str]
    created: str
    pushed_at: str
    pushed_by: str
    signed: bool
    key_id: str | None
    size: int
    manifest_sha256: str


class BuildStore:
    """A directory of builds. Every refusal raises StoreError or BuildError and changes nothing."""

    def __init__(self, root: str | os.PathLike[str], *, lock_timeout_s: float = LOCK_TIMEOUT_S) -> None:
        self.root = Path(root)
        self.lock_timeout_s = lock_timeout_s

    # -- trust -------------------------------------------------------------------------------------

    def trust(self, pubkey_path: str | os.PathLike[str], *, replace: bool = False) -> str:
        """Make ``pubkey_path`` the store's trusted key; returns its key id."""
        key = signing.load_public_key(pubkey_path)
        current = self.trusted_key()
        if current is not None and signing.key_id(current) != signing.key_id(key) and not replace:
            raise StoreError(f"the store already trusts key {signing.key_id(current)}", path=self.root,
                             fix="pass --replace to change the trusted key on purpose")
        self.root.mkdir(parents=True, exist_ok=True)
        write_atomic(self.root / TRUSTED_KEY, signing.public_pem(key))
        return signing.key_id(key)

    def trusted_key(self) -> Ed25519PublicKey | None:
        path = self.root / TRUSTED_KEY
        return signing.load_public_key(path) if path.exists() else None

    def _verification_key(self, pubkey: Ed25519PublicKey | str | os.PathLike | None) -> Ed25519PublicKey | None:
        given = pubkey if pubkey is None or isinstance(pubkey, Ed25519PublicKey) else signing.load_public_key(pubkey)
        trusted = self.trusted_key()
        if trusted is not None and given is not None and signing.key_id(trusted) != signing.key_id(given):
            raise StoreError(f"the store trusts key {signing.key_id(trusted)}, not the given key "
                             f"{signing.key_id(given)}", path=self.root,
                             fix="drop --pubkey, or change the store's key with `cuvil-pgc builds trust`")
        return trusted or given

    # -- push -------------------------------------------------------------------------------------

    def push(self, build_path: str | os.PathLike[str],
             pubkey: Ed25519PublicKey | str | os.PathLike | None = None) -> PushResult:
        """Verify a build and add it under its manifest's name and version."""
        key = self._verification_key(pubkey)
        with open_build(build_path, key, require_signature=key is not None) as source:
            expected_sha = source.manifest_sha256
        incoming = self.root / ".incoming"
        incoming.mkdir(parents=True, exist_ok=True)
        tmp = incoming / f"{secrets.token_hex(8)}{BUILD_SUFFIX}"
        try:
            _copy_durably(build_path, tmp)
            with open_build(tmp, key, require_signature=key is not None) as build:
                if build.manifest_sha256 != expected_sha:
                    raise BuildError("the build changed while it was being pushed", path=build_path,
                                     fix="push it again once whatever writes it has finished")
                return self._publish(build, tmp)
        finally:
            tmp.unlink(missing_ok=True)

    def _publish(self, build: VerifiedBuild, tmp: Path) -> PushResult:
        name, version = build.manifest.name, build.manifest.version
        directory = self.root / name
        directory.mkdir(exist_ok=True)
        with self._locked(name):
            state, chain = slog.checked_state(directory, name)
            existing = state.versions.get(version)
            target = directory / f"{version}{BUILD_SUFFIX}"
            result = PushResult(name, version, str(target), added=existing is None, signed=build.signed,
                                key_id=build.key_id)
            if existing is not None:
                if existing.manifest_sha256 == build.manifest_sha256:
                    return result
                raise StoreError(f"{name} v{version} is already in the store with different content",
                                 path=self.root, fix="versions are never replaced: build a new version")
            os.replace(tmp, target)
            fsync_dir(directory)
            record = state.versions[version] = st.VersionRecord(
                manifest_sha256=build.manifest_sha256, size=target.stat().st_size,
                created=build.manifest.created.isoformat().replace("+00:00", "Z"), pushed_at=st.utc_iso(),
                pushed_by=f"{st.current_user()}@{socket.gethostname()}", signed=build.signed, key_id=build.key_id)
            slog.append(directory / "log.jsonl", chain, st.log_entry(
                "push", name, version, manifest_sha256=build.manifest_sha256, record=record))
            st.write_state(directory / "state.json", state)
        return result

    # -- pointers ---------------------------------------------------------------------------------

    def promote(self, name: str, version: int, *, reason: str | None = None) -> st.PointerMove:
        """Make ``version`` current (never below the high-water mark: see rollback)."""
        return self._move(name, "promote", st.CURRENT, version, reason)

    def tag(self, name: str, version: int, tag: str, *, reason: str | None = None) -> st.PointerMove:
        """Point ``tag`` (canary, stable, ...) at ``version``; same anti-rollback rule as current."""
        st.check_tag(tag)
        return self._move(name, "tag", tag, version, reason)

    def rollback(self, name: str, *, to: int | None = None, tag: str | None = None,
                 reason: str | None = None) -> st.PointerMove:
        """Move current (or ``tag``) back to its previous value or to ``to``; always logged."""
        pointer = st.CURRENT if tag is None else tag
        if tag is not None:
            st.check_tag(tag)
        with self._locked(self._existing_name(name)):
            state, chain = slog.checked_state(self.root / name, name)
            move = st.rollback_pointer(state, pointer, to, store=str(self.root))
            self._open_stored(name, move.version).close()
            self._commit(state, chain, "rollback", move, reason)
        return move

    def _move(self, name: str, op: str, pointer: str, version: int, reason: str | None) -> st.PointerMove:
        self._open_stored(name, version).close()   # verify outside the lock; stored files never change
        with self._locked(self._existing_name(name)):
            state, chain = slog.checked_state(self.root / name, name)
            move = st.advance_pointer(state, pointer, version, store=str(self.root))
            if move.changed:
                self._commit(state, chain, op, move, reason)
        return move

    def _commit(self, state: st.NameState, chain: slog.Chain, op: str, move: st.PointerMove,
                reason: str | None) -> None:
        directory = self.root / state.name
        slog.append(directory / "log.jsonl", chain, st.log_entry(
            op, state.name, move.version, pointer=move.pointer, previous=move.previous, reason=reason,
            manifest_sha256=state.versions[move.version].manifest_sha256, after=state.pointers[move.pointer]))
        st.write_state(directory / "state.json", state)

    def repair(self, name: str, *, from_state: bool = False) -> list[str]:
        """Make ``name``'s state.json and log agree again; returns what was done (see _store_log)."""
        with self._locked(self._existing_name(name)):
            return slog.repair(self.root / name, name, from_state=from_state)

    # -- reading ----------------------------------------------------------------------------------

    def names(self) -> list[str]:
        if not self.root.is_dir():
            raise StoreError("store directory does not exist", path=self.root,
                             fix="push a build to create it, or check --store / $CUVIL_STORE")
        return sorted(p.name for p in self.root.iterdir() if _has_name_files(p))

    def entries(self, name: str | None = None) -> list[BuildEntry]:
        """Every stored version (of ``name``, or of all names), newest first within a name."""
        rows = []
        for each in ([self._existing_name(name)] if name is not None else self.names()):
            state = self.state(each)
            at: dict[int, list[str]] = {}
            for pointer, value in sorted(state.pointers.items(), key=lambda kv: kv[0] != st.CURRENT):
                at.setdefault(value.version, []).append(pointer)
            for version, rec in sorted(state.versions.items(), reverse=True):
                rows.append(BuildEntry(each, version, at.get(version, []), rec.created, rec.pushed_at, rec.pushed_by,
                                       rec.signed, rec.key_id, rec.size, rec.manifest_sha256))
        return rows

    def next_version(self, name: str) -> int:
        """One above the highest version stored under ``name`` (1 for a new name)."""
        if not _has_name_files(self.root / name):
            return 1
        return max(self.state(name).versions, default=0) + 1

    def state(self, name: str) -> st.NameState:
        self._existing_name(name)
        return st.read_state(self.root / name / "state.json", name)

    def log(self, name: str) -> list[st.LogEntry]:
        """The verified history of ``name`` (StoreError when the log is missing, malformed or unchained)."""
        self._existing_name(name)
        path = self.root / name / "log.jsonl"
        if not os.path.lexists(path):
            raise StoreError("store log is missing (state.json exists, so the history was deleted)", path=path,
                             fix=slog.from_state_fix(path))
        return slog.read_chain(path).entries

    def resolve(self, ref: str) -> tuple[str, int, Path]:
        """``store://NAME[@VERSION|@TAG]`` (or ``NAME[@...]``) → (name, version, path of the build file)."""
        name, selector = parse_ref(ref if ref.startswith(REF_PREFIX) else REF_PREFIX + ref)
        state = self.state(name)
        if selector.isdigit():
            version = int(selector)
            st.require_version(state, version, store=str(self.root))
        else:
            pointer = state.pointers.get(selector)
            if pointer is None:
                have = ", ".join(sorted(state.pointers)) or "none"
                raise StoreError(f"{name} has no {selector} version (pointers: {have})", path=self.root,
                                 fix=f"run `cuvil-pgc builds {'promote' if selector == st.CURRENT else 'tag'} ...`")
            version = pointer.version
        return name, version, self._build_path(name, version)

    def open(self, ref: str, pubkey: Ed25519PublicKey | str | os.PathLike | None = None) -> VerifiedBuild:
        """Resolve and verify: the file must be the build the store recorded, signed if a key is trusted."""
        name, version, _ = self.resolve(ref)
        return self._open_stored(name, version, pubkey)

    def _open_stored(self, name: str, version: int, pubkey=None) -> VerifiedBuild:
        state = self.state(name)
        st.require_version(state, version, store=str(self.root))
        key = self._verification_key(pubkey)
        build = open_build(self._build_path(name, version), key, require_signature=key is not None,
                           expect_name=name, expect_version=version)
        if build.manifest_sha256 != state.versions[version].manifest_sha256:
            build.close()
            raise StoreError(f"{name} v{version} on disk differs from the build that was pushed", path=self.root,
                             fix="the store was modified by hand; push the original build again")
        return build

    def _existing_name(self, name: str) -> str:
        if BUILD_NAME_RE.fullmatch(name) is None or not _has_name_files(self.root / name):
            have = ", ".join(self.names()) if self.root.is_dir() else "none"
            raise StoreError(f"no builds named {name!r} in the store (names: {have or 'none'})", path=self.root,
                             fix="push one with `cuvil-pgc builds push BUILD --store DIR`")
        return name

    def _build_path(self, name: str, version: int) -> Path:
        return self.root / name / f"{version}{BUILD_SUFFIX}"

    def _locked(self, name: str):
        return st.exclusive_lock(self.root / name / ".lock", self.lock_timeout_s)


def _has_name_files(directory: Path) -> bool:
    """A name exists when its state or its log does (a damaged one is reported, not hidden)."""
    return os.path.lexists(directory / "state.json") or os.path.lexists(directory / "log.jsonl")


def _copy_durably(source: str | os.PathLike[str], target: Path) -> None:
    with open(source, "rb") as src, open(target, "xb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
        dst.flush()
        os.fsync(dst.fileno())


def is_store_ref(value: str) -> bool:
    return isinstance(value, str) and value.startswith(REF_PREFIX)


def parse_ref(ref: str) -> tuple[str, str]:
    """``store://NAME[@SELECTOR]`` → (NAME, SELECTOR or "current")."""
    match = _REF_RE.fullmatch(ref)
    if match is None:
        raise StoreError(f"{ref!r} is not a store reference",
                         fix="write store://NAME, store://NAME@VERSION or store://NAME@TAG")
    return match.group(1), match.group(2) or st.CURRENT


def store_from_env(store: str | os.PathLike[str] | None = None) -> BuildStore:
    """The given store directory, else $CUVIL_STORE."""
    root = store if store is not None else os.environ.get(ENV_STORE)
    if not root:
        raise StoreError("no build store given", fix=f"pass --store DIR (or store=DIR), or set {ENV_STORE}")
    return BuildStore(root)


def open_any_build(source: str | os.PathLike[str], *, store: str | os.PathLike[str] | None = None,
                   pubkey: Ed25519PublicKey | str | os.PathLike | None = None,
                   require_signature: bool = False) -> VerifiedBuild:
    """Open a build path or a ``store://`` reference, verified (what load_build and compare call)."""
    if isinstance(source, str) and is_store_ref(source):
        return store_from_env(store).open(source, pubkey)
    return open_build(source, pubkey, require_signature=require_signature)
