"""Ed25519 keys and manifest signatures for builds.

Keys are PEM files: the private key PKCS8 (unencrypted, mode 0600, created exclusively so an
existing key is never overwritten), the public key SubjectPublicKeyInfo in ``<key>.pub``. Public
keys in OpenSSH form (``ssh-ed25519 AAAA...``) are accepted too.

``manifest.sig`` is a small JSON envelope ``{"algorithm": "ed25519", "key_id", "signature"}``.
The signature covers ``SIGNING_CONTEXT + manifest bytes``: the context string keeps a signature
made for a manifest from being valid for any other message signed with the same key. ``key_id``
(sha256 of the raw public key, 16 hex chars) only makes "signed by another key" errors readable;
trust comes from the public key the verifier passes, never from the envelope.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from cuvil_pgc.errors import BuildError

PUBLIC_SUFFIX = ".pub"
SIGNING_CONTEXT = b"cuvil-pgc build manifest v1\x00"
MAX_KEY_FILE_BYTES = 16 * 1024
MAX_SIGNATURE_BYTES = 4096


class SignatureEnvelope(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Contents of ``manifest.sig``."""

    algorithm: Literal["ed25519"]
    key_id: Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{16}\Z")]
    signature: Annotated[str, msgspec.Meta(max_length=128)]


def generate_keypair(path: str | os.PathLike[str]) -> tuple[Path, Path]:
    """Write a new private key at ``path`` (0600) and its public key at ``path + '.pub'``.

    Refuses to overwrite either file. Returns (private key path, public key path).
    """
    private_path = Path(path)
    public_path = Path(os.fspath(path) + PUBLIC_SUFFIX)
    for existing in (private_path, public_path):
        if existing.exists():
            raise BuildError("a key file already exists here", path=existing,
                             fix="choose another -o path; keys are never overwritten")
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    _write_exclusive(private_path, private_pem, 0o600)
    try:
        _write_exclusive(public_path, public_pem(key.public_key()), 0o644)
    except BaseException:
        private_path.unlink(missing_ok=True)
        raise
    return private_path, public_path


def _write_exclusive(path: Path, data: bytes, mode: int) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise BuildError("a key file already exists here", path=path,
                         fix="choose another -o path; keys are never overwritten") from None
    except OSError as exc:
        raise BuildError(f"cannot create the key file ({exc.strerror})", path=path,
                         fix="check that the directory exists and is writable") from None
    try:
        os.fchmod(fd, mode)   # the umask may have removed bits; never added any
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def public_pem(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id(key: Ed25519PublicKey) -> str:
    """Short identifier of a public key: the first 16 hex chars of sha256(raw key)."""
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def load_private_key(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    """Load an unencrypted PEM Ed25519 private key that only its owner can read."""
    data = _read_key_file(path, "private")
    if b"PUBLIC KEY-----" in data or data.startswith(b"ssh-"):
        raise BuildError("this is a public key, not a private key", path=path,
                         fix="sign with the private key file (the one without .pub)")
    mode = os.stat(path).st_mode
    if os.name == "posix" and mode & 0o077:
        raise BuildError(f"private key is readable by other users (mode {stat.filemode(mode)})", path=path,
                         fix=f"run: chmod 600 {os.fspath(path)}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise BuildError("private key is encrypted with a passphrase", path=path,
                         fix="use a key from `cuvil-pgc keygen` (unencrypted, protected by mode 0600)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise BuildError("not a PEM private key", path=path,
                         fix="create one with `cuvil-pgc keygen -o KEY`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise BuildError(f"private key is {type(key).__name__.lstrip('_')}, not Ed25519", path=path,
                         fix="create an Ed25519 key with `cuvil-pgc keygen -o KEY`")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    """Load a PEM (or OpenSSH) Ed25519 public key."""
    data = _read_key_file(path, "public")
    if b"PRIVATE KEY-----" in data:
        raise BuildError("this is a private key; verification needs only the public key", path=path,
                         fix=f"pass {os.fspath(path)}{PUBLIC_SUFFIX}, and keep the private key off this machine")
    try:
        key = serialization.load_ssh_public_key(data) if data.startswith(b"ssh-") \
            else serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise BuildError("not a PEM or OpenSSH public key", path=path,
                         fix="pass the KEY.pub file written by `cuvil-pgc keygen -o KEY`") from None
    if not isinstance(key, Ed25519PublicKey):
        raise BuildError(f"public key is {type(key).__name__.lstrip('_')}, not Ed25519", path=path,
                         fix="pass the KEY.pub file written by `cuvil-pgc keygen -o KEY`")
    return key


def _read_key_file(path: str | os.PathLike[str], kind: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_KEY_FILE_BYTES + 1)
    except FileNotFoundError:
        raise BuildError(f"{kind} key file does not exist", path=path,
                         fix="create a key pair with `cuvil-pgc keygen -o KEY`") from None
    except OSError as exc:
        raise BuildError(f"cannot read the {kind} key file ({exc.strerror})", path=path) from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise BuildError(f"too large to be a {kind} key ({MAX_KEY_FILE_BYTES} bytes at most)", path=path)
    return data.strip() + b"\n"


def sign_manifest(key: Ed25519PrivateKey, manifest_bytes: bytes) -> bytes:
    """The ``manifest.sig`` bytes for these exact manifest bytes."""
    signature = key.sign(SIGNING_CONTEXT + manifest_bytes)
    envelope = SignatureEnvelope(algorithm="ed25519", key_id=key_id(key.public_key()),
                                 signature=base64.b64encode(signature).decode("ascii"))
    return msgspec.json.encode(envelope) + b"\n"


def verify_manifest_signature(key: Ed25519PublicKey, manifest_bytes: bytes, signature_bytes: bytes,
                              *, path: str) -> str:
    """Check ``manifest.sig`` against ``key``; returns the key id, raises BuildError otherwise."""
    envelope = decode_envelope(signature_bytes, path=path)
    expected_id = key_id(key)
    if envelope.key_id != expected_id:
        raise BuildError(f"the build is signed by key {envelope.key_id}, not by the trusted key {expected_id}",
                         path=path, fix="verify with the public key of whoever signed it, or re-sign the build")
    try:
        signature = base64.b64decode(envelope.signature, validate=True)
        key.verify(signature, SIGNING_CONTEXT + manifest_bytes)
    except (InvalidSignature, binascii.Error, ValueError):
        raise BuildError("manifest signature is invalid: the manifest or its signature was altered",
                         path=path, fix="do not use this build; rebuild and re-sign it") from None
    return expected_id


def decode_envelope(signature_bytes: bytes, *, path: str) -> SignatureEnvelope:
    if len(signature_bytes) > MAX_SIGNATURE_BYTES:
        raise BuildError("manifest.sig is too large to be a signature", path=path,
                         fix="do not use this build; rebuild and re-sign it")
    try:
        return msgspec.json.decode(signature_bytes, type=SignatureEnvelope)
    except msgspec.DecodeError as exc:
        raise BuildError(f"manifest.sig is malformed ({exc})", path=path,
                         fix="do not use this build; rebuild and re-sign it") from None
