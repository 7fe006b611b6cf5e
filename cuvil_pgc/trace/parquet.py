"""Traces as a Parquet dataset: what ``cuvil-pgc export --parquet DIR`` writes and ``sql`` reads.

Layout (Hive partitioning, readable as it is by DuckDB, pyarrow, Spark, Trino, BigQuery)::

    DIR/<table>/run_id=<run>/rank=<rank>/<trace_key>.parquet

one file per table and source (tables and columns: :mod:`cuvil_pgc.trace.arrow`); ``run_id`` and
``rank`` are partition columns, so the files themselves do not repeat them. Each file is written
to a temporary name and renamed, so readers never see half a file; exporting the same trace
again replaces its files (same ``trace_key``). Tables a trace has no rows for get no file.

``DIR/_cuvil_dataset.json`` (:data:`MARKER`; Hive readers skip ``_`` names) lists the schema
versions of the files in the directory, ``{"schema_versions": [2]}``. Readers use it to read a
directory of one version as it is (no file's footer read before the query) and to merge the
columns of older files by name otherwise; a directory without it (exports before it existed,
versions 1 and 2) is read the merging way.
"""

from __future__ import annotations

import glob
import os
import secrets
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import arrow
from cuvil_pgc.trace.columns import Trace

PARTITIONS = ("run_id", "rank")
#: Columns of few distinct values, written dictionary-encoded. Not the others: dictionary pages
#: of ``args`` JSON or timestamps are built, overflow and are thrown away (a third of the write time).
DICTIONARY_COLUMNS = frozenset(("trace_key", "kind", "name", "region", "pid_label", "tid_label", "phase", "cache",
                                "compile_id"))
MARKER = "_cuvil_dataset.json"
#: What a directory written before :data:`MARKER` existed may hold.
UNMARKED_VERSIONS = frozenset({1, 2})


@dataclass
class ExportResult:
    """What an export wrote: the traces (key, run, rank, path) and rows per table."""

    directory: str
    traces: list[dict[str, Any]] = field(default_factory=list)
    rows: dict[str, int] = field(default_factory=dict)
    files: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"directory": self.directory, "traces": self.traces, "rows": self.rows, "files": self.files}


def write_parquet(trace: Trace, directory: str | os.PathLike[str], result: ExportResult | None = None) -> ExportResult:
    """Write every source of ``trace`` into the dataset at ``directory`` (created if needed)."""
    pq = _parquet()
    root = Path(directory)
    result = result or ExportResult(directory=os.fspath(root))
    mark_version(root)
    for i, source in enumerate(trace.sources):
        tables = arrow.source_tables(trace, i)
        facts = tables["traces"].to_pylist()[0]
        part = f"run_id={facts['run_id']}/rank={facts['rank']}"
        for name, table in tables.items():
            if table.num_rows == 0:
                continue
            target = root / name / part / f"{facts['trace_key']}.parquet"
            _write(pq, table.drop_columns(list(PARTITIONS)), target)
            result.rows[name] = result.rows.get(name, 0) + table.num_rows
            result.files += 1
        result.traces.append({"trace_key": facts["trace_key"], "run_id": facts["run_id"], "rank": facts["rank"],
                              "path": source.path, "format": source.format, "events": facts["events"]})
    return result


def export_files(paths: Sequence[str | os.PathLike[str]], directory: str | os.PathLike[str],
                 workers: int | None = 1, progress: Any = None) -> ExportResult:
    """Load each trace file on its own and write it into ``directory``, in ``workers`` processes
    (default 1; None: one per core). Memory: one trace at a time per process."""
    from cuvil_pgc._pool import pool_map

    names = [os.fspath(p) for p in paths]
    result = ExportResult(directory=os.fspath(directory))
    mark_version(Path(directory))           # before the workers, so none takes another's files for old ones
    for part in pool_map(_export_one, names, workers, progress, args=(os.fspath(directory),)):
        result.traces += part.traces
        result.files += part.files
        for name, n in part.rows.items():
            result.rows[name] = result.rows.get(name, 0) + n
    result.traces.sort(key=lambda t: t["path"])
    return result


def _export_one(path: str, directory: str) -> ExportResult:
    from cuvil_pgc.trace.reader import load_trace

    return write_parquet(load_trace(path), directory)


