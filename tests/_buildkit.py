"""Helpers shared by the build container, signing and store tests: make, rezip and craft builds."""

from __future__ import annotations

import hashlib
import os
import struct
import zipfile
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

from cuvil_pgc.recompile import signing
from cuvil_pgc.recompile.manifest import (
    FORMAT_VERSION,
    Fingerprint,
    Manifest,
    MemberDigest,
    encode_manifest,
)
from cuvil_pgc.recompile.package import BuildWriter

FINGERPRINT = Fingerprint(torch="2.13.0", python="3.11.9", platform="linux-x86_64", cpu_isa="AVX2", device="cpu")
CREATED = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


def default_members(version: int = 1) -> dict[str, bytes]:
    return {
        "plan.json": b'{"regions": [{"path": "encoder", "chosen": "aoti"}], "v": %d}' % version,
        "aoti/encoder.pt2": bytes(range(256)) * 40 + b"v%d" % version,
        "weights/model.safetensors": hashlib.sha256(b"w%d" % version).digest() * 300,
    }


def make_build(path: Path, key=None, *, name: str = "mlp", version: int = 1,
               members: dict[str, bytes] | None = None) -> Path:
    members = default_members(version) if members is None else members
    with BuildWriter(path, name, version, fingerprint=FINGERPRINT, model_hash="ab" * 32,
                     trace_hashes=["cd" * 32], created=CREATED) as writer:
        for member, data in members.items():
            writer.add_bytes(member, data)
        writer.close(key)
    return path


def read_entries(path: Path) -> list[tuple[zipfile.ZipInfo, bytes]]:
    with zipfile.ZipFile(path) as zf:
        return [(info, zf.read(info)) for info in zf.infolist()]


def write_entries(path: Path, entries: list[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    """Write a zip exactly as given (valid CRCs), bypassing every check of BuildWriter."""
    with zipfile.ZipFile(path, "w") as zf:
        for info, data in entries:
            zf.writestr(info, data)
    return path


def rezip(src: Path, dst: Path, transform: Callable[[list[tuple[zipfile.ZipInfo, bytes]]], list]) -> Path:
    return write_entries(dst, transform(read_entries(src)))


def manifest_for(members: dict[str, bytes], *, name: str = "mlp", version: int = 1,
                 format_version: int = FORMAT_VERSION) -> bytes:
    digests = {m: MemberDigest(sha256=hashlib.sha256(d).hexdigest(), size=len(d)) for m, d in members.items()}
    manifest = Manifest(format_version=format_version, name=name, version=version, created=CREATED,
                        fingerprint=FINGERPRINT, model_hash="", trace_hashes=[], members=digests)
    return encode_manifest(manifest)


def craft(path: Path, entries: list[tuple[zipfile.ZipInfo | str, bytes]], key=None, **manifest_kw) -> Path:
    """A zip whose (signed) manifest honestly lists ``entries``: only structural checks can refuse it."""
    members = {(e.filename if isinstance(e, zipfile.ZipInfo) else e): d for e, d in entries}
    manifest = manifest_for(members, **manifest_kw)
    extra = [("manifest.json", manifest)]
    if key is not None:
        extra.append(("manifest.sig", signing.sign_manifest(key, manifest)))
    return write_entries(path, list(entries) + extra)


def data_offset(path: Path, member: str) -> int:
    """Absolute offset of a member's (compressed) data in the file."""
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(member)
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        header = fh.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len


def flip_byte(path: Path, offset: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0x01]))


def files_under(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*")) if directory.exists() else []


def keypair(directory: Path, stem: str = "key") -> tuple[Path, Path]:
    os.makedirs(directory, exist_ok=True)
    return signing.generate_keypair(directory / stem)
