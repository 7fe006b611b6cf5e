"""The .cuvilpkg container: round trip, and every refusal of issue 8 item 2 (no side effects)."""

from __future__ import annotations

import base64
import hashlib
import os
import stat
import zipfile
import zlib
from datetime import datetime
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile import signing
from cuvil_pgc.recompile.manifest import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    check_member_name,
    decode_manifest,
    sha256_file,
)
from cuvil_pgc.recompile.package import BuildWriter, open_build
from tests._buildkit import (
    FINGERPRINT,
    craft,
    data_offset,
    default_members,
    files_under,
    flip_byte,
    keypair,
    make_build,
    manifest_for,
    read_entries,
    rezip,
    write_entries,
)


@pytest.fixture
def keys(tmp_path):
    private, public = keypair(tmp_path / "keys")
    return signing.load_private_key(private), signing.load_public_key(public)


@pytest.fixture
def signed(tmp_path, keys):
    return make_build(tmp_path / "mlp.cuvilpkg", keys[0])


def refused(path, *args, match: str, **kwargs) -> BuildError:
    with pytest.raises(BuildError, match=match) as info:
        open_build(path, *args, **kwargs)
    assert str(path) in str(info.value)
    return info.value


# --- round trip ---------------------------------------------------------------------------------------

def test_round_trip_signed(signed, keys, tmp_path):
    with open_build(signed, keys[1], require_signature=True) as build:
        assert build.members() == sorted(default_members())
        for name, data in default_members().items():
            assert build.read_bytes(name) == data
        m = build.manifest
        assert (m.name, m.version, m.fingerprint, m.trace_hashes) == ("mlp", 1, FINGERPRINT, ["cd" * 32])
        assert build.signed and build.signature_verified
        assert build.key_id == signing.key_id(keys[1])
        out = build.extract_all(tmp_path / "out")
    assert {n: p.read_bytes() for n, p in out.items()} == default_members()
    assert files_under(tmp_path / "out") == ["aoti", "aoti/encoder.pt2", "plan.json", "weights",
                                             "weights/model.safetensors"]


def test_public_key_may_be_a_path(signed, tmp_path):
    with open_build(signed, tmp_path / "keys" / "key.pub") as build:
        assert build.signature_verified


def test_unsigned_build_opens_without_key_only(tmp_path, keys):
    path = make_build(tmp_path / "u.cuvilpkg")
    with open_build(path) as build:
        assert not build.signed and not build.signature_verified and build.key_id is None
    refused(path, keys[1], match="not signed")


def test_signed_build_without_key_is_integrity_checked_but_unverified(signed):
    with open_build(signed) as build:
        assert build.signed and not build.signature_verified


def test_require_signature_without_key_is_refused(signed):
    refused(signed, require_signature=True, match="no public key")


def test_writer_is_deterministic(tmp_path, keys):
    a = make_build(tmp_path / "a.cuvilpkg", keys[0]).read_bytes()
    b = make_build(tmp_path / "b.cuvilpkg", keys[0]).read_bytes()
    assert a == b


def test_add_file_streams_and_hashes(tmp_path):
    source = tmp_path / "blob.bin"
    source.write_bytes(bytes(range(256)) * 5000)
    with BuildWriter(tmp_path / "f.cuvilpkg", "mlp", 3, fingerprint=FINGERPRINT) as writer:
        digest = writer.add_file("aoti/blob.pt2", source)
        writer.add_file("notes.txt", _text_file(tmp_path))
    assert digest.size == source.stat().st_size
    with open_build(tmp_path / "f.cuvilpkg") as build:
        assert build.read_bytes("aoti/blob.pt2") == source.read_bytes()
        assert build.manifest.version == 3


def _text_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n" * 100)
    return path


# --- writer refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["/abs", "../up", "a/../b", "a\\b", "", ".hidden", "a//b", MANIFEST_NAME,
                                  SIGNATURE_NAME, "C:/x", "tab\tname"])
def test_writer_refuses_bad_member_names(tmp_path, name):
    with BuildWriter(tmp_path / "x.cuvilpkg", "mlp", 1, fingerprint=FINGERPRINT) as writer:
        with pytest.raises(BuildError, match="member name"):
            writer.add_bytes(name, b"x")
        writer.abort()
    assert files_under(tmp_path) == []


