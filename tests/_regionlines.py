"""Region events of a trace file as plain dicts, with ``args.path`` rebuilt from ids (schema 2
files carry each region's id, parent id and name; trace._region_tree rebuilds paths the same way
for the reader)."""

from __future__ import annotations

import json
from typing import Any

from cuvil_pgc.trace._region_tree import paths_by_id
from cuvil_pgc.trace.schema import META_REGION_EVENT


def with_paths(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The region events of ``events`` (a traceEvents list), each with ``args.path`` filled in."""
    table: dict[int, tuple[str, int | None]] = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == META_REGION_EVENT:
            table[e["args"]["id"]] = (e["args"]["name"], e["args"]["parent"])
    regions = [e for e in events if e.get("cat") == "region"]
    for e in regions:
        table[e["args"]["id"]] = (e["name"], e["args"]["parent"])
    paths = paths_by_id(table)
    for e in regions:
        e["args"].setdefault("path", paths[e["args"]["id"]])
    return regions


def region_events(path) -> list[dict[str, Any]]:
    """The region events of a finished trace file, with ``args.path`` (see :func:`with_paths`)."""
    with open(path, encoding="utf-8") as f:
        return with_paths(json.load(f)["traceEvents"])
