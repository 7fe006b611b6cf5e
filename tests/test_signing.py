"""Ed25519 key files and manifest signatures."""

from __future__ import annotations

import base64
import os
import stat

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile import signing

MANIFEST = b'{"format_version": 1, "name": "mlp", "version": 3}\n'


@pytest.fixture
def pair(tmp_path):
    return signing.generate_keypair(tmp_path / "release.key")


def test_generate_keypair_modes_and_files(pair, tmp_path):
    private, public = pair
    assert public == tmp_path / "release.key.pub"
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    loaded = signing.load_private_key(private)
    assert signing.key_id(loaded.public_key()) == signing.key_id(signing.load_public_key(public))


def test_generate_keypair_never_overwrites(pair, tmp_path):
    private, public = pair
    before = private.read_bytes()
    with pytest.raises(BuildError, match="already exists"):
        signing.generate_keypair(private)
    assert private.read_bytes() == before
    public.unlink()
    with pytest.raises(BuildError, match="already exists"):   # the private key alone blocks it too
        signing.generate_keypair(private)
    (tmp_path / "other.pub").write_text("x")
    with pytest.raises(BuildError, match="already exists"):   # so does a stray public key
        signing.generate_keypair(tmp_path / "other")
    assert not (tmp_path / "other").exists()


def test_generate_keypair_in_missing_directory(tmp_path):
    with pytest.raises(BuildError, match="cannot create"):
        signing.generate_keypair(tmp_path / "nope" / "key")


def test_sign_and_verify(pair):
    private, public = pair
    sig = signing.sign_manifest(signing.load_private_key(private), MANIFEST)
    key = signing.load_public_key(public)
    assert signing.verify_manifest_signature(key, MANIFEST, sig, path="b") == signing.key_id(key)


def test_altered_manifest_or_signature_fails(pair):
    private, public = pair
    key = signing.load_public_key(public)
    sig = signing.sign_manifest(signing.load_private_key(private), MANIFEST)
    with pytest.raises(BuildError, match="signature is invalid"):
        signing.verify_manifest_signature(key, MANIFEST.replace(b"3", b"4"), sig, path="b")
    envelope = signing.decode_envelope(sig, path="b")
    forged = sig.replace(envelope.signature.encode(), b"A" * 86 + b"==")
    with pytest.raises(BuildError, match="signature is invalid"):
        signing.verify_manifest_signature(key, MANIFEST, forged, path="b")
    with pytest.raises(BuildError, match="malformed"):
        signing.verify_manifest_signature(key, MANIFEST, sig + b"{", path="b")


def test_forged_key_id_does_not_help(pair):
    """The envelope's key id is a hint for messages; trust comes from the verifying key only."""
    _, public = pair
    key = signing.load_public_key(public)
    intruder = Ed25519PrivateKey.generate()
    sig = signing.sign_manifest(intruder, MANIFEST)
    forged = sig.replace(signing.key_id(intruder.public_key()).encode(), signing.key_id(key).encode())
    with pytest.raises(BuildError, match="signature is invalid"):
        signing.verify_manifest_signature(key, MANIFEST, forged, path="b")
    with pytest.raises(BuildError, match="signed by key"):
        signing.verify_manifest_signature(key, MANIFEST, sig, path="b")


def test_signature_is_domain_separated(pair):
    """A signature over the bare manifest bytes (e.g. made for another purpose) is not accepted."""
    private, public = pair
    raw_key = signing.load_private_key(private)
    bare = signing.sign_manifest(raw_key, MANIFEST)
    envelope = signing.decode_envelope(bare, path="b")
    other = base64.b64encode(raw_key.sign(MANIFEST)).decode()
    with pytest.raises(BuildError, match="signature is invalid"):
        signing.verify_manifest_signature(signing.load_public_key(public), MANIFEST,
                                          bare.replace(envelope.signature.encode(), other.encode()), path="b")


def test_private_key_refusals(pair, tmp_path):
    private, public = pair
    with pytest.raises(BuildError, match="public key, not a private key"):
        signing.load_private_key(public)
    os.chmod(private, 0o644)
    with pytest.raises(BuildError, match="readable by other users.*chmod 600"):
        signing.load_private_key(private)
    with pytest.raises(BuildError, match="does not exist"):
        signing.load_private_key(tmp_path / "missing")
    garbage = _write(tmp_path / "garbage", b"hello", 0o600)
    with pytest.raises(BuildError, match="not a PEM private key"):
        signing.load_private_key(garbage)


def test_encrypted_and_non_ed25519_private_keys(tmp_path):
    ed = Ed25519PrivateKey.generate()
    encrypted = _write(tmp_path / "enc", ed.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"pw")), 0o600)
    with pytest.raises(BuildError, match="encrypted"):
        signing.load_private_key(encrypted)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    ec_path = _write(tmp_path / "ec", ec_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), 0o600)
    with pytest.raises(BuildError, match="not Ed25519"):
        signing.load_private_key(ec_path)
    ec_pub = _write(tmp_path / "ec.pub", ec_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
    with pytest.raises(BuildError, match="not Ed25519"):
        signing.load_public_key(ec_pub)


def test_public_key_refusals_and_openssh(pair, tmp_path):
    private, public = pair
    with pytest.raises(BuildError, match="private key; verification needs only the public key"):
        signing.load_public_key(private)
    with pytest.raises(BuildError, match="not a PEM or OpenSSH public key"):
        signing.load_public_key(_write(tmp_path / "junk.pub", b"-----BEGIN PUBLIC KEY-----\nxx\n", 0o644))
    with pytest.raises(BuildError, match="too large"):
        signing.load_public_key(_write(tmp_path / "big.pub", b"x" * 20000, 0o644))
    key = signing.load_public_key(public)
    ssh = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    assert signing.key_id(signing.load_public_key(_write(tmp_path / "id.pub", ssh, 0o644))) == signing.key_id(key)


@given(st.binary(max_size=400))
def test_decode_envelope_raises_only_build_error(data):
    try:
        envelope = signing.decode_envelope(data, path="b")
    except BuildError:
        return
    assert envelope.algorithm == "ed25519"


def _write(path, data: bytes, mode: int):
    path.write_bytes(data)
    os.chmod(path, mode)
    return path
