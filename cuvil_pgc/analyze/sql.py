"""SQL over many traces with DuckDB (embedded): ``cuvil_pgc.sql(query, *sources)`` -> Arrow table.

Sources are trace files (ours, torch.profiler, aggregate summaries; read and flattened in memory),
globs of them, and Parquet directories written by ``cuvil-pgc export --parquet`` (read in place,
never loaded whole). Views are named as the tables of :mod:`cuvil_pgc.trace.arrow` —
``traces``, ``regions``, ``ops``, ``kernels``, ``compile``, ``counters``, ``histograms`` — each the
union of every source, with ``trace_key``, ``run_id`` and ``rank`` on every row, so a join on
``trace_key`` reaches a trace's host, world size and start time. A table no source has rows for is
an empty view with its full schema, so shipped queries run on any mix of sources.

The same Parquet is what Spark, Trino or BigQuery read at larger scale (README, "Limits and the
scaling path"). :data:`QUERIES` are the shipped, documented queries (``--query NAME``).
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Sequence
from typing import Any

from cuvil_pgc.errors import ConfigError, TraceError
from cuvil_pgc.trace import arrow, parquet
from cuvil_pgc.trace.discover import trace_files

#: name -> (what it answers, the SQL)
QUERIES: dict[str, tuple[str, str]] = {
    "top-regions": (
        "Regions over every trace: calls, total, mean and p50/p99 latency, by total time.",
        """SELECT region, count(*) AS calls, count(DISTINCT trace_key) AS traces,
       round(sum(dur_us) / 1000, 3) AS total_ms, round(avg(dur_us), 3) AS mean_us,
       round(quantile_cont(dur_us, 0.5), 3) AS p50_us, round(quantile_cont(dur_us, 0.99), 3) AS p99_us
FROM regions GROUP BY region ORDER BY total_ms DESC LIMIT 50"""),
    "slowest-ranks": (
        "Per run, each rank's time in root regions and how far it is above the run's median rank.",
        """WITH per_rank AS (
    SELECT run_id, rank, sum(dur_us) AS root_us, count(*) AS calls
    FROM regions WHERE region NOT LIKE '%/%' GROUP BY run_id, rank)
SELECT run_id, rank, calls, round(root_us / 1000, 3) AS root_ms,
       round(100 * (root_us / median(root_us) OVER (PARTITION BY run_id) - 1), 2) AS above_median_pct
FROM per_rank ORDER BY above_median_pct DESC, run_id, rank LIMIT 50"""),
    "regressions-by-day": (
        "Per region and UTC day, the mean latency and its change from the region's previous day.",
        """WITH daily AS (
    SELECT r.region, date_trunc('day', t.start_time) AS day, avg(r.dur_us) AS mean_us, count(*) AS calls
    FROM regions r JOIN traces t USING (trace_key)
    WHERE t.start_time IS NOT NULL GROUP BY r.region, day),
changes AS (
    SELECT region, day, calls, mean_us,
           lag(mean_us) OVER (PARTITION BY region ORDER BY day) AS previous_us FROM daily)
SELECT region, CAST(day AS DATE) AS day, calls, round(mean_us, 3) AS mean_us, round(previous_us, 3) AS previous_us,
       round(100 * (mean_us / previous_us - 1), 2) AS change_pct
FROM changes WHERE previous_us > 0 ORDER BY change_pct DESC, region LIMIT 50"""),
    "top-kernels": (
        "GPU kernels (and memcpy/memset) over every trace by total time.",
        """SELECT name, kind, count(*) AS calls, round(sum(dur_us) / 1000, 3) AS total_ms,
       round(avg(dur_us), 3) AS mean_us, count(DISTINCT trace_key) AS traces
FROM kernels GROUP BY name, kind ORDER BY total_ms DESC LIMIT 50"""),
    "top-ops": (
        "CPU operators over every trace by total time, with the region they ran in most.",
        """SELECT name, count(*) AS calls, round(sum(dur_us) / 1000, 3) AS total_ms, round(avg(dur_us), 3) AS mean_us,
       mode(region) AS usual_region