def test_writer_refuses_duplicates_case_insensitively(tmp_path):
    writer = BuildWriter(tmp_path / "x.cuvilpkg", "mlp", 1, fingerprint=FINGERPRINT)
    writer.add_bytes("Plan.json", b"1")
    with pytest.raises(BuildError, match="already added"):
        writer.add_bytes("plan.json", b"2")
    writer.abort()


@pytest.mark.parametrize(("name", "version"), [("../x", 1), ("", 1), ("mlp", 0), ("mlp", True), ("mlp", "2")])
def test_writer_refuses_bad_name_or_version(tmp_path, name, version):
    with pytest.raises(BuildError):
        BuildWriter(tmp_path / "x.cuvilpkg", name, version, fingerprint=FINGERPRINT)
    assert files_under(tmp_path) == []


def test_writer_exception_keeps_previous_file(tmp_path):
    path = make_build(tmp_path / "m.cuvilpkg")
    before = path.read_bytes()
    with pytest.raises(RuntimeError), BuildWriter(path, "mlp", 2, fingerprint=FINGERPRINT) as writer:
        writer.add_bytes("plan.json", b"{}")
        raise RuntimeError("recompile failed")
    assert path.read_bytes() == before
    assert files_under(tmp_path) == ["m.cuvilpkg"]


def test_writer_refuses_malformed_header_before_writing(tmp_path):
    with pytest.raises(BuildError, match="header is invalid"):
        BuildWriter(tmp_path / "x.cuvilpkg", "mlp", 1, fingerprint=FINGERPRINT, model_hash="XYZ")
    with pytest.raises(BuildError, match="header is invalid"):
        BuildWriter(tmp_path / "x.cuvilpkg", "mlp", 1, fingerprint=FINGERPRINT, trace_hashes=["AB" * 32])
    with pytest.raises(BuildError, match="timezone-aware"):
        BuildWriter(tmp_path / "x.cuvilpkg", "mlp", 1, fingerprint=FINGERPRINT, created=datetime(2026, 1, 1))
    with pytest.raises(BuildError, match="fingerprint is invalid"):
        BuildWriter(tmp_path / "x.cuvilpkg", "mlp", 1, fingerprint={"torch": "2.13"})
    assert files_under(tmp_path) == []


def test_sha256_file_matches_hashlib(tmp_path):
    path = tmp_path / "run.trace.json"
    path.write_bytes(b"{}" * 700_000)
    assert sha256_file(path) == hashlib.sha256(path.read_bytes()).hexdigest()


@settings(max_examples=300)
@given(st.text(alphabet=st.sampled_from("ab./\\:-_+\x00 C~"), max_size=24) | st.text(max_size=12))
def test_accepted_member_names_stay_inside_the_destination(name):
    try:
        check_member_name(name, path="p")
    except BuildError:
        return
    root = Path("/srv/extract")
    assert not os.path.isabs(name) and os.path.normpath(name) == name
    assert os.path.normpath(root / name).startswith(str(root) + "/")


# --- tampering: flipped bytes, member set, mix-and-match, keys ------------------------------------------

@pytest.mark.parametrize("member", [*default_members(), MANIFEST_NAME, SIGNATURE_NAME])
def test_flipped_byte_in_any_member_is_refused(signed, keys, member):
    flip_byte(signed, data_offset(signed, member) + 5)
    error = refused(signed, keys[1], match="corrupt|sha256|signature|manifest")
    assert member in str(error)


def test_altered_member_with_valid_crc_is_refused(signed, keys, tmp_path):
    def alter(entries):
        return [(i, d[:-1] + b"X" if i.filename == "aoti/encoder.pt2" else d) for i, d in entries]
    path = rezip(signed, tmp_path / "t.cuvilpkg", alter)
    refused(path, keys[1], match="'aoti/encoder.pt2' does not match its sha256")
    refused(path, match="'aoti/encoder.pt2' does not match its sha256")   # integrity holds without key too


def test_rewritten_manifest_fails_the_signature(signed, keys, tmp_path):
    """An attacker alters a member and fixes its digest in the manifest: only the signature catches it."""
    members = default_members()
    members["plan.json"] = b'{"regions": []}'

    def alter(entries):
        sig = dict((i.filename, d) for i, d in entries)[SIGNATURE_NAME]
        return [(n, d) for n, d in members.items()] + [(MANIFEST_NAME, manifest_for(members)),
                                                       (SIGNATURE_NAME, sig)]
    path = rezip(signed, tmp_path / "t.cuvilpkg", alter)
    refused(path, keys[1], match="signature is invalid")


