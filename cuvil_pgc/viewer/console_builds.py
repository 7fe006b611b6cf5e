"""Tables of builds and the build store: a verified build (``cuvil-pgc verify``), the stored
versions (``builds list``) and the store's history (``builds log``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from cuvil_pgc.viewer.tables import Column, TableView, fmt_bytes


def verify_table(summary: dict[str, Any]) -> Table:
    """What ``verify`` found (``VerifiedBuild.summary()``): signature, manifest and members."""
    sig = summary["signature"]
    signature = ("verified, key " + sig["key_id"]) if sig["verified"] else \
        (f"present (key {sig['key_id']}), NOT checked" if sig["present"] else "unsigned")
    table = Table(title=f"{summary['name']} v{summary['version']}  ({summary['path']})", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    rows = [("signature", signature), ("created", summary["created"]),
            ("format", str(summary["format_version"])), ("manifest sha256", summary["manifest_sha256"]),
            *((k, v) for k, v in summary["fingerprint"].items()),
            ("model hash", summary["model_hash"] or "-"), ("traces", str(len(summary["trace_hashes"])))]
    for key, value in rows:
        table.add_row(key, value)
    for name, digest in sorted(summary["members"].items()):
        table.add_row(f"  {name}", f"{digest['size']:,} B  sha256 {digest['sha256'][:16]}…")
    return table


def entries_view(entries: list[Any]) -> TableView:
    """Stored versions (``BuildStore.entries``) and the pointers at each."""
    columns = [Column("name", "name", identifier=True), Column("version", "ver", justify="right"),
               Column("pointers", "pointers", lambda p: ", ".join(p) or "-"),
               Column("created", "created", _minutes, drop=2), Column("pushed_at", "pushed", _minutes, drop=4),
               Column("pushed_by", "by", drop=5), Column("key", "signed by key", drop=3),
               Column("size", "size", fmt_bytes, "right")]
    rows = [{"name": e.name, "version": e.version, "pointers": list(e.pointers), "created": e.created,
             "pushed_at": e.pushed_at, "pushed_by": e.pushed_by, "key": e.key_id if e.signed else "unsigned",
             "size": e.size} for e in entries]
    return TableView("builds", columns, rows)


def log_view(name: str, entries: list[Any]) -> TableView:
    """The store's append-only history of one build name (``BuildStore.log``)."""
    columns = [Column("time", "time", lambda t: t[:19].replace("T", " ")), Column("op", "op"), Column("pointer", "pointer"),
               Column("move", "move"), Column("by", "by", drop=1),
               Column("reason", "reason", identifier=True)]      # prose: wraps at spaces when it must
    rows = [{"time": e.time, "op": e.op, "pointer": e.pointer or "",
             "move": "" if e.op == "checkpoint" else f"v{e.version}" if e.previous is None
             else f"v{e.previous} -> v{e.version}",
             "by": f"{e.user}@{e.host}", "reason": e.reason or ""} for e in entries]
    return TableView(f"{name} history", columns, rows)


def _minutes(iso: str) -> str:
    return iso[:16].replace("T", " ")
