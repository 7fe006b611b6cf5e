"""Event lines for completed regions: what the session's writer thread writes.

``format_regions(frames, head, decl_head, s0, floor, names_json, region_json, dumps)`` turns one
thread's ended region frames into bytes, one event per line (``{...},\\n``):

- a Chrome ``X`` event per frame: ``head`` is the line's start up to ``"name":`` (ph, cat, pid,
  tid); ``args`` holds the region's ``id``, its ``parent``'s id (or null) and its attributes.
  No path: a region costs the same to write at any nesting depth, and the reader rebuilds
  paths from ids and names (trace._region_tree).
- a declaration line per ancestor that has no id yet (a region still open, written in a later
  batch, or dropped), before the first line that names it: ``decl_head`` is the line's start
  up to ``"args":{"name":`` (``{"ph":"M","name":"cuvil_region",pid,tid``), then its ``id`` and
  ``parent``. So every parent a line names is in the file before it, even after a crash.

Every frame of the batch gets its id before any line is written (ids in batch order), so only
ancestors outside the batch are declared. ``floor`` is the session's first id
(region.reserve_id()): a frame with a smaller id got it in an earlier session's file (a region
open across capture windows) and gets a new one, and a declaration, in this file. ``s0`` is the session's monotonic start in ns,
``names_json`` a cache str -> JSON text, ``region_json(region)`` gives a region's (name, attrs)
JSON fragments and caches them on the region, ``dumps`` is the JSON encoder. ts and dur are
microseconds with up to three decimals, written as Python's float repr of ``ns / 1000`` would.

This is most of what recording costs, so the C accelerator (``_fastregion.format_regions``)
replaces the Python version below when it is built; tests compare the two byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuvil_pgc.instrument._accel import fastregion
from cuvil_pgc.instrument.region import reserve_id


def format_regions_py(frames: list[list], head: bytes, decl_head: bytes, s0: int, floor: int,
                      names_json: dict[str, bytes], region_json: Callable[[Any], tuple[bytes, bytes]],
                      dumps: Callable[[Any], bytes]) -> bytes:
    """The pure-Python formatter (see the module docstring)."""
    for frame in frames:
        if frame[3] is None or frame[3] < floor:
            frame[3] = reserve_id()
    ts = [(f[2] - s0) / 1000.0 for f in frames]
    dur = [(f[5] - f[2]) / 1000.0 for f in frames]
    lines: list[bytes] = []
    for frame, t, d in zip(frames, _json_numbers(ts, dumps), _json_numbers(dur, dumps), strict=True):
        region = frame[0]
        name_json, attrs_json = _fragments(region, names_json, region_json, dumps)
        parent = frame[1]
        if parent is not None and (parent[3] is None or parent[3] < floor):
            _declare(lines, parent, floor, decl_head, names_json, region_json, dumps)
        lines.append(b'%s%s,"ts":%s,"dur":%s,"args":{"id":%d,"parent":%s%s}},\n' % (
            head, name_json, t, d, frame[3], b"null" if parent is None else b"%d" % parent[3], attrs_json))
    return b"".join(lines)


def _fragments(region: Any, names_json: dict[str, bytes], region_json: Callable[[Any], tuple[bytes, bytes]],
               dumps: Callable[[Any], bytes]) -> tuple[bytes, bytes]:
    if region._json is None and region.attrs is None and type(region.name) is str:
        name = region.name
        return names_json.get(name) or names_json.setdefault(name, dumps(name)), b""
    return region._json or region_json(region)


def _declare(lines: list[bytes], frame: list, floor: int, decl_head: bytes, names_json: dict[str, bytes],
             region_json: Callable[[Any], tuple[bytes, bytes]], dumps: Callable[[Any], bytes]) -> None:
    """Ids for ``frame`` and its ancestors without one in this file, then a declaration line each."""
    chain = []
    while frame is not None and (frame[3] is None or frame[3] < floor):
        frame[3] = reserve_id()
        chain.append(frame)
        frame = frame[1]
    i = 0
    while i < len(chain):
        f = chain[i]
        name_json = _fragments(f[0], names_json, region_json, dumps)[0]
        parent = f[1]            # read once: a region ending elsewhere may re-parent f
        if parent is not None and (parent[3] is None or parent[3] < floor):
            parent[3] = reserve_id()
            chain.append(parent)
        lines.append(b'%s%s,"id":%d,"parent":%s}},\n' % (
            decl_head, name_json, f[3], b"null" if parent is None else b"%d" % parent[3]))
        i += 1


def _json_numbers(values: list[float], dumps: Callable[[Any], bytes]) -> list[bytes]:
    """Each float as JSON text, formatted by the encoder in one call (Python's float repr is the
    costliest step of writing an event)."""
    return dumps(values)[1:-1].split(b",") if values else []


format_regions: Callable[..., bytes] = fastregion.format_regions if fastregion is not None else format_regions_py
