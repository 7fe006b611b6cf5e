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

from collections.abc import Iterator, Mapping, MutableMapping
from typing import Annotated, Any, ClassVar

import msgspec
import numpy as np

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


class RowArgs:
    """One source's args while it loads: an int32 code per row (-1: none) into ``values``, so rows
    sharing one struct (a loop's operators) share one entry and no per-row dict is built."""

    __slots__ = ("codes", "values")

    def __init__(self, n: int) -> None:
        self.codes = np.full(n, -1, dtype=np.int32)
        self.values: list[Any] = []

    def put(self, rows: np.ndarray, values: list[Any], codes: np.ndarray | None = None) -> None:
        """Give ``rows`` the ``values`` (one per row), or ``values[codes[i]]`` when codes are given."""
        start = len(self.values)
        self.values.extend(values)
        local = np.arange(len(rows)) if codes is None else codes
        self.codes[rows] = (local + start).astype(np.int32)

    def __setitem__(self, row: int, value: Any) -> None:
        self.put(np.array([row]), [value])

    def __len__(self) -> int:
        return int(np.count_nonzero(self.codes >= 0))

    @classmethod
    def concat(cls, parts: list[RowArgs | Mapping[int, Any]], sizes: list[int]) -> RowArgs:
        """Rows of ``parts`` one after the other (mappings, an ArgsMap included: ``{row: value}``)."""
        out = cls(0)
        codes = []
        for part, n in zip(parts, sizes, strict=True):
            if not isinstance(part, RowArgs):
                part = cls.from_mapping(part, n)
            off = len(out.values)
            codes.append(np.where(part.codes >= 0, part.codes + off, -1).astype(np.int32))
            out.values.extend(part.values)
        out.codes = np.concatenate(codes) if codes else out.codes
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[int, Any], n: int) -> RowArgs:
        """``n`` rows whose args are ``data``'s values as stored (not decoded)."""
        out = cls(n)
        rows, values = stored_items(data)
        if len(rows):
            out.put(rows, values)
        return out


class ArgsMap(MutableMapping):
    """``Trace.args``: row → dict, materialising typed args structs on first access.

    Behaves as a ``dict[int, dict]`` for reading and writing (``get``, ``[]``, ``in``, ``items``,
    assignment); values stored as raw JSON (our files) or typed structs (Kineto) are converted
    to dicts when first read (and kept, so changes to them stay). The reader's rows live in an int32
    column of codes into deduplicated values (``codes``, ``values``); explicit entries (``data``)
    take precedence over it.
    """

    __slots__ = ("_codes", "_data", "_values")

    def __init__(self, data: dict[int, Any] | None = None, *, codes: np.ndarray | None = None,
                 values: list[Any] | None = None) -> None:
        self._data: dict[int, Any] = data if data is not None else {}
        self._codes = codes
        self._values: list[Any] = values if values is not None else []

    def _code(self, row: object) -> int:
        codes = self._codes
        if codes is None or type(row) not in (int, np.int64, np.int32) or not 0 <= row < len(codes):
            return -1
        return int(codes[row])

    def __getitem__(self, row: int) -> dict[str, Any]:
        value = self._data.get(row)
        if value is None:
            code = self._code(row)
            if code < 0:
                raise KeyError(row)
            value = self._values[code]
            row = int(row)
        if type(value) is not dict:
            value = self._data[row] = _materialize(value)
        return value

    def __setitem__(self, row: int, value: dict[str, Any]) -> None:
        self._data[row] = value

    def __delitem__(self, row: int) -> None:
        code = self._code(row)
        if row not in self._data and code < 0:
            raise KeyError(row)
        self._data.pop(row, None)
        if code >= 0:
            self._codes[row] = -1

    def __contains__(self, row: object) -> bool:
        return row in self._data or self._code(row) >= 0

    def __iter__(self) -> Iterator[int]:
        rows, _ = self.raw_items()
        return iter(rows.tolist())

    def __len__(self) -> int:
        if self._codes is None:
            return len(self._data)
        extra = sum(1 for r in self._data if self._code(r) < 0)
        return int(np.count_nonzero(self._codes >= 0)) + extra

    def __repr__(self) -> str:
        return f"ArgsMap({len(self)} rows)"

    def raw_items(self) -> tuple[np.ndarray, list[Any]]:
        """(rows, values) of every entry, ascending by row, values as stored (typed structs, raw
        JSON or dicts): for code that re-keys or exports args without decoding them."""
        rows = np.zeros(0, dtype=np.int64)
        if self._codes is not None:
            rows = np.nonzero(self._codes >= 0)[0]
        if self._data:
            rows = np.union1d(rows, np.fromiter(self._data.keys(), dtype=np.int64, count=len(self._data)))
        data, values, codes = self._data, self._values, self._codes
        out = [data[r] if r in data else values[codes[r]] for r in rows.tolist()]
        return rows, out

    def shared_codes(self, rows: np.ndarray) -> np.ndarray:
        """Per row, the code of the stored value it shares with other rows (a loop's operators
        with the same shapes share one), -1 where it has none or an entry of its own: rows with
        the same code have the same args, so what is derived from them is derived once."""
        if self._codes is None:
            return np.full(len(rows), -1, dtype=np.int64)
        codes = self._codes[rows].astype(np.int64)
        if self._data:
            codes[np.isin(rows, np.fromiter(self._data.keys(), dtype=np.int64, count=len(self._data)))] = -1
        return codes

    def materialize(self) -> ArgsMap:
        """Convert every entry to a dict now (releases the file bytes raw args point into)."""
        rows, values = self.raw_items()
        self._data = {r: v if type(v) is dict else _materialize(v)
                      for r, v in zip(rows.tolist(), values, strict=True)}
        self._codes, self._values = None, []
        return self


def stored_items(args: Mapping[int, Any]) -> tuple[np.ndarray, list[Any]]:
    """(rows ascending, values as stored) of ``args``: :meth:`ArgsMap.raw_items`, or a plain
    mapping's items. For code that moves or re-encodes rows without reading them (merge, export)."""
    if isinstance(args, ArgsMap):
        return args.raw_items()
    rows = np.fromiter(args.keys(), dtype=np.int64, count=len(args))
    order = np.argsort(rows, kind="stable")
    values = list(args.values())
    return rows[order], [values[i] for i in order.tolist()]


def _materialize(value: Any) -> dict[str, Any]:
    return raw_args(value) if type(value) is msgspec.Raw else value.to_args()
