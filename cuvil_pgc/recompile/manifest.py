"""The manifest of a build (``manifest.json`` inside a ``.cuvilpkg``) and the rules for names in it.

The manifest is the one document a signature covers. It binds the build's name and version and
lists the sha256 and size of every other member, so a verified manifest pins the whole package
(sigstore model-signing's model: a signed manifest of file digests). Decoding is strict: unknown
fields, wrong types, malformed digests or member names are refused, and a format version this code
does not know is refused with its own message before the schema is applied.

Member names follow one allowlist, used by the writer and the reader alike: ``/``-separated
components of ``[A-Za-z0-9_][A-Za-z0-9._+-]*``, so no absolute path, no ``.``/``..``, no
backslash, drive letter, control character or hidden file can appear.
"""

from __future__ import annotations

import hashlib
import os
import platform
import re
import sys
from datetime import datetime, timezone
from typing import Annotated

import msgspec

from cuvil_pgc.errors import BuildError

# 2: structural hashes without the module's import name (cuvil_pgc._structure v2), the thread
# count the build was measured at and the model's class name; version 1 builds carry hashes that no longer compare: rebuild them.
FORMAT_VERSION = 2
KNOWN_FORMAT_VERSIONS = (2,)
MAX_THREADS = 4096
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"
RESERVED_NAMES = (MANIFEST_NAME, SIGNATURE_NAME)
BUILD_SUFFIX = ".cuvilpkg"

MAX_NAME_CHARS = 255
MAX_NAME_DEPTH = 16
_COMPONENT = r"[A-Za-z0-9_][A-Za-z0-9._+-]*"
_MEMBER_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*")
BUILD_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_SHA256 = r"^[0-9a-f]{64}\Z"

Sha256 = Annotated[str, msgspec.Meta(pattern=_SHA256)]
MemberName = Annotated[str, msgspec.Meta(pattern=rf"^{_MEMBER_RE.pattern}\Z", max_length=MAX_NAME_CHARS)]
BuildName = Annotated[str, msgspec.Meta(pattern=rf"^{BUILD_NAME_RE.pattern}\Z")]
ShortText = Annotated[str, msgspec.Meta(max_length=256)]


