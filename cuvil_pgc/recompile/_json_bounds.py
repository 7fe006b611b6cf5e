"""Bounds on JSON documents read from a build, checked before they are parsed.

A parser recurses once per nesting level: ``[[[[...]]]]`` a hundred thousand deep makes
``json.loads`` and msgspec raise RecursionError, which no caller expects from a "bad file". So
the size and the nesting depth are checked first, by a scan that does not recurse, and a document
over either bound is refused with a BuildError.
"""

from __future__ import annotations

import re

from cuvil_pgc.errors import BuildError

MAX_JSON_BYTES = 16 << 20
MAX_JSON_DEPTH = 64          # plan.json and manifest.json nest 5-6 levels
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_BRACKETS = re.compile(rb"[\[\]{}]")


def json_depth(data: bytes) -> int:
    """Deepest nesting of arrays and objects in ``data`` (strings skipped), without recursing."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRINGS.sub(b'""', data)):
        if bracket in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def check_json_bounds(data: bytes, *, what: str, path: str, max_bytes: int = MAX_JSON_BYTES,
                      max_depth: int = MAX_JSON_DEPTH) -> None:
    """Raise BuildError when ``data`` is larger than ``max_bytes`` or nests deeper than ``max_depth``."""
    if len(data) > max_bytes:
        raise BuildError(f"{what} is {len(data)} bytes, over the limit of {max_bytes}", path=path,
                         fix="the package is damaged or crafted; do not use it")
    depth = json_depth(data)
    if depth > max_depth:
        raise BuildError(f"{what} nests {depth} levels deep, over the limit of {max_depth}", path=path,
                         fix="the package is damaged or crafted; do not use it")
