"""Region paths of our files rebuilt from ids: each region names its parent, not its path.

Since schema version 2 a region event carries ``args.id``, ``args.parent`` (the parent's id, or
null) and its own name, so writing a region costs the same at any nesting depth. Regions whose
children were written while they were still open (or that were dropped, or cut off by a crash)
are declared by a ``{"ph": "M", "name": "cuvil_region", "args": {"name", "id", "parent"}}`` line
before the first line that names them. This module turns ids back into ``outer/inner`` paths,
so ``Trace.region`` means what ``args.path`` meant in version 1 (whose files keep their paths).
Operator and kernel events name their region by ``args.region_id`` (the id of a region line or
declaration of the same file) where version 1 gave its path in ``args.region``: no event of ours
costs its region's depth in bytes.

Contract: ``paths_by_id(table)`` maps each id of ``{id: (name, parent id or None)}`` to its
path, in a loop (no recursion at any depth). A parent the table lacks (lost lines) or a cycle
(a damaged or forged file) starts the path at the region itself; both are counted.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from cuvil_pgc.trace.columns import StringTable
from cuvil_pgc.trace.schema import META_REGION_EVENT, Kind


class _Declaration(msgspec.Struct, gc=False):
    name: Any = None
    id: Any = None
    parent: Any = None


_DECLARATIONS = msgspec.json.Decoder(list[_Declaration])


class TreeProblems:
    """What :func:`paths_by_id` could not place: unknown parents and cycles."""

    def __init__(self) -> None:
        self.unknown_parents = 0
        self.cycles = 0

    def notes(self) -> list[str]:
        out = []
        if self.unknown_parents:
            out.append(f"{self.unknown_parents} region(s) name a parent the file does not hold (lines lost "
                       "or dropped); their paths start at them")
        if self.cycles:
            out.append(f"{self.cycles} region(s) are their own ancestors (a damaged file); their paths "
                       "start at them")
        return out


def paths_by_id(table: dict[int, tuple[str, int | None]],
                problems: TreeProblems | None = None) -> dict[int, str]:
    """The path of every id in ``table`` (see module docstring)."""
    problems = problems if problems is not None else TreeProblems()
    paths: dict[int, str] = {}
    for start in table:
        if start in paths:
            continue
        chain: list[int] = []
        on_chain: set[int] = set()
        node: int | None = start
        base: str | None = None
        while node is not None:
            if node in paths:
                base = paths[node]
                break
            entry = table.get(node)
            if entry is None:
                if chain:
                    problems.unknown_parents += 1
                break
            if node in on_chain:
                problems.cycles += 1
                break
            chain.append(node)
            on_chain.add(node)
            node = entry[1]
        for i in reversed(chain):
            name = table[i][0]
            base = name if base is None else f"{base}/{name}"
            paths[i] = base
    return paths


def paths_of_events(events: list[dict[str, Any]]) -> dict[int, str]:
    """``{region id: path}`` of a decoded traceEvents list (region lines and declarations), for
    tools reading our files as plain JSON (the reader itself works on columns, :func:`fill_paths`)."""
    table: dict[int, tuple[str, int | None]] = {}
    for e in events:
        args = e.get("args")
        if not isinstance(args, dict) or type(args.get("id")) is not int:
            continue
        if e.get("ph") == "M" and e.get("name") == META_REGION_EVENT:
            table[args["id"]] = (args.get("name"), args.get("parent"))
        elif e.get("cat") == "region":
            table[args["id"]] = (e.get("name"), args.get("parent"))
    return paths_by_id(table)


def fill_paths(cols: dict[str, np.ndarray], paths: list[str | None], meta: list[Any],
               strings: StringTable, refs: dict[int, int] | None = None,
               given: np.ndarray | None = None) -> list[str]:
    """Paths of the region rows that give an id and no ``args.path``, from ids, names and the
    declarations among the ``M`` events ``meta``; and the region of the rows ``refs`` (``{row:
    region id}``: ops and kernels naming their region by ``args.region_id``) into ``cols["region"]``,
    marked in ``given``. Returns notes on what could not be placed."""
    rows = np.nonzero((cols["kind"] == Kind.REGION) & (cols["region_id"] >= 0))[0].tolist()
    need = [r for r in rows if paths[r] is None]
    if not need and not refs:
        return []
    table: dict[int, tuple[str, int | None]] = {}
    for decl in _declarations(meta):
        table[decl.id] = (decl.name, decl.parent)
    ids, parents, names = cols["region_id"], cols["parent_id"], cols["name"]
    for r in rows:
        parent = int(parents[r])
        table[int(ids[r])] = (strings[int(names[r])], parent if parent >= 0 else None)
    problems = TreeProblems()
    resolved = paths_by_id(table, problems)
    for r in rows:
        if paths[r] is not None:       # schema 1: the path the region line gives
            resolved[int(ids[r])] = paths[r]
    for r in need:
        paths[r] = resolved[int(ids[r])]
    notes = problems.notes()
    if refs:
        notes.extend(_attribute_refs(cols, refs, resolved, strings, given))
    return notes


def _attribute_refs(cols: dict[str, np.ndarray], refs: dict[int, int], resolved: dict[int, str],
                    strings: StringTable, given: np.ndarray | None) -> list[str]:
    interned = {i: strings.intern(p) for i, p in resolved.items()}
    region = cols["region"]
    unknown = 0
    for r, rid in refs.items():
        code = interned.get(rid)
        if code is None:
            unknown += 1            # left to time nesting, like an event that names no region
            continue
        region[r] = code
        if given is not None:
            given[r] = True
    if not unknown:
        return []
    return [f"{unknown} event(s) name a region id the file does not hold (lines lost or dropped); "
            "they are attributed by time nesting instead"]


def _declarations(meta: list[Any]) -> list[_Declaration]:
    raws = [e.args for e in meta if e.name == META_REGION_EVENT and isinstance(e.args, msgspec.Raw) and e.args]
    if not raws:
        return []
    try:
        decls = _DECLARATIONS.decode(b"[" + b",".join(raws) + b"]")
    except (msgspec.DecodeError, msgspec.ValidationError):
        return []
    return [d for d in decls if type(d.name) is str and type(d.id) is int and d.id >= 0
            and (d.parent is None or type(d.parent) is int)]
