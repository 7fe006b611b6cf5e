"""Each event row's args as JSON text in an Arrow string column, for the Parquet export (:mod:`.arrow`).

The reader keeps Kineto args as typed structs whose shapes and dtypes are still raw JSON; encoding
such a struct through a mirror struct of its non-column fields skips decoding that JSON only to
encode it again, and one newline-delimited encode split in numpy builds the column without a Python
string per row. Anything else (our files' raw args, dicts) goes through the public mapping.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np
import orjson

from cuvil_pgc.trace._args import stored_items
from cuvil_pgc.trace.columns import Trace


def args_json(pa: Any, trace: Trace, rows: np.ndarray) -> Any:
    """Each row's args as JSON text (null: no args), ``rows`` ascending, as an Arrow string array
    built from encoded buffers, with no Python string per row."""
    n = len(rows)
    if not len(trace.args):
        return pa.nulls(n, pa.string())
    keys, stored = stored_items(trace.args)
    pos = np.searchsorted(rows, keys)
    inside = (pos < n) & (rows[np.minimum(pos, n - 1)] == keys)
    picked = np.flatnonzero(inside)
    picked = picked[np.argsort(pos[picked], kind="stable")]
    keys, pos = keys[picked], pos[picked]
    # The reader keeps Kineto args as typed structs whose shapes and dtypes are still raw JSON;
    # encoding such a struct as it is skips decoding that JSON only to encode it again (the
    # export of a torch.profiler trace took 3x as long as loading it). Anything else (our files'
    # raw args, dicts) goes through the public mapping.
    values = [stored[i] for i in picked.tolist()]
    kinds = [type(v) for v in values]
    parts, where = [], np.full(n, -1, dtype=np.int64)     # row -> index into the parts, concatenated
    done = np.zeros(len(keys), dtype=bool)
    for cls in set(kinds):
        mirror = _mirror(cls)
        if mirror is None:
            continue
        members = np.flatnonzero(np.fromiter((k is cls for k in kinds), dtype=bool, count=len(kinds)))
        mirror_cls, first = mirror
        astuple = msgspec.structs.astuple
        array = _json_lines(pa, [mirror_cls(*astuple(values[m])[first:]) for m in members.tolist()])
        where[pos[members]] = sum(len(p) for p in parts) + np.arange(len(members))
        parts.append(array)
        done[members] = True
    rest = np.flatnonzero(~done)
    if len(rest):
        texts = [dumps_json(trace.args.get(key)) for key in keys[rest].tolist()]
        where[pos[rest]] = sum(len(p) for p in parts) + np.arange(len(rest))
        parts.append(pa.array(texts, type=pa.string()))
    if not parts:
        return pa.nulls(n, pa.string())
    joined = pa.concat_arrays([p.cast(pa.string()) for p in parts])
    return joined.take(pa.array(where, mask=where < 0))


def _json_lines(pa: Any, items: list) -> Any:
    """``items`` JSON-encoded, one string each ("{}", an object of nothing but defaults: null), from
    one newline-delimited encode split in numpy; a row whose raw JSON holds a newline makes it fall
    back to one encode per item."""
    data = _ENCODER.encode_lines(items)
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
    if len(ends) == len(items):
        offsets = np.concatenate([[0], ends + 1]).astype(np.int64)
        lengths = np.diff(offsets) - 1                    # without the newline
        buffer = data
    else:
        encoded = [_ENCODER.encode(item) for item in items]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        offsets = np.zeros(len(items) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        buffer = b"".join(encoded)
    valid = pa.py_buffer(np.packbits(lengths > 2, bitorder="little"))
    starts = pa.py_buffer(offsets)
    array = pa.LargeStringArray.from_buffers(len(items), starts, pa.py_buffer(buffer), valid)
    if len(ends) == len(items):          # drop each string's trailing newline
        import pyarrow.compute as pc

        return pc.utf8_rtrim(array, characters="\n")
    return array


_ENCODER = msgspec.json.Encoder()
_MIRRORS: dict[type, tuple[type, int] | None] = {}


def _mirror(cls: type) -> tuple[type, int] | None:
    """For an args struct type whose column fields come first: a struct of its other fields, with
    the same defaults, that leaves defaults out when encoded, and the index of its first field.
    Encoding it gives what ``json.dumps(value.to_args())`` gives, without decoding the raw fields."""
    if cls not in _MIRRORS:
        fields = getattr(cls, "__struct_fields__", None)
        skip = getattr(cls, "COLUMN_FIELDS", None)
        first = sum(1 for f in fields or () if f in (skip or ()))
        if fields is None or skip is None or any(f in skip for f in fields[first:]):
            _MIRRORS[cls] = None
        else:
            defaults = cls.__struct_defaults__[len(cls.__struct_defaults__) - len(fields):]
            spec = [(f, Any, d) for f, d in zip(fields[first:], defaults[first:], strict=True)]
            _MIRRORS[cls] = (msgspec.defstruct(f"{cls.__name__}Export", spec, omit_defaults=True, gc=False), first)
    return _MIRRORS[cls]


def dumps_json(value: Any) -> str | None:
    if not value:
        return None
    return orjson.dumps(value, default=str, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()