def test_altered_signature_is_refused(signed, keys, tmp_path):
    def alter(entries):
        out = []
        for info, data in entries:
            if info.filename == SIGNATURE_NAME:
                env = signing.decode_envelope(data, path="x")
                sig = bytearray(base64.b64decode(env.signature))
                sig[0] ^= 1
                data = data.replace(env.signature.encode(), base64.b64encode(bytes(sig)))
            out.append((info, data))
        return out
    refused(rezip(signed, tmp_path / "t.cuvilpkg", alter), keys[1], match="signature is invalid")


def test_stripped_signature_is_refused_when_a_key_is_given(signed, keys, tmp_path):
    path = rezip(signed, tmp_path / "t.cuvilpkg", lambda e: [x for x in e if x[0].filename != SIGNATURE_NAME])
    refused(path, keys[1], match="not signed")


def test_member_added_is_refused(signed, keys, tmp_path):
    path = rezip(signed, tmp_path / "t.cuvilpkg", lambda e: e + [("extra/payload.py", b"import os")])
    refused(path, keys[1], match="not in the manifest: extra/payload.py")


def test_member_removed_is_refused(signed, keys, tmp_path):
    path = rezip(signed, tmp_path / "t.cuvilpkg", lambda e: [x for x in e if x[0].filename != "plan.json"])
    refused(path, keys[1], match="missing from the package: plan.json")


def test_member_renamed_is_refused(signed, keys, tmp_path):
    def rename(entries):
        return [("plan2.json" if i.filename == "plan.json" else i, d) for i, d in entries]
    refused(rezip(signed, tmp_path / "t.cuvilpkg", rename), keys[1],
            match="not in the manifest: plan2.json; missing from the package: plan.json")


def test_manifest_from_another_signed_build_is_refused(signed, keys, tmp_path):
    """Mix-and-match: v2's signed manifest + signature with v1's members."""
    other = make_build(tmp_path / "v2.cuvilpkg", keys[0], version=2)
    swapped = {i.filename: d for i, d in read_entries(other) if i.filename in (MANIFEST_NAME, SIGNATURE_NAME)}
    path = rezip(signed, tmp_path / "mix.cuvilpkg",
                 lambda e: [(i, swapped.get(i.filename, d)) for i, d in e])
    refused(path, keys[1], match="does not match its sha256")


def test_other_build_in_place_of_expected_one_is_refused(keys, tmp_path):
    """A whole, validly signed v1 put where v2 is expected (a store file swap) is refused."""
    v1 = make_build(tmp_path / "v1.cuvilpkg", keys[0], version=1)
    refused(v1, keys[1], expect_name="mlp", expect_version=2, match="describes mlp v1")
    refused(v1, keys[1], expect_name="bert", match="describes mlp v1")


def test_wrong_key_is_refused(signed, tmp_path):
    _, other_public = keypair(tmp_path / "other")
    error = refused(signed, other_public, match="signed by key [0-9a-f]{16}, not by the trusted key")
    assert signing.key_id(signing.load_public_key(other_public)) in str(error)


# --- zip structure -----------------------------------------------------------------------------------------

def _info(name: str, mode: int = 0o100644) -> zipfile.ZipInfo:
    info = zipfile.ZipInfo(name)
    info.create_system = 3
    info.external_attr = mode << 16
    return info


@pytest.mark.parametrize(("name", "match"), [
    ("/etc/cron.d/evil", "absolute path"),
    ("../../.bashrc", r"'\.\.' component"),
    ("plans/../../x", r"'\.\.' component"),
    ("a\\..\\..\\x", "backslash"),
    ("C:/evil.dll", "absolute path"),
    (".hidden", "hidden component"),
])
def test_signed_package_with_unsafe_name_is_refused(tmp_path, keys, name, match):
    path = craft(tmp_path / "bad.cuvilpkg", [("plan.json", b"{}"), (_info(name), b"x")], keys[0])
    refused(path, keys[1], match=match)