FROM ops WHERE kind = 'cpu_op' GROUP BY name ORDER BY total_ms DESC LIMIT 50"""),
    "compile-time": (
        "torch.compile time per run and phase, with cache hits and misses.",
        """SELECT run_id, phase, count(*) AS events, round(sum(dur_us) / 1000, 3) AS total_ms,
       count(*) FILTER (WHERE cache = 'hit') AS cache_hits, count(*) FILTER (WHERE cache = 'miss') AS cache_misses
FROM compile GROUP BY run_id, phase ORDER BY total_ms DESC"""),
    "traces": (
        "Every trace: run, rank, host, start time, format, events and duration.",
        """SELECT run_id, rank, world_size, host, "window", start_time, format, events,
       round(duration_us / 1e6, 3) AS duration_s, path
FROM traces ORDER BY run_id, rank, start_time"""),
}


def duckdb() -> Any:
    try:
        import duckdb as db
    except ImportError:
        raise ConfigError("SQL over traces needs DuckDB", fix="pip install 'cuvil-pgc[fleet]'") from None
    return db


def query_text(name: str) -> str:
    """The SQL of a shipped query, or a ConfigError listing them."""
    if name not in QUERIES:
        raise ConfigError(f"there is no shipped query {name!r}", fix=f"use one of: {', '.join(QUERIES)}")
    return QUERIES[name][1]


def sql(query: str, *sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> Any:
    """Run ``query`` (DuckDB SQL) over the traces of ``sources``; returns a ``pyarrow.Table``.

    Args:
        query: SQL over the views ``traces``, ``regions``, ``ops``, ``kernels``, ``compile``,
            ``counters``, ``histograms``; or the name of a shipped query (:data:`QUERIES`).
        *sources: trace files, globs, or Parquet directories from ``cuvil-pgc export --parquet``.
    """
    text = QUERIES[query][1] if query in QUERIES else query
    con = connect(*sources, tables=[t for t in arrow.TABLES if re.search(rf"\b{t}\b", text, re.IGNORECASE)])
    try:
        return _fetch_arrow(con, text)
    finally:
        con.close()


def _fetch_arrow(con: Any, text: str) -> Any:
    db = duckdb()
    try:
        result = con.sql(text)
    except db.Error as exc:
        raise ConfigError(f"the SQL query failed: {exc}".splitlines()[0],
                          fix="the views are traces, regions, ops, kernels, compile, counters, histograms; "
                              "'DESCRIBE regions' lists a view's columns") from None
    if result is None:                       # a statement without results
        return arrow.pyarrow().table({})
    table = result.to_arrow_table() if hasattr(result, "to_arrow_table") else result.arrow()
    return table.read_all() if hasattr(table, "read_all") else table


def connect(*sources: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
            tables: Sequence[str] | None = None) -> Any:
    """An in-memory DuckDB connection with the views over ``sources`` (the caller closes it).

    ``tables``: the views to build over the sources (default all); the others are empty views
    (binding a view over a thousand Parquet files reads their footers: ~0.06 s a table)."""
    files, dirs = resolve_sources(sources)
    for d in dirs:
        _check_versions(d)
    db = duckdb()
    con = db.connect(":memory:")
    memory = _load_files(files)
    sch = arrow.schemas()
    current = frozenset({arrow.SCHEMA_VERSION})
    for name in arrow.TABLES:
        cols = ", ".join(f'"{c}"' for c in sch[name].names)
        parts = []
        wanted = tables is None or name in tables
        con.register(f"_empty_{name}", sch[name].empty_table())
        if memory is not None and wanted:
            con.register(f"_mem_{name}", memory[name])
            parts.append(f"SELECT {cols} FROM _mem_{name}")
        with_files = [d for d in dirs if wanted and parquet.has_files(d, name)]
        same = [d for d in with_files if parquet.schema_versions(d) == current]
        mixed = [d for d in with_files if d not in same]
        if same:
            # Files of this version only: union_by_name would read every footer (0.5 s per 1,000 files).
            parts.append(f"SELECT {cols} FROM {_read(name, same)}")
        if mixed:
            # Older files lack the columns added since: merge by name, then the full schema's columns
            # (from the empty table) with each added column's default where a file had none.
            parts.append(f"SELECT {_with_defaults(name, sch[name].names)} FROM (SELECT * FROM "
                         f"{_read(name, mixed, union_by_name=True)} UNION ALL BY NAME SELECT * FROM _empty_{name})")
        if not parts:
            parts.append(f"SELECT {cols} FROM _empty_{name}")
        con.execute(f'CREATE VIEW "{name}" AS ' + " UNION ALL BY NAME ".join(parts))
    return con


def _read(name: str, dirs: list[str], union_by_name: bool = False) -> str:
    paths = ", ".join(_literal(parquet.table_glob(d, name)) for d in dirs)
    merge = ", union_by_name = true" if union_by_name else ""
    return (f"read_parquet([{paths}], hive_partitioning = true, "
            f"hive_types = {{'run_id': VARCHAR, 'rank': INTEGER}}{merge})")


def _with_defaults(name: str, columns: Sequence[str]) -> str:
    added = arrow.ADDED_COLUMNS.get(name, {})
    out = []
    for c in columns:
        if c in added:
            default = added[c]
            value = "[]::VARCHAR[]" if default == [] else repr(default)
            out.append(f'coalesce("{c}", {value}) AS "{c}"')
        else:
            out.append(f'"{c}"')
    return ", ".join(out)


def _check_versions(directory: str) -> None:
    newer = max(parquet.schema_versions(directory))
    if newer > arrow.SCHEMA_VERSION:
        raise TraceError(f"holds Parquet schema version {newer}; this cuvil-pgc reads up to {arrow.SCHEMA_VERSION}",
                         path=directory, fix="upgrade cuvil-pgc")


def _literal(path: str) -> str:
    return "'" + path.replace("'", "''") + "'"


def resolve_sources(sources: Sequence[Any]) -> tuple[list[str], list[str]]:
    """(trace files, Parquet directories) named by ``sources``: paths, globs, export directories and
    directories of trace files (lists accepted)."""
    flat: list[str] = []
    for s in sources:
        flat.extend(os.fspath(x) for x in s) if isinstance(s, (list, tuple)) else flat.append(os.fspath(s))
    if not flat:
        raise ConfigError("no sources given", fix="pass trace files, globs or directories from cuvil-pgc export")
    files: list[str] = []
    dirs: list[str] = []
    for s in flat:
        matches = sorted(glob.glob(s)) if glob.has_magic(s) and not os.path.exists(s) else [s]
        if not matches:
            raise TraceError(f"the pattern {s!r} matches no files", fix="check the glob (quote it for the shell)")
        for m in matches:
            if parquet.is_dataset(m):
                dirs.append(m)
            elif os.path.isdir(m) or os.path.exists(m) or os.path.exists(m + ".partial"):
                files += trace_files([m])
            else:
                raise TraceError("does not exist", path=m, fix="check the path")
    return files, dirs


def _load_files(files: list[str]) -> dict[str, Any] | None:
    """The tables of trace files, read one at a time (each flattened, then released)."""
    if not files:
        return None
    from cuvil_pgc.trace.reader import load_trace

    pa = arrow.pyarrow()
    parts: dict[str, list] = {name: [] for name in arrow.TABLES}
    for f in files:
        tables = arrow.to_arrow(load_trace(f))
        for name, table in tables.items():
            parts[name].append(table)
    return {name: pa.concat_tables(ts) for name, ts in parts.items()}
