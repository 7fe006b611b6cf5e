"""Writing a ``.cuvilpkg`` build (re-exported by :mod:`cuvil_pgc.recompile.package`).

Members go to a temporary file beside the target; ``close`` adds the manifest (every member's
sha256 and size, bound to the build's name and version) and, given a key, its signature, then
publishes with fsync + ``os.replace``: the target is either absent, the previous file, or the
complete new build. Zip entries carry a fixed timestamp and mode, so equal content gives equal bytes.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import zipfile
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from cuvil_pgc._fsutil import fsync_dir
from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile import signing
from cuvil_pgc.recompile._zipsafety import MAX_COMPRESSION_RATIO
from cuvil_pgc.recompile.manifest import (
    FORMAT_VERSION,
    MANIFEST_NAME,
    SIGNATURE_NAME,
    EngineTarget,
    Fingerprint,
    Manifest,
    MemberDigest,
    check_build_name,
    check_member_name,
    encode_manifest,
    utc_now,
)

CHUNK = 1 << 20
TEXT_SUFFIXES = (".json", ".jsonl", ".txt", ".py", ".yaml", ".csv", ".md")
_MAX_DEFLATE_BYTES = 64 << 20
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)   # reproducible zips: content, not write time, decides the bytes

PrivateKeyArg = Ed25519PrivateKey | str | os.PathLike | None


class BuildWriter:
    """Writes one build. ``add_bytes``/``add_file`` members, then ``close(signing_key)``.

    Used as a context manager it closes (unsigned) on success unless already closed, and discards
    the temporary file on an exception.
    """

    def __init__(self, path: str | os.PathLike[str], name: str, version: int, *,
                 fingerprint: Fingerprint | Mapping[str, str], model_hash: str = "",
                 trace_hashes: Iterable[str] = (), created=None, threads: int = 0,
                 model_class: str = "", model_tree: str = "", tensorrt: EngineTarget | None = None) -> None:
        check_build_name(name)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise BuildError(f"build version {version!r} must be an integer >= 1", path=path)
        self.path = os.fspath(path)
        created = created or utc_now()
        if created.tzinfo is None:
            raise BuildError("created must be a timezone-aware datetime", path=self.path,
                             fix="pass datetime.now(timezone.utc)")
        self._header = dict(format_version=FORMAT_VERSION, name=name, version=version, created=created,
                            fingerprint=_as_fingerprint(fingerprint), model_hash=model_hash,
                            trace_hashes=list(trace_hashes), threads=threads, model_class=model_class,
                            model_tree=model_tree)
        if tensorrt is not None:
            self._header["tensorrt"] = tensorrt
        self._manifest({})   # refuse a malformed header now, not after the members were written
        directory = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(directory):
            raise BuildError(f"directory {directory} does not exist", path=self.path,
                             fix="create it or choose another output path")
        self._tmp = tempfile.NamedTemporaryFile(dir=directory, prefix=f".{os.path.basename(self.path)}.",
                                                suffix=".tmp", delete=False)
        self._zip = zipfile.ZipFile(self._tmp, "w", allowZip64=True)
        self._digests: dict[str, MemberDigest] = {}
        self._folded: set[str] = set()
        self._done = False

    def __enter__(self) -> BuildWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()
        elif not self._done:
            self.close()

    def add_bytes(self, name: str, data: bytes, *, compress: bool | None = None) -> MemberDigest:
        """Add a member from memory. ``compress``: None deflates text-like names, True tries deflate."""
        info = self._new_member(name)
        if compress is None:
            compress = name.endswith(TEXT_SUFFIXES)
        if compress and len(data) <= _MAX_DEFLATE_BYTES and _deflate_is_safe(data):
            info.compress_type = zipfile.ZIP_DEFLATED
        self._zip.writestr(info, data)
        return self._record(name, hashlib.sha256(data).hexdigest(), len(data))

    def add_file(self, name: str, source: str | os.PathLike[str], *, compress: bool | None = None) -> MemberDigest:
        """Add a member from a file, streamed (large files are stored uncompressed)."""
        try:
            size = os.stat(source).st_size
            if (compress or (compress is None and name.endswith(TEXT_SUFFIXES))) and size <= _MAX_DEFLATE_BYTES:
                return self.add_bytes(name, Path(source).read_bytes(), compress=True)
            info = self._new_member(name)
            digest, written = hashlib.sha256(), 0
            with open(source, "rb") as src, self._zip.open(info, "w", force_zip64=size >= (1 << 31)) as dst:
                while chunk := src.read(CHUNK):
                    digest.update(chunk)
                    dst.write(chunk)
                    written += len(chunk)
        except OSError as exc:
            raise BuildError(f"cannot read {os.fspath(source)} for member {name!r} ({exc.strerror})",
                             path=self.path) from None
        return self._record(name, digest.hexdigest(), written)

    def close(self, signing_key: PrivateKeyArg = None) -> Manifest:
        """Write the manifest (and signature) and publish the file atomically; returns the manifest."""
        if self._done:
            raise BuildError("this build was already closed", path=self.path)
        try:
            manifest = self._manifest(dict(sorted(self._digests.items())))
            manifest_bytes = encode_manifest(manifest)
            self._zip.writestr(_member_info(MANIFEST_NAME), manifest_bytes)
            if signing_key is not None:
                key = signing_key if isinstance(signing_key, Ed25519PrivateKey) \
                    else signing.load_private_key(signing_key)
                self._zip.writestr(_member_info(SIGNATURE_NAME), signing.sign_manifest(key, manifest_bytes))
            self._zip.close()
            self._tmp.flush()
            os.fsync(self._tmp.fileno())
            self._tmp.close()
            os.replace(self._tmp.name, self.path)
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))
        except BaseException:
            self.abort()
            raise
        self._done = True
        return manifest

    def abort(self) -> None:
        """Discard everything written so far (the target path is left as it was)."""
        self._done = True
        try:
            self._zip.close()
        except Exception:   # noqa: BLE001 - the file is being thrown away
            pass
        self._tmp.close()
        Path(self._tmp.name).unlink(missing_ok=True)

    def _manifest(self, members: dict[str, MemberDigest]) -> Manifest:
        try:
            return msgspec.convert({**self._header, "members": members}, Manifest, from_attributes=True)
        except msgspec.ValidationError as exc:
            raise BuildError(f"build header is invalid: {exc}", path=self.path,
                             fix="model_hash and trace_hashes are lowercase sha256 hex digests") from None

    def _new_member(self, name: str) -> zipfile.ZipInfo:
        if self._done:
            raise BuildError("this build was already closed", path=self.path)
        check_member_name(name, path=self.path, reserved_ok=False)
        if name.casefold() in self._folded:
            raise BuildError(f"member {name!r} was already added", path=self.path,
                             fix="each member name may appear once (case-insensitively)")
        self._folded.add(name.casefold())
        return _member_info(name)

    def _record(self, name: str, sha256: str, size: int) -> MemberDigest:
        digest = MemberDigest(sha256=sha256, size=size)
        self._digests[name] = digest
        return digest


def _member_info(name: str) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
    info.create_system = 3
    info.external_attr = 0o100644 << 16
    info.compress_type = zipfile.ZIP_STORED
    return info


def _deflate_is_safe(data: bytes) -> bool:
    """True when the deflated member will not look like a bomb to a reader (else store it)."""
    if len(data) <= (1 << 20):
        return True
    return len(data) <= MAX_COMPRESSION_RATIO // 2 * len(zlib.compress(data, 1))


def _as_fingerprint(value: Fingerprint | Mapping[str, str]) -> Fingerprint:
    if isinstance(value, Fingerprint):
        return value
    try:
        return msgspec.convert(dict(value), Fingerprint)
    except (msgspec.ValidationError, TypeError) as exc:
        raise BuildError(f"fingerprint is invalid: {exc}",
                         fix="pass manifest.current_fingerprint() or a dict with torch, python, platform, "
                             "cpu_isa, device") from None
