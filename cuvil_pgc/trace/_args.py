"""Typed event ``args`` and the lazily materialised, sparse ``Trace.args``.

Kineto args are decoded inline with their event into one frozen struct (:class:`KinetoArgs`,
measured as fast as skipping them): the fields that feed columns (correlation, External id,
flops, bytes) are read from it right away; the rest becomes the row's ``Trace.args`` entry only
when someone reads it (:class:`ArgsMap`), so a 300k-event trace builds no per-event dicts at
load time. Unread raw fields keep the file's bytes alive; ``ArgsMap.materialize()`` releases
them.

Normalised ``Trace.args`` keys (Kineto name → ours):
``Input Dims`` → ``shapes``, ``Input type`` → ``dtypes``, ``Input Strides`` → ``strides`` and
``Concrete Inputs`` → ``concrete_inputs`` (our files only: Kineto's are skipped at decode),
``External id`` → ``external_id`` (a column),
``registers per thread`` →
``registers_per_thread``, ``shared memory`` → ``shared_memory``, ``blocks per SM`` →
``blocks_per_sm``, ``warps per SM`` → ``warps_per_sm``, ``est. achieved occupancy %`` →
``occupancy_pct``, ``memory bandwidth (GB/s)`` → ``bandwidth_gbps``; ``grid``, ``block``,
``stream``, ``device``, ``queued``, ``cbid`` keep their names. Rows of categories the reader does
not know (Kind.OTHER) carry ``{"cat": <category>}``.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Annotated, Any, ClassVar

import msgspec

_NAN = float("nan")
_NO_RAW = msgspec.Raw(b"")

#: Kineto arg names and the names Trace.args uses for them (also applied to our own files).
KEY_NAMES = {
    "Input Dims": "shapes", "Input type": "dtypes", "External id": "external_id",
    "registers per thread": "registers_per_thread", "shared memory": "shared_memory",
    "blocks per SM": "blocks_per_sm", "warps per SM": "warps_per_sm",
    "est. achieved occupancy %": "occupancy_pct", "memory bandwidth (GB/s)": "bandwidth_gbps",
    "Input Strides": "strides", "Concrete Inputs": "concrete_inputs",
}
_RENAME = {ours: theirs for theirs, ours in KEY_NAMES.items()}
_RENAME["external_id_v1"] = "external id"     # torch 1.8-1.10 wrote it lower-case on GPU and runtime rows


Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]


class KinetoArgs(msgspec.Struct, frozen=True, gc=False, rename=_RENAME):
    """The ``args`` of a Kineto event, decoded inline with the event (one struct for all categories).

    Column fields (``external_id``, ``correlation``, ``flops``, ``bytes``) are typed and checked;
    the rest are informational and kept as they are. Operator shapes and dtypes stay raw JSON
    until the row's args are read; ``Input Strides`` and ``Concrete Inputs`` are not read (nothing
    downstream uses them, and skipping them halves the cost of sharing operator args).
    """

    COLUMN_FIELDS: ClassVar[frozenset[str]] = frozenset(("external_id", "external_id_v1", "correlation",
                                                         "flops", "bytes"))
    external_id: Int64 = -1
    external_id_v1: Int64 = -1
    correlation: Int64 = -1
    flops: float = _NAN
    bytes: float = _NAN
    shapes: msgspec.Raw = _NO_RAW
    dtypes: msgspec.Raw = _NO_RAW
    device: Any = None
    stream: Any = None
    grid: Any = None
    block: Any = None
    registers_per_thread: Any = None
    shared_memory: Any = None
    blocks_per_sm: Any = None
    warps_per_sm: Any = None
    occupancy_pct: Any = None
    queued: Any = None
    cbid: Any = None
    bandwidth_gbps: Any = None
    name: Any = None               # thread_name / process_name metadata events

    def to_args(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        skip = self.COLUMN_FIELDS
        for key in self.__struct_fields__:
            if key in skip:
                continue
            value = getattr(self, key)
            if type(value) is msgspec.Raw:
                if value:
                    out[key] = msgspec.json.decode(value)
            elif value is not None:
                out[key] = value
        return out


NO_ARGS = KinetoArgs()


class CatArgs:
    """Args of an event of a category the reader does not know: only its ``cat``."""

    __slots__ = ("cat",)

    def __init__(self, cat: str) -> None:
        self.cat = cat

    def to_args(self) -> dict[str, Any]:
        return {"cat": self.cat}


#: Keys of our files' args that became columns (dropped from Trace.args).
OUR_COLUMN_KEYS = ("region", "region_id", "flops", "bytes", "correlation", "external_id")


def raw_args(raw: msgspec.Raw) -> dict[str, Any]:
    """The args dict of one of our events from its raw JSON, minus the keys that became columns."""
    try:
        out = msgspec.json.decode(raw)
    except (msgspec.DecodeError, RecursionError):   # checked at load; kept total for safety
        return {}
    if not isinstance(out, dict):
        return {}
    for key in OUR_COLUMN_KEYS:
        out.pop(key, None)
    for theirs in out.keys() & KEY_NAMES.keys():
        out[KEY_NAMES[theirs]] = out.pop(theirs)
    return out


class ArgsMap(MutableMapping):
    """``Trace.args``: row → dict, materialising typed args structs on first access.

    Behaves as a ``dict[int, dict]`` for reading and writing (``get``, ``[]``, ``in``, ``items``,
    assignment); values stored as raw JSON (our files) or typed structs (Kineto) are converted
    to dicts when first read.
    """

    __slots__ = ("_data",)

    def __init__(self, data: dict[int, Any] | None = None) -> None:
        self._data: dict[int, Any] = data if data is not None else {}

    def __getitem__(self, row: int) -> dict[str, Any]:
        value = self._data[row]
        if type(value) is not dict:
            value = self._data[row] = _materialize(value)
        return value

    def __setitem__(self, row: int, value: dict[str, Any]) -> None:
        self._data[row] = value

    def __delitem__(self, row: int) -> None:
        del self._data[row]

    def __contains__(self, row: object) -> bool:
        return row in self._data

    def __iter__(self) -> Iterator[int]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __repr__(self) -> str:
        return f"ArgsMap({len(self._data)} rows)"

    def materialize(self) -> ArgsMap:
        """Convert every entry to a dict now (releases the file bytes raw args point into)."""
        data = self._data
        for row, value in data.items():
            if type(value) is not dict:
                data[row] = _materialize(value)
        return self


def _materialize(value: Any) -> dict[str, Any]:
    return raw_args(value) if type(value) is msgspec.Raw else value.to_args()