class Fingerprint(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Where a build was made: load_build compares it with the machine that loads it."""

    torch: ShortText
    python: ShortText
    platform: ShortText
    cpu_isa: ShortText
    device: ShortText

    def mismatches(self, other: Fingerprint) -> list[str]:
        """Fields that differ, as ``"field: built X, here Y"`` lines (empty when compatible)."""
        return [f"{field}: built {getattr(self, field)!r}, here {getattr(other, field)!r}"
                for field in self.__struct_fields__ if getattr(self, field) != getattr(other, field)]


class MemberDigest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    sha256: Sha256
    size: Annotated[int, msgspec.Meta(ge=0)]


class EngineTarget(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What the build's TensorRT engines were built for: an engine runs only on that GPU model and
    TensorRT version, so ``load_build`` compares them with this machine before any engine is parsed."""

    version: ShortText        # torch_tensorrt's version
    gpu: ShortText            # torch.cuda.get_device_name()

    def mismatches(self, here: EngineTarget) -> list[str]:
        return [f"{name}: built {getattr(self, name)!r}, here {getattr(here, name)!r}"
                for name in self.__struct_fields__ if getattr(self, name) != getattr(here, name)]


class Manifest(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """Contents of ``manifest.json``; ``members`` lists every member except manifest and signature."""

    format_version: int
    name: BuildName
    version: Annotated[int, msgspec.Meta(ge=1, le=2**53)]
    created: datetime
    fingerprint: Fingerprint
    model_hash: Annotated[str, msgspec.Meta(pattern=r"^([0-9a-f]{64})?\Z")]
    trace_hashes: list[Sha256]
    members: dict[MemberName, MemberDigest]
    #: torch threads the search measured at (torch.get_num_threads()); 0: not recorded
    threads: Annotated[int, msgspec.Meta(ge=0, le=MAX_THREADS)] = 0
    #: ``__qualname__`` of the model's class: a build for another model is refused by name
    model_class: ShortText = ""
    #: sha256 of the model's module tree (submodule names and classes, ``_structure.module_tree_digest``):
    #: a build for another architecture with the same class name is refused; "" in older builds
    model_tree: Annotated[str, msgspec.Meta(pattern=r"^([0-9a-f]{64})?\Z")] = ""
    #: the GPU and TensorRT version of the build's TensorRT engines; absent (not written) in builds
    #: without any, and in older builds, whose plan.json records them per choice instead
    tensorrt: EngineTarget | msgspec.UnsetType = msgspec.UNSET


class _VersionProbe(msgspec.Struct):
    format_version: int


def encode_manifest(manifest: Manifest) -> bytes:
    """Deterministic, indented JSON: the exact bytes that are stored and signed."""
    return msgspec.json.format(msgspec.json.encode(manifest, order="deterministic"), indent=2) + b"\n"


def decode_manifest(data: bytes, *, path: str) -> Manifest:
    """Parse manifest bytes strictly; raises BuildError naming ``path`` on any problem."""
    from cuvil_pgc.recompile._json_bounds import check_json_bounds

    check_json_bounds(data, what=MANIFEST_NAME, path=path)     # no RecursionError from a deep document
    try:
        probe = msgspec.json.decode(data, type=_VersionProbe)
    except msgspec.DecodeError as exc:
        raise BuildError(f"{MANIFEST_NAME} is not a valid manifest ({exc})", path=path,
                         fix="the package is damaged or was not written by cuvil-pgc; rebuild it") from None
    if probe.format_version not in KNOWN_FORMAT_VERSIONS:
        raise BuildError(f"unknown build format version {probe.format_version} "
                         f"(this cuvil-pgc reads {', '.join(map(str, KNOWN_FORMAT_VERSIONS))})", path=path,
                         fix="upgrade cuvil-pgc to load it, or rebuild it with this version")
    try:
        manifest = msgspec.json.decode(data, type=Manifest)
    except msgspec.ValidationError as exc:
        raise BuildError(f"{MANIFEST_NAME} does not match the manifest schema: {exc}", path=path,
                         fix="the package is damaged or was not written by cuvil-pgc; rebuild it") from None
    if manifest.created.tzinfo is None:
        raise BuildError(f"{MANIFEST_NAME}: 'created' has no time zone", path=path, fix="rebuild it")
    for name in manifest.members:
        check_member_name(name, path=path, reserved_ok=False)
    return manifest


def check_member_name(name: str, *, path: str, reserved_ok: bool = True) -> None:
    """Refuse a member name outside the allowlist (absolute, ``..``, backslash, control chars ...)."""
    problem = _name_problem(name)
    if problem is None and not reserved_ok and name in RESERVED_NAMES:
        problem = "is reserved for the manifest and its signature"
    if problem is not None:
        raise BuildError(f"member name {name!r} {problem}", path=path,
                         fix="member names are relative paths of letters, digits and ._+- ; "
                             "do not load packages from unknown sources")


def _name_problem(name: str) -> str | None:
    if not name:
        return "is empty"
    if name.startswith("/") or re.match(r"[A-Za-z]:", name):
        return "is an absolute path"
    if "\\" in name:
        return "contains a backslash"
    if any(part in ("..", ".") for part in name.split("/")):
        return "contains a '.' or '..' component"
    if len(name) > MAX_NAME_CHARS or name.count("/") >= MAX_NAME_DEPTH:
        return f"is longer than {MAX_NAME_CHARS} characters or {MAX_NAME_DEPTH} levels"
    if _MEMBER_RE.fullmatch(name) is None:
        return "contains characters outside [A-Za-z0-9._+-/] or an empty or hidden component"
    return None


def check_build_name(name: str) -> None:
    """Build names become store directory names: letters, digits and ._- , at most 64 chars."""
    if not isinstance(name, str) or BUILD_NAME_RE.fullmatch(name) is None:
        raise BuildError(f"build name {name!r} is not usable",
                         fix="use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit")


def utc_now() -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """sha256 of a file, streamed (for trace_hashes and model files)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def current_fingerprint(device: str = "cpu") -> Fingerprint:
    """The fingerprint of this process: torch version, Python, OS/arch, CPU ISA level, device."""
    import torch

    isa = "unknown"
    get_capability = getattr(getattr(torch.backends, "cpu", None), "get_cpu_capability", None)
    if callable(get_capability):
        isa = str(get_capability())
    return Fingerprint(torch=str(torch.__version__), python=platform.python_version(),
                       platform=f"{sys.platform}-{platform.machine()}", cpu_isa=isa,
                       device=_device_label(torch, device))


def _device_label(torch, device: str) -> str:
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        major, minor = torch.cuda.get_device_capability(index)
        return f"cuda:{torch.cuda.get_device_name(index)}:sm_{major}{minor}"
    return device
