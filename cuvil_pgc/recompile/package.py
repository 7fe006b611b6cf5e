"""The ``.cuvilpkg`` build container: write it (:class:`BuildWriter`), open it only after verifying all of it.

A build is a zip file holding ``manifest.json`` (see :mod:`cuvil_pgc.recompile.manifest`),
``manifest.sig`` (absent when unsigned) and any other members (plan.json, AOTInductor ``.pt2``
packages, cache artifacts, safetensors weights).

Contract of :func:`open_build`: it returns a :class:`VerifiedBuild` only after the zip structure,
the limits, the signature (against the caller's public key), the manifest schema and format
version, the exact member set, and the sha256 and size of every member have been checked,
streaming, never holding more than a small chunk. Until then no member is deserialized. Any
refusal raises :class:`BuildError` naming the file, the member and what to do, and leaves
nothing behind. ``VerifiedBuild.read_bytes`` and ``extract`` hash the bytes again as they read
them, so a file changed after verification is refused too.

:class:`BuildWriter` (in ``_writer``) publishes atomically; see its module docstring.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile import signing
from cuvil_pgc.recompile._writer import CHUNK, BuildWriter
from cuvil_pgc.recompile._zipsafety import BuildLimits, check_entries, precheck_directory
from cuvil_pgc.recompile.manifest import (
    MANIFEST_NAME,
    RESERVED_NAMES,
    SIGNATURE_NAME,
    Manifest,
    MemberDigest,
    decode_manifest,
    sha256_hex,
)

__all__ = ["BuildLimits", "BuildWriter", "VerifiedBuild", "open_build"]

MAX_MANIFEST_BYTES = 16 << 20
_CORRUPT_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, zlib.error, EOFError, OSError, ValueError,
                   NotImplementedError, RuntimeError, UnicodeError)
_DEFAULT_LIMITS = BuildLimits()

PublicKeyArg = Ed25519PublicKey | str | os.PathLike | None


def open_build(path: str | os.PathLike[str], pubkey: PublicKeyArg = None, *, require_signature: bool = False,
               max_member_bytes: int = _DEFAULT_LIMITS.max_member_bytes,
               max_total_bytes: int = _DEFAULT_LIMITS.max_total_bytes,
               max_members: int = _DEFAULT_LIMITS.max_members,
               expect_name: str | None = None, expect_version: int | None = None) -> VerifiedBuild:
    """Verify a build completely and return it; raise BuildError otherwise.

    Args:
        pubkey: the trusted public key (object or path). Given, the build must carry a valid
            signature by it. Without it only integrity is checked, unless ``require_signature``.
        expect_name, expect_version: refuse a build whose manifest says otherwise (a store uses
            this so a file cannot be swapped for another signed build).
    """
    path = os.fspath(path)
    key = pubkey if pubkey is None or isinstance(pubkey, Ed25519PublicKey) else signing.load_public_key(pubkey)
    if require_signature and key is None:
        raise BuildError("a signed build is required but no public key was given", path=path,
                         fix="pass the signer's public key (--pubkey KEY.pub)")
    fh = _open_regular_file(path)
    try:
        limits = BuildLimits(max_member_bytes, max_total_bytes, max_members)
        return _verify(fh, path, key, limits, expect_name, expect_version)
    except BaseException:
        fh.close()
        raise


def _open_regular_file(path: str) -> BinaryIO:
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):   # before open(): a FIFO would block it
            raise BuildError("not a regular file", path=path, fix="pass the .cuvilpkg file itself")
        fh = open(path, "rb")  # noqa: SIM115 - owned by the VerifiedBuild
    except FileNotFoundError:
        raise BuildError("build file does not exist", path=path) from None
    except OSError as exc:
        raise BuildError(f"cannot open the build ({exc.strerror})", path=path) from None
    if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
        fh.close()
        raise BuildError("not a regular file", path=path, fix="pass the .cuvilpkg file itself")
    return fh


def _verify(fh: BinaryIO, path: str, key: Ed25519PublicKey | None, limits: BuildLimits,
            expect_name: str | None, expect_version: int | None) -> VerifiedBuild:
    try:
        precheck_directory(fh, path, limits)
        fh.seek(0)
        zf = zipfile.ZipFile(fh)
    except _CORRUPT_ERRORS as exc:
        raise BuildError(f"not a readable zip file ({exc})", path=path,
                         fix="copy the whole .cuvilpkg again; it is truncated or another kind of file") from None
    infos = check_entries(zf, path, limits)
    if MANIFEST_NAME not in infos:
        raise BuildError(f"no {MANIFEST_NAME}: not a cuvil-pgc build", path=path,
                         fix="pass a .cuvilpkg written by `cuvil-pgc recompile`")
    manifest_bytes = _read_small(zf, infos[MANIFEST_NAME], MAX_MANIFEST_BYTES, path)
    sig_info = infos.get(SIGNATURE_NAME)
    sig_bytes = None if sig_info is None else _read_small(zf, sig_info, signing.MAX_SIGNATURE_BYTES, path)
    key_id = _check_signature(key, manifest_bytes, sig_bytes, path)
    manifest = decode_manifest(manifest_bytes, path=path)   # parsed only once it is authenticated
    _check_identity(manifest, expect_name, expect_version, path)
    _check_member_set(manifest, infos, path)
    for name, digest in manifest.members.items():
        _check_member(zf, infos[name], digest, path)
    return VerifiedBuild(path, fh, zf, manifest, manifest_bytes, key_id=key_id,
                         signed=sig_bytes is not None, signature_verified=key is not None)


def _check_signature(key: Ed25519PublicKey | None, manifest_bytes: bytes, sig_bytes: bytes | None,
                     path: str) -> str | None:
    if key is None:
        return None if sig_bytes is None else signing.decode_envelope(sig_bytes, path=path).key_id
    if sig_bytes is None:
        raise BuildError("the build is not signed, but a signature by the given key is required", path=path,
                         fix="sign it with `cuvil-pgc recompile --sign KEY`, or use a signed build")
    return signing.verify_manifest_signature(key, manifest_bytes, sig_bytes, path=path)


def _check_identity(manifest: Manifest, name: str | None, version: int | None, path: str) -> None:
    if (name is not None and manifest.name != name) or (version is not None and manifest.version != version):
        raise BuildError(f"the manifest describes {manifest.name} v{manifest.version}, but this file should "
                         f"hold {name or manifest.name} v{version or manifest.version}", path=path,
                         fix="the file was replaced by another build; restore it or push the build again")


def _check_member_set(manifest: Manifest, infos: Mapping[str, zipfile.ZipInfo], path: str) -> None:
    present = set(infos) - set(RESERVED_NAMES)
    listed = set(manifest.members)
    extra, missing = sorted(present - listed), sorted(listed - present)
    if extra or missing:
        parts = ([f"not in the manifest: {', '.join(extra)}"] if extra else []) + \
                ([f"missing from the package: {', '.join(missing)}"] if missing else [])
        raise BuildError(f"members differ from the manifest ({'; '.join(parts)})", path=path,
                         fix="the package was altered after it was built; do not use it")


def _check_member(zf: zipfile.ZipFile, info: zipfile.ZipInfo, digest: MemberDigest, path: str) -> None:
    if info.file_size != digest.size:
        raise BuildError(f"member {info.filename!r} is {info.file_size} bytes, the manifest says {digest.size}",
                         path=path, fix="the package was altered after it was built; do not use it")
    sha = hashlib.sha256()
    for chunk in _stream(zf, info, digest.size, path):
        sha.update(chunk)
    if sha.hexdigest() != digest.sha256:
        raise BuildError(f"member {info.filename!r} does not match its sha256 in the manifest", path=path,
                         fix="the package was altered after it was built; do not use it")


def _stream(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, path: str) -> Iterable[bytes]:
    """Yield the member's bytes in chunks, refusing more than ``limit`` bytes or a corrupt stream."""
    seen = 0
    try:
        with zf.open(info) as src:
            while chunk := src.read(CHUNK):
                seen += len(chunk)
                if seen > limit:
                    raise BuildError(f"member {info.filename!r} holds more than its declared {limit} bytes",
                                     path=path, fix="the package is damaged or crafted; do not use it")
                yield chunk
    except _CORRUPT_ERRORS as exc:
        raise BuildError(f"member {info.filename!r} is corrupt ({exc})", path=path,
                         fix="the package is damaged or was altered; copy or rebuild it") from None
    if seen != limit:
        raise BuildError(f"member {info.filename!r} holds {seen} bytes, {limit} expected", path=path,
                         fix="the package is damaged or was altered; copy or rebuild it")