def test_nul_in_name_is_refused(tmp_path, keys):
    info = _info("plan.json")
    info.filename = "plan.json\x00.exe"   # ZipInfo() would cut it at the NUL; a hostile writer does not
    path = craft(tmp_path / "bad.cuvilpkg", [(info, b"x")], keys[0])
    refused(path, keys[1], match="NUL byte")


def test_symlink_member_is_refused(tmp_path, keys):
    path = craft(tmp_path / "bad.cuvilpkg", [(_info("aoti/x.pt2", stat.S_IFLNK | 0o777), b"/etc/passwd")], keys[0])
    refused(path, keys[1], match="symbolic link")


def test_directory_and_device_members_are_refused(tmp_path, keys):
    path = craft(tmp_path / "d.cuvilpkg", [(_info("aoti/", stat.S_IFDIR | 0o755), b"")], keys[0])
    refused(path, keys[1], match="directory entry|member name")
    path = craft(tmp_path / "c.cuvilpkg", [(_info("dev", stat.S_IFCHR | 0o644), b"")], keys[0])
    refused(path, keys[1], match="not a regular file")


def test_duplicate_member_names_are_refused(tmp_path, keys):
    with pytest.warns(UserWarning):
        path = craft(tmp_path / "dup.cuvilpkg", [("plan.json", b"{}"), ("plan.json", b"[]")], keys[0])
    refused(path, keys[1], match="duplicate member name")
    path = craft(tmp_path / "case.cuvilpkg", [("plan.json", b"{}"), ("PLAN.json", b"[]")], keys[0])
    refused(path, keys[1], match="duplicate member name")


def test_member_over_size_limit_is_refused_before_reading(signed, keys):
    error = refused(signed, keys[1], max_member_bytes=1000, match="over the limit of 1000 bytes")
    assert "aoti/encoder.pt2" in str(error) or "weights/model.safetensors" in str(error)
    refused(signed, keys[1], max_total_bytes=5000, match="add up to more than")
    refused(signed, keys[1], max_members=2, match="more than the limit of 2")


def test_compression_bomb_is_refused(tmp_path, keys):
    info = _info("weights/zeros.bin")
    info.compress_type = zipfile.ZIP_DEFLATED
    path = craft(tmp_path / "bomb.cuvilpkg", [(info, bytes(8 << 20))], keys[0])
    refused(path, keys[1], match="decompression bomb")


def test_overlapping_entries_are_refused(tmp_path, keys):
    """Fifield-style overlap: b.bin's local header lies inside a.bin's data; names and CRCs all valid."""
    data_b = b"B" * 100
    inner = _info("b.bin")
    inner.CRC, inner.compress_size, inner.file_size = zlib.crc32(data_b), len(data_b), len(data_b)
    data_a = inner.FileHeader() + data_b
    manifest = manifest_for({"a.bin": data_a, "b.bin": data_b})
    path = tmp_path / "overlap.cuvilpkg"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(_info("a.bin"), data_a)
        inner.header_offset = 30 + len("a.bin")
        zf.filelist.append(inner)
        zf.NameToInfo[inner.filename] = inner
        zf.writestr(MANIFEST_NAME, manifest)
        zf.writestr(SIGNATURE_NAME, signing.sign_manifest(keys[0], manifest))
    refused(path, keys[1], match="'a.bin' overlaps the next entry")


def test_unknown_format_version_is_refused(tmp_path, keys):
    path = craft(tmp_path / "v9.cuvilpkg", [("plan.json", b"{}")], keys[0], format_version=9)
    refused(path, keys[1], match="unknown build format version 9")


def test_manifest_with_unknown_field_is_refused(tmp_path, keys):
    def add_field(entries):
        return [(i, d.replace(b'"name"', b'"evil": 1, "name"', 1) if i.filename == MANIFEST_NAME else d)
                for i, d in entries]
    path = rezip(make_build(tmp_path / "u.cuvilpkg"), tmp_path / "t.cuvilpkg", add_field)
    refused(path, match="manifest schema")


def test_missing_manifest_is_refused(tmp_path):
    path = write_entries(tmp_path / "n.cuvilpkg", [("plan.json", b"{}")])
    refused(path, match="no manifest.json")


@pytest.mark.parametrize("keep", [0, 10, 200, -1, -22, -40])
def test_truncated_zip_is_refused(signed, keys, keep):
    data = signed.read_bytes()
    signed.write_bytes(data[:keep] if keep >= 0 else data[:len(data) + keep])
    refused(signed, keys[1], match="zip|corrupt|truncated|damaged")


