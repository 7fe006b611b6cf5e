"""Args of our own files: column keys read in one typed pass, the rest kept raw until read.

Our events carry free-form ``args`` (region attributes, op shapes and cost estimates, kernel
launch configuration, compile details). One msgspec pass over all of them reads only the keys
that feed columns (:class:`OurArgs`); the columns are then filled and checked in bulk. Each
row's own ``args`` stays raw JSON in ``Trace.args`` until read (``_args.ArgsMap``), except for
region rows, whose user attributes are decoded right away (few rows, and ``path``/``id``/
``parent`` leave them).

Column keys and their rules: ``region`` (str or null; a region our file names is kept; schema
version 1), ``region_id`` (the id of a region line or declaration of the same file, or null;
schema 2: ops and kernels name their region by id, the path is rebuilt with the regions'),
``flops`` / ``bytes`` (finite non-negative numbers or null), ``correlation`` / ``external_id``
(64-bit ints or null). On region rows these keys are user attributes: numeric ``flops`` /
``bytes`` also fill the columns, anything else is only an attribute.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import compress
from operator import attrgetter
from typing import Any

import msgspec
import numpy as np

from cuvil_pgc.trace import _args as A
from cuvil_pgc.trace.columns import StringTable
from cuvil_pgc.trace.schema import Kind

_NONE = type(None)
_NAN = float("nan")


class OurArgs(msgspec.Struct, frozen=True, gc=False):
    """The column keys of our events' args (everything else is skipped in this pass)."""

    region: Any = None
    region_id: Any = None
    path: Any = None
    id: Any = None
    parent: Any = None
    flops: Any = None
    bytes: Any = None
    correlation: Any = None
    external_id: Any = None


DECODER = msgspec.json.Decoder(list[OurArgs])
Fail = Callable[[int, str], Exception]


def fill_columns(parsed: list[OurArgs], raws: list[msgspec.Raw], cols: dict[str, np.ndarray],
                 strings: StringTable, cats: list[str], fail: Fail) -> tuple[dict[int, Any], np.ndarray,
                                                                            list[str | None], dict[int, int]]:
    """Columns from the parsed keys; returns (args entries, region-given mask, region paths, and
    ``{row: region id}`` of the rows that name their region by ``args.region_id``).

    ``fail(row, problem)`` builds the TraceError for a row that breaks the rules.
    """
    n = len(parsed)
    region_rows = np.nonzero(cols["kind"] == Kind.REGION)[0].tolist()
    given = _region_column(parsed, region_rows, cols, strings, fail)
    refs = _region_refs(parsed, region_rows, fail)
    for key in ("flops", "bytes"):
        _float_column(parsed, key, region_rows, cols, fail)
    for key in ("correlation", "external_id"):
        _int_column(parsed, key, region_rows, cols, fail)
    paths: list[str | None] = [None] * n
    args: dict[int, Any] = {}
    _region_rows(parsed, raws, region_rows, cols, paths, args, fail)
    keep = np.ones(n, dtype=bool)
    keep[region_rows] = False
    rows = np.nonzero(keep)[0].tolist()
    row_raws = [raws[r] for r in rows]
    args.update(compress(zip(rows, row_raws, strict=True), map(_has_keys, row_raws)))
    for r in np.nonzero(cols["kind"] == Kind.OTHER)[0].tolist():
        args[r] = _OtherArgs(raws[r], cats[r])
    return args, given, paths, refs


def _has_keys(raw: msgspec.Raw) -> bool:
    return len(raw) > 2          # not absent, not "{}"


def _values(parsed: list[OurArgs], key: str, region_rows: list[int]) -> list[Any]:
    values = list(map(attrgetter(key), parsed))
    for r in region_rows:        # on region rows these keys are user attributes
        values[r] = None
    return values


def _first_bad(values: list[Any], allowed: tuple[type, ...]) -> int:
    return next(i for i, v in enumerate(values) if type(v) not in allowed)


def _region_column(parsed, region_rows, cols, strings: StringTable, fail: Fail) -> np.ndarray:
    values = _values(parsed, "region", region_rows)
    if not set(map(type, values)) <= {_NONE, str}:
        r = _first_bad(values, (_NONE, str))
        raise fail(r, f"args.region must be a string or null, got {type(values[r]).__name__}")
    table = {v: strings.intern(v) for v in dict.fromkeys(values) if v is not None}
    table[None] = -1
    region = np.array([table[v] for v in values], dtype=np.int32)
    cols["region"] = region
    return region >= 0