def _read_small(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, path: str) -> bytes:
    if info.file_size > limit:
        raise BuildError(f"{info.filename} is {info.file_size} bytes, over its limit of {limit}", path=path,
                         fix="the package is damaged or crafted; do not use it")
    return b"".join(_stream(zf, info, info.file_size, path))


class VerifiedBuild:
    """A build whose signature, manifest and every member digest were checked by :func:`open_build`."""

    def __init__(self, path: str, fh: BinaryIO, zf: zipfile.ZipFile, manifest: Manifest, manifest_bytes: bytes,
                 *, key_id: str | None, signed: bool, signature_verified: bool) -> None:
        self.path = path
        self.manifest = manifest
        self.manifest_sha256 = sha256_hex(manifest_bytes)
        self.key_id = key_id
        self.signed = signed
        self.signature_verified = signature_verified
        self._fh = fh
        self._zip = zf

    def __enter__(self) -> VerifiedBuild:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._zip.close()
        self._fh.close()

    def summary(self) -> dict[str, Any]:
        """What ``cuvil-pgc verify`` reports: path, manifest facts, signature and member digests."""
        import msgspec

        m = self.manifest
        return {"path": self.path, "ok": True, "name": m.name, "version": m.version,
                "created": m.created.isoformat(), "format_version": m.format_version,
                "fingerprint": msgspec.to_builtins(m.fingerprint), "model_hash": m.model_hash,
                "trace_hashes": list(m.trace_hashes), "manifest_sha256": self.manifest_sha256,
                "signature": {"present": self.signed, "verified": self.signature_verified, "key_id": self.key_id},
                "members": {n: msgspec.to_builtins(d) for n, d in m.members.items()}}

    def members(self) -> list[str]:
        """Names of the payload members (manifest and signature excluded), sorted."""
        return sorted(self.manifest.members)

    def read_bytes(self, name: str) -> bytes:
        """A member's bytes, hashed again while read."""
        digest = self._digest(name)
        sha = hashlib.sha256()
        chunks = []
        for chunk in _stream(self._zip, self._zip.getinfo(name), digest.size, self.path):
            sha.update(chunk)
            chunks.append(chunk)
        self._require(name, sha.hexdigest() == digest.sha256)
        return b"".join(chunks)

    def extract(self, name: str, dest_dir: str | os.PathLike[str]) -> Path:
        """Write member ``name`` to ``dest_dir/name``; on any failure nothing is left behind."""
        return _extract_member(self, name, Path(dest_dir), [])

    def extract_all(self, dest_dir: str | os.PathLike[str]) -> dict[str, Path]:
        """Extract every member; on failure the files and directories it created are removed again."""
        done: dict[str, Path] = {}
        created: list[Path] = []
        try:
            for name in self.members():
                done[name] = _extract_member(self, name, Path(dest_dir), created)
        except BaseException:
            for written in done.values():
                written.unlink(missing_ok=True)
            _remove_dirs(created)
            raise
        return done

    def _digest(self, name: str) -> MemberDigest:
        try:
            return self.manifest.members[name]
        except KeyError:
            raise BuildError(f"no member {name!r} in this build (members: {', '.join(self.members())})",
                             path=self.path) from None

    def _require(self, name: str, ok: bool) -> None:
        if not ok:
            raise BuildError(f"member {name!r} changed on disk after verification", path=self.path,
                             fix="something is rewriting the build file; copy it to private storage and retry")