def test_zip64_end_record_is_read_and_limited(tmp_path, keys, monkeypatch):
    monkeypatch.setattr(zipfile, "ZIP_FILECOUNT_LIMIT", 1)   # makes zipfile write the zip64 end records
    path = make_build(tmp_path / "z64.cuvilpkg", keys[0])
    assert b"PK\x06\x06" in path.read_bytes()
    with open_build(path, keys[1]) as build:
        assert build.read_bytes("plan.json") == default_members()["plan.json"]
    refused(path, keys[1], max_members=2, match="more than the limit of 2")


def test_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe.cuvilpkg"
    os.mkfifo(fifo)
    refused(fifo, match="not a regular file")


def test_not_a_zip_is_refused(tmp_path, keys):
    path = tmp_path / "trace.cuvilpkg"
    path.write_text('{"traceEvents": []}')
    refused(path, keys[1], match="not a zip file")
    refused(tmp_path / "absent.cuvilpkg", match="does not exist")
    refused(tmp_path, match="not a regular file|cannot open")


# --- after verification -----------------------------------------------------------------------------------

def test_change_after_verification_is_caught_and_leaves_nothing(signed, keys, tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    with open_build(signed, keys[1]) as build:
        flip_byte(signed, data_offset(signed, "weights/model.safetensors") + 7)
        with pytest.raises(BuildError, match="weights/model.safetensors"):
            build.extract_all(dest)
        with pytest.raises(BuildError, match="weights/model.safetensors"):
            build.read_bytes("weights/model.safetensors")
        with pytest.raises(BuildError, match="no member 'nope'"):
            build.read_bytes("nope")
    assert files_under(dest) == []


# --- property tests: any damage is a BuildError, never another exception or wrong content ---------------

@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    directory = tmp_path_factory.mktemp("pristine")
    private, public = keypair(directory)
    path = make_build(directory / "p.cuvilpkg", signing.load_private_key(private),
                      members={"plan.json": b'{"a": 1}' * 50, "aoti/r.pt2": bytes(range(256)) * 4})
    return path.read_bytes(), signing.load_public_key(public), {"plan.json": b'{"a": 1}' * 50,
                                                               "aoti/r.pt2": bytes(range(256)) * 4}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.floats(0, 1, exclude_max=True), mask=st.integers(1, 255))
def test_any_byte_flip_is_refused_or_harmless(tmp_path, pristine, position, mask):
    data, public, members = pristine
    damaged = bytearray(data)
    damaged[int(position * len(data))] ^= mask
    path = tmp_path / "d.cuvilpkg"
    path.write_bytes(bytes(damaged))
    try:
        with open_build(path, public) as build:
            assert {n: build.read_bytes(n) for n in build.members()} == members
    except BuildError:
        pass


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(1, 2000))
def test_any_truncation_is_refused(tmp_path, pristine, cut):
    data, public, _ = pristine
    path = tmp_path / "t.cuvilpkg"
    path.write_bytes(data[:max(0, len(data) - cut)])
    with pytest.raises(BuildError):
        open_build(path, public)


@given(st.binary(max_size=300) | st.from_regex(rb'\{"format_version": 1[^}]{0,80}\}', fullmatch=True))
def test_decode_manifest_raises_only_build_error(data):
    with pytest.raises(BuildError):
        decode_manifest(data, path="x/manifest.json")


def test_deflated_members_are_stored_when_they_would_look_like_bombs(tmp_path):
    with BuildWriter(tmp_path / "z.cuvilpkg", "mlp", 1, fingerprint=FINGERPRINT) as writer:
        writer.add_bytes("zeros.json", bytes(4 << 20))
        writer.add_bytes("text.json", b'{"k": "%d"}' * 1000 % tuple(range(1000)), compress=True)
    with zipfile.ZipFile(tmp_path / "z.cuvilpkg") as zf:
        assert zf.getinfo("zeros.json").compress_type == zipfile.ZIP_STORED
        assert zf.getinfo("text.json").compress_type == zipfile.ZIP_DEFLATED
    with open_build(tmp_path / "z.cuvilpkg") as build:
        assert build.read_bytes("zeros.json") == bytes(4 << 20)