def _region_refs(parsed, region_rows, fail: Fail) -> dict[int, int]:
    values = _values(parsed, "region_id", region_rows)
    if not set(map(type, values)) <= {_NONE, int}:
        r = _first_bad(values, (_NONE, int))
        raise fail(r, f"args.region_id must be an integer or null, got {type(values[r]).__name__}")
    return {r: v for r, v in enumerate(values) if v is not None}


def _float_column(parsed, key: str, region_rows, cols, fail: Fail) -> None:
    values = _values(parsed, key, region_rows)
    if not set(map(type, values)) <= {_NONE, int, float}:
        r = _first_bad(values, (_NONE, int, float))
        raise fail(r, f"args.{key} must be a number or null, got {type(values[r]).__name__}")
    try:
        col = np.array([_NAN if v is None else v for v in values], dtype=np.float64)
    except OverflowError:
        r = next(i for i, v in enumerate(values) if type(v) is int and abs(v) > 1e300)
        raise fail(r, f"args.{key} is out of range") from None
    bad = np.isinf(col) | (col < 0)
    if bad.any():
        r = int(np.argmax(bad))
        raise fail(r, f"args.{key} must be a finite non-negative number, got {values[r]!r:.40}")
    cols[key] = col


def _int_column(parsed, key: str, region_rows, cols, fail: Fail) -> None:
    values = _values(parsed, key, region_rows)
    if not set(map(type, values)) <= {_NONE, int}:
        r = _first_bad(values, (_NONE, int))
        raise fail(r, f"args.{key} must be an integer or null, got {type(values[r]).__name__}")
    try:
        cols[key] = np.array([-1 if v is None else v for v in values], dtype=np.int64)
    except OverflowError:
        r = next(i for i, v in enumerate(values) if v is not None and not -(2**63) <= v < 2**63)
        raise fail(r, f"args.{key} does not fit in 64 bits") from None


def _region_rows(parsed, raws, region_rows: list[int], cols, paths: list[str | None], args: dict[int, Any],
                 fail: Fail) -> None:
    """Region rows: path, id, parent, flops/bytes and user attributes, column by column."""
    if not region_rows:
        return
    rows = np.asarray(region_rows, dtype=np.int64)
    sel = [parsed[r] for r in region_rows]
    region_paths = list(map(attrgetter("path"), sel))
    if not set(map(type, region_paths)) <= {str, _NONE}:
        k = _first_bad(region_paths, (str, _NONE))
        raise fail(region_rows[k], f"args.path must be a string, got {type(region_paths[k]).__name__}")
    for r, path in zip(region_rows, region_paths, strict=True):
        paths[r] = path
    for key, col in (("id", "region_id"), ("parent", "parent_id")):
        values = list(map(attrgetter(key), sel))
        if not set(map(type, values)) <= {int, _NONE}:
            k = _first_bad(values, (int, _NONE))
            raise fail(region_rows[k], f"args.{key} must be a 64-bit integer, got {values[k]!r:.40}")
        try:
            given = np.array([-2**63 if v is None else v for v in values], dtype=np.int64)
        except OverflowError:
            k = next(i for i, v in enumerate(values) if v is not None and not -(2**63) <= v < 2**63)
            raise fail(region_rows[k], f"args.{key} must be a 64-bit integer, got {values[k]!r:.40}") from None
        known = given != -2**63
        cols[col][rows[known]] = given[known]
    for key in ("flops", "bytes"):
        for r, value in zip(region_rows, map(attrgetter(key), sel), strict=True):
            if value is not None and type(value) in (int, float) and math.isfinite(value) and value >= 0:
                cols[key][r] = value
    # User attributes: every region's args decoded in one call, kept where more than path/id/parent.
    decoded = msgspec.json.decode(b"[" + b",".join(raws[r] or b"{}" for r in region_rows) + b"]")
    for r, attrs in zip(region_rows, decoded, strict=True):
        if len(attrs) > 3 or not attrs.keys() <= {"path", "id", "parent"}:
            for key in ("path", "id", "parent"):
                attrs.pop(key, None)
            if attrs:
                args[r] = attrs


class _OtherArgs:
    """Raw args of an event of a category the reader does not know, plus that category."""

    __slots__ = ("raw", "cat")

    def __init__(self, raw: msgspec.Raw, cat: str) -> None:
        self.raw, self.cat = raw, cat

    def to_args(self) -> dict[str, Any]:
        out = A.raw_args(self.raw) if self.raw else {}
        out.setdefault("cat", self.cat)
        return out