def _extract_member(build: VerifiedBuild, name: str, dest_dir: Path, created: list[Path]) -> Path:
    """Extract one member, appending the directories it creates to ``created``."""
    digest = build._digest(name)
    root = dest_dir.resolve()
    target = root / name
    mine = _make_parents(root, target.parent)
    created.extend(mine)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(4)}.part"
    try:
        if os.path.commonpath([root, target.parent.resolve()]) != str(root):
            raise BuildError(f"member {name!r} would be written outside {root}", path=build.path,
                             fix=f"{target.parent} is a link out of the destination; extract elsewhere")
        sha = hashlib.sha256()
        with open(tmp, "xb") as out:
            for chunk in _stream(build._zip, build._zip.getinfo(name), digest.size, build.path):
                sha.update(chunk)
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
        build._require(name, sha.hexdigest() == digest.sha256)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        _remove_dirs(mine)
        raise
    return target


def _make_parents(root: Path, parent: Path) -> list[Path]:
    """Create the directories between ``root`` (which must exist) and ``parent``; returns the new ones."""
    created = []
    if not root.exists():
        root.mkdir(parents=True)
        created.append(root)
    directory = root
    for part in parent.relative_to(root).parts:
        directory = directory / part
        if not directory.exists():
            directory.mkdir()
            created.append(directory)
    return created


def _remove_dirs(created: list[Path]) -> None:
    for directory in reversed(created):
        try:
            directory.rmdir()
        except OSError:
            pass
