"""Chrome ``X`` event lines for completed regions: what the session's writer thread writes.

``format_regions(frames, head, s0, paths_json, region_json, dumps)`` turns one thread's ended
region frames into bytes, one event per line (``{...},\\n``): ``head`` is the line's start up
to ``"name":`` (ph, cat, pid, tid), ``s0`` the session's monotonic start in ns, ``paths_json`` a
cache path -> JSON text, ``region_json(region)`` gives a region's (name, attrs) JSON fragments and
caches them on the region, ``dumps`` is the JSON encoder. Frames get their id and path here
(region.identify). ts and dur are microseconds with up to three decimals, written as Python's
float repr of ``ns / 1000`` would write them.

This is most of what recording costs, so the C accelerator (``_fastregion.format_regions``)
replaces the Python version below when it is built; tests compare the two byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuvil_pgc.instrument import region as _region


def format_regions_py(frames: list[list], head: bytes, s0: int, paths_json: dict[str, bytes],
                      region_json: Callable[[Any], tuple[bytes, bytes]],
                      dumps: Callable[[Any], bytes]) -> bytes:
    """The pure-Python formatter (see the module docstring)."""
    identify = _region.identify
    for frame in frames:
        identify(frame)
    ts = [(f[2] - s0) / 1000.0 for f in frames]
    dur = [(f[5] - f[2]) / 1000.0 for f in frames]
    lines = []
    for frame, t, d in zip(frames, _json_numbers(ts, dumps), _json_numbers(dur, dumps), strict=True):
        region, parent, rid, path = frame[0], frame[1], frame[3], frame[4]
        name_json, attrs_json = region._json or region_json(region)
        path_json = paths_json.get(path) or paths_json.setdefault(path, dumps(path))
        lines.append(b'%s%s,"ts":%s,"dur":%s,"args":{"path":%s,"id":%d,"parent":%s%s}},\n' % (
            head, name_json, t, d, path_json, rid, b"null" if parent is None else b"%d" % parent[3],
            attrs_json))
    return b"".join(lines)


def _json_numbers(values: list[float], dumps: Callable[[Any], bytes]) -> list[bytes]:
    """Each float as JSON text, formatted by the encoder in one call (Python's float repr is the
    costliest step of writing an event)."""
    return dumps(values)[1:-1].split(b",") if values else []


format_regions: Callable[..., bytes] = (
    _region._accel.format_regions if _region._accel is not None else format_regions_py)
