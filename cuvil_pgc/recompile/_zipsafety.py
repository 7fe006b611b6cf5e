"""Structural checks on a build's zip container, done before any member is read.

Order matters: the end-of-central-directory record is checked first (member count and directory
size) so that ``zipfile`` never parses a directory of millions of entries; then every directory
entry is checked against the limits (name allowlist, duplicates, regular files only, no
encryption, known compression, declared sizes, compression ratio, overlapping entries). Only
declared sizes are trusted here; the reader later counts the bytes it really decompresses.
"""

from __future__ import annotations

import stat
import struct
import zipfile
from dataclasses import dataclass
from typing import BinaryIO

from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile.manifest import check_member_name

GIB = 1 << 30
MAX_CENTRAL_DIRECTORY_BYTES = 64 << 20
MAX_COMPRESSION_RATIO = 200          # deflate tops out near 1030:1; real JSON rarely passes 50:1
RATIO_CHECK_MIN_BYTES = 1 << 20      # small members cannot be bombs, whatever their ratio
_EOCD = struct.Struct("<4s4H2LH")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_LOCAL_HEADER_BYTES = 30
_FIX = "do not load packages from unknown sources; rebuild it with cuvil-pgc"


@dataclass(frozen=True)
class BuildLimits:
    """What a reader accepts before reading anything (all sizes uncompressed, in bytes)."""

    max_member_bytes: int = 8 * GIB
    max_total_bytes: int = 32 * GIB
    max_members: int = 4096


def precheck_directory(fh: BinaryIO, path: str, limits: BuildLimits) -> None:
    """Read the end record and refuse too many members or a huge directory, before zipfile does."""
    fh.seek(0, 2)
    size = fh.tell()
    tail_len = min(size, _EOCD.size + 0xFFFF)
    fh.seek(size - tail_len)
    tail = fh.read(tail_len)
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) - at < _EOCD.size:
        raise BuildError("not a zip file, or truncated (no end-of-directory record)", path=path,
                         fix="copy the whole .cuvilpkg again; it was cut short or is another kind of file")
    _, disk, cd_disk, _, entries, cd_size, _, _ = _EOCD.unpack_from(tail, at)
    if disk or cd_disk:
        raise BuildError("multi-volume zip archives are not builds", path=path, fix=_FIX)
    if entries == 0xFFFF or cd_size == 0xFFFFFFFF:
        entries, cd_size = _zip64_counts(fh, size - tail_len + at, path)
    if entries > limits.max_members + 2:
        raise BuildError(f"{entries} members, more than the limit of {limits.max_members}", path=path, fix=_FIX)
    if cd_size > min(size, MAX_CENTRAL_DIRECTORY_BYTES):
        raise BuildError(f"zip directory of {cd_size} bytes does not fit the file", path=path, fix=_FIX)


def _zip64_counts(fh: BinaryIO, eocd_at: int, path: str) -> tuple[int, int]:
    if eocd_at < _ZIP64_LOCATOR.size:
        raise BuildError("truncated zip64 end record", path=path, fix=_FIX)
    fh.seek(eocd_at - _ZIP64_LOCATOR.size)
    sig, _, record_at, _ = _ZIP64_LOCATOR.unpack(fh.read(_ZIP64_LOCATOR.size))
    fh.seek(record_at)
    record = fh.read(_ZIP64_EOCD.size)
    if sig != b"PK\x06\x07" or len(record) != _ZIP64_EOCD.size or record[:4] != b"PK\x06\x06":
        raise BuildError("damaged zip64 end record", path=path, fix=_FIX)
    fields = _ZIP64_EOCD.unpack(record)
    return fields[7], fields[8]


def check_entries(zf: zipfile.ZipFile, path: str, limits: BuildLimits) -> dict[str, zipfile.ZipInfo]:
    """Check every directory entry; returns them by name. Raises BuildError on the first problem."""
    infos = zf.infolist()
    if len(infos) > limits.max_members + 2:
        raise BuildError(f"{len(infos)} members, more than the limit of {limits.max_members}", path=path, fix=_FIX)
    by_name: dict[str, zipfile.ZipInfo] = {}
    folded: set[str] = set()
    total = 0
    for info in infos:
        _check_entry(info, path, limits)
        if info.filename.casefold() in folded:
            raise BuildError(f"duplicate member name {info.filename!r}", path=path, fix=_FIX)
        folded.add(info.filename.casefold())
        by_name[info.filename] = info
        total += info.file_size
        if total > limits.max_total_bytes:
            raise BuildError(f"members add up to more than the limit of {limits.max_total_bytes} bytes",
                             path=path, fix="raise max_total_bytes if this build is expected to be that large")
    _check_overlaps(infos, getattr(zf, "start_dir", None), path)
    return by_name


def _check_entry(info: zipfile.ZipInfo, path: str, limits: BuildLimits) -> None:
    name = info.filename
    if info.orig_filename != name:
        raise BuildError(f"member name {info.orig_filename!r} contains a NUL byte or a path separator trick",
                         path=path, fix=_FIX)
    check_member_name(name, path=path)
    _check_file_type(info, path)
    if info.flag_bits & 0x1:
        raise BuildError(f"member {name!r} is encrypted", path=path, fix=_FIX)
    if info.compress_type not in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
        raise BuildError(f"member {name!r} uses zip compression method {info.compress_type}; "
                         "builds use stored or deflate only", path=path, fix=_FIX)
    if info.file_size > limits.max_member_bytes:
        raise BuildError(f"member {name!r} is {info.file_size} bytes, over the limit of "
                         f"{limits.max_member_bytes} bytes", path=path,
                         fix="raise max_member_bytes if this member is expected to be that large")
    if info.compress_type == zipfile.ZIP_STORED and info.compress_size != info.file_size:
        raise BuildError(f"member {name!r} is stored but its two sizes differ", path=path, fix=_FIX)
    if info.file_size > RATIO_CHECK_MIN_BYTES and \
            info.file_size > MAX_COMPRESSION_RATIO * max(info.compress_size, 1):
        raise BuildError(f"member {name!r} expands {info.file_size // max(info.compress_size, 1)}x "
                         f"(limit {MAX_COMPRESSION_RATIO}x): a decompression bomb", path=path, fix=_FIX)


def _check_file_type(info: zipfile.ZipInfo, path: str) -> None:
    name = info.filename
    if info.is_dir():
        raise BuildError(f"member {name!r} is a directory entry; builds hold files only", path=path, fix=_FIX)
    if info.create_system == 3:   # Unix: st_mode in the high 16 bits
        kind = stat.S_IFMT(info.external_attr >> 16)
        if kind == stat.S_IFLNK:
            raise BuildError(f"member {name!r} is a symbolic link", path=path, fix=_FIX)
        if kind not in (0, stat.S_IFREG):
            raise BuildError(f"member {name!r} is not a regular file (mode {oct(kind)})", path=path, fix=_FIX)


def _check_overlaps(infos: list[zipfile.ZipInfo], start_dir: int | None, path: str) -> None:
    ordered = sorted(infos, key=lambda i: i.header_offset)
    bounds = [i.header_offset for i in ordered[1:]] + [start_dir]
    for info, limit in zip(ordered, bounds, strict=True):
        end = info.header_offset + _LOCAL_HEADER_BYTES + len(info.filename.encode()) + info.compress_size
        if info.header_offset < 0 or (limit is not None and end > limit):
            raise BuildError(f"member {info.filename!r} overlaps the next entry (a zip bomb or a damaged file)",
                             path=path, fix=_FIX)
