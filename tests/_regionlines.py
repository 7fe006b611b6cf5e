"""Region events of a trace file as plain dicts, with ``args.path`` rebuilt from ids (schema 2
files carry each region's id, parent id and name; trace._region_tree rebuilds paths the same way
for the reader)."""

from __future__ import annotations

import json
from typing import Any

from cuvil_pgc.trace._region_tree import paths_of_events


def with_paths(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The region events of ``events`` (a traceEvents list), each with ``args.path`` filled in;
    other events naming their region by ``args.region_id`` get its path as ``args.region``."""
    paths = paths_of_events(events)
    regions = [e for e in events if e.get("cat") == "region"]
    for e in regions:
        e["args"].setdefault("path", paths[e["args"]["id"]])
    for e in events:
        args = e.get("args")
        if e.get("cat") != "region" and isinstance(args, dict) and "region_id" in args:
            args.setdefault("region", None if args["region_id"] is None else paths[args["region_id"]])
    return regions


def region_events(path) -> list[dict[str, Any]]:
    """The region events of a finished trace file, with ``args.path`` (see :func:`with_paths`)."""
    with open(path, encoding="utf-8") as f:
        return with_paths(json.load(f)["traceEvents"])