def _write(pq: Any, table: Any, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    _atomically(target, lambda tmp: pq.write_table(
        table, tmp, compression="zstd", use_dictionary=[c for c in table.column_names if c in DICTIONARY_COLUMNS]))


def _atomically(target: Path, write: Callable[[Path], object]) -> None:
    """``write`` a temporary file beside ``target``, then rename it over ``target`` (readers never
    see half a file); an OSError is a TraceError naming ``target``."""
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    try:
        write(tmp)
        os.replace(tmp, target)
    except OSError as exc:
        raise TraceError(f"cannot be written ({exc.strerror or exc})", path=target,
                         fix="check that the export directory is writable and has space") from None
    finally:
        tmp.unlink(missing_ok=True)


def schema_versions(directory: str | os.PathLike[str]) -> frozenset[int]:
    """The schema versions of a dataset's files, from its :data:`MARKER` (:data:`UNMARKED_VERSIONS`
    without one)."""
    try:
        doc = orjson.loads((Path(directory) / MARKER).read_bytes())
        versions = frozenset(int(v) for v in doc["schema_versions"])
    except FileNotFoundError:
        return UNMARKED_VERSIONS
    except (OSError, ValueError, TypeError, KeyError, orjson.JSONDecodeError):
        return UNMARKED_VERSIONS | {arrow.SCHEMA_VERSION}     # unreadable: assume any, read the merging way
    return versions or UNMARKED_VERSIONS


def mark_version(root: Path) -> None:
    """Add this writer's schema version to the directory's :data:`MARKER` (files already there
    without a marker count as :data:`UNMARKED_VERSIONS`)."""
    if (root / MARKER).exists():
        versions = schema_versions(root)
    else:
        versions = UNMARKED_VERSIONS if has_files(root, "traces") else frozenset()
    if arrow.SCHEMA_VERSION in versions and (root / MARKER).exists():
        return
    root.mkdir(parents=True, exist_ok=True)
    doc = orjson.dumps({"schema_versions": sorted(versions | {arrow.SCHEMA_VERSION})})
    _atomically(root / MARKER, lambda tmp: tmp.write_bytes(doc))


def _parquet() -> Any:
    arrow.pyarrow()
    import pyarrow.parquet as pq

    return pq


def is_dataset(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a directory written by :func:`write_parquet`."""
    return (Path(path) / "traces").is_dir()


def table_glob(directory: str | os.PathLike[str], table: str) -> str:
    """The glob of one table's files (``*.parquet`` leaves the writer's hidden temporaries out)."""
    return os.path.join(os.fspath(directory), table, "run_id=*", "rank=*", "*.parquet")


def has_files(directory: str | os.PathLike[str], table: str) -> bool:
    return next(glob.iglob(table_glob(directory, table)), None) is not None


def table_files(directory: str | os.PathLike[str], table: str) -> list[str]:
    """The Parquet files of one table of the dataset (sorted; hidden temporaries left out)."""
    base = Path(directory) / table
    if not base.is_dir():
        return []
    return sorted(glob.glob(table_glob(directory, table)))


def read_tables(directories: Iterable[str | os.PathLike[str]], tables: Iterable[str] = arrow.TABLES) -> dict[str, Any]:
    """The tables of one or more datasets as Arrow tables (partition columns included)."""
    dirs = [os.fspath(d) for d in directories]
    for d in dirs:
        if not is_dataset(d):
            raise TraceError("is not a cuvil-pgc Parquet export (no traces/ directory)", path=d,
                             fix="write one with: cuvil-pgc export TRACE... --parquet DIR")
    return _read({name: [(d, table_files(d, name)) for d in dirs] for name in tables},
                 dirs[0] if len(dirs) == 1 else None)


def _read(files: dict[str, list[tuple[str, list[str]]]], where: str | None) -> dict[str, Any]:
    """{table: [(dataset directory, its files of that table)]} -> {table: Arrow table}."""
    import pyarrow.dataset as ds

    pa = arrow.pyarrow()
    sch = arrow.schemas()
    partitioning = ds.partitioning(pa.schema([("run_id", pa.string()), ("rank", pa.int32())]), flavor="hive")
    out = {}
    for name, per_dir in files.items():
        parts = []
        for d, paths in per_dir:
            if paths:
                # The full schema: a column older files lack reads as null, then as its default.
                data = ds.dataset(paths, schema=sch[name], format="parquet", partitioning=partitioning,
                                  partition_base_dir=os.path.join(d, name))
                parts.append(arrow.fill_added_columns(name, data.to_table()))
        out[name] = pa.concat_tables(parts) if parts else sch[name].empty_table()
    if "traces" in out:
        arrow.check_version(out["traces"], where)
    return out


def trace_units(directory: str | os.PathLike[str]) -> list[str]:
    """One item of work per trace of a dataset: its file in the ``traces`` table (sorted), which
    :func:`read_unit` turns into that trace alone. ``analyze DIR --engine`` maps over them."""
    return table_files(directory, "traces")


def is_unit(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a trace's file in a dataset's ``traces`` table (see :func:`trace_units`)."""
    p = Path(path)
    return (p.suffix == ".parquet" and len(p.parents) >= 4 and p.parents[2].name == "traces"
            and p.parent.name.startswith("rank=") and p.parents[1].name.startswith("run_id="))


def read_unit(path: str | os.PathLike[str]) -> Trace:
    """The Trace of the one exported trace whose ``traces`` file is ``path``: its rows of every
    table, read from the files of the same partition and key, nothing else."""
    p = Path(path)
    if not p.is_file():
        raise TraceError("does not exist", path=p, fix="check the path")
    root, part = p.parents[3], p.relative_to(p.parents[2])
    d = os.fspath(root)
    files = {name: [(d, [os.fspath(f)] if (f := root / name / part).is_file() else [])] for name in arrow.TABLES}
    return arrow.from_arrow(_read(files, os.fspath(p)))


def read_parquet(*directories: str | os.PathLike[str]) -> Trace:
    """The Trace of every source in the datasets (``analyze`` reads it like trace files)."""
    return arrow.from_arrow(read_tables(directories))
