"""Commands for many traces: ``cuvil-pgc export --parquet DIR`` and ``cuvil-pgc sql``, and the
engine behind ``analyze --engine local|ray`` (directories and globs of traces)."""

from __future__ import annotations

import contextlib
from typing import Any

import typer

from cuvil_pgc.cli.output import emit_json
from cuvil_pgc.errors import ConfigError


def register(app: typer.Typer) -> None:
    _register_export(app)
    _register_sql(app)


def _register_export(app: typer.Typer) -> None:
    @app.command()
    def export(
        traces: list[str] = typer.Argument(..., metavar="TRACE...",
                                           help="Trace files, globs or directories (ours, torch.profiler, summaries)."),
        parquet_dir: str = typer.Option(..., "--parquet", metavar="DIR",
                                        help="Write Parquet tables here, partitioned by run and rank."),
        json_out: bool = typer.Option(False, "--json", help="Print what was written as one JSON document."),
        workers: int | None = typer.Option(None, "--workers", min=1, help="Processes (default: one per core)."),
    ) -> None:
        """Write traces as Parquet tables (traces, regions, ops, kernels, counters, compile) for SQL engines."""
        from rich.console import Console

        from cuvil_pgc.trace.discover import trace_files
        from cuvil_pgc.trace.parquet import export_files

        paths = trace_files(traces)
        err = Console(stderr=True)
        with err.status(f"exporting {len(paths)} trace(s)...") if err.is_terminal else contextlib.nullcontext():
            result = export_files(paths, parquet_dir, workers=workers)
        if json_out:
            emit_json(result.to_json())
            return
        rows = ", ".join(f"{n:,} {name}" for name, n in sorted(result.rows.items()) if name != "traces")
        Console().print(f"exported {len(result.traces)} trace(s) to {result.directory}: {rows or 'no rows'} "
                        f"({result.files} files)", markup=False, highlight=False)


def _queries_help() -> str:
    from cuvil_pgc.analyze.sql import QUERIES

    return f"Run a shipped query: {', '.join(QUERIES)} (--show prints its SQL)."


def _register_sql(app: typer.Typer) -> None:
    @app.command()
    def sql(
        args: list[str] | None = typer.Argument(None, metavar="[QUERY] SOURCES...",
                                         help="SQL (omit with --query), then trace files, globs or Parquet dirs."),
        query_name: str | None = typer.Option(None, "--query", help=_queries_help()),
        json_out: bool = typer.Option(False, "--json", help="Print the rows as one JSON document."),
        csv_out: bool = typer.Option(False, "--csv", help="Print the rows as CSV."),
        show: bool = typer.Option(False, "--show", help="Print the SQL of --query instead of running it."),
    ) -> None:
        """SQL (DuckDB) over many traces: views traces, regions, ops, kernels, compile, counters, histograms."""
        from cuvil_pgc.analyze.sql import query_text
        from cuvil_pgc.analyze.sql import sql as run_sql

        args = list(args or [])
        if query_name is not None:
            text, sources = query_text(query_name), args
        elif args:
            text, sources = args[0], args[1:]
        else:
            raise ConfigError("no query given", fix="cuvil-pgc sql \"SELECT ...\" SOURCES... or --query NAME SOURCES...")
        if show:
            print(text)
            return
        if not sources:
            raise ConfigError("no sources given", fix="cuvil-pgc sql \"SELECT ...\" TRACE_OR_DIR...")
        if json_out and csv_out:
            raise ConfigError("--json and --csv exclude each other", fix="pick one")
        table = run_sql(text, *sources)
        _print_table(table, json_out, csv_out)


def _print_table(table: Any, json_out: bool, csv_out: bool) -> None:
    rows = table.to_pylist()
    if json_out:
        emit_json({"columns": table.column_names, "rows": rows})
        return
    if csv_out:
        import csv
        import sys

        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(table.column_names)
        writer.writerows([["" if r[c] is None else r[c] for c in table.column_names] for r in rows])
        return
    from rich.console import Console

    from cuvil_pgc.viewer.console_sql import print_rows

    print_rows(table.column_names, rows, Console())


def wants_engine(inputs: list[str]) -> bool:
    """Whether ``analyze`` inputs name many traces (a directory of traces or a glob) rather than files."""
    import glob
    import os

    from cuvil_pgc.trace.parquet import is_dataset

    return any(glob.has_magic(i) and not os.path.exists(i) or os.path.isdir(i) and not is_dataset(i)
               for i in inputs)


def analyze_on_engine(inputs: list[str], engine: str, address: str | None, workers: int | None,
                      machine: Any, filter: str | None) -> Any:
    """``analyze --engine``: the map on the engine with a progress bar (interactive stderr only)."""
    from cuvil_pgc.analyze.engine import analyze_many
    from cuvil_pgc.viewer.progress import count_progress

    with count_progress(f"analysing on {engine}") as advance:
        return analyze_many(inputs, engine, workers=workers, address=address, machine=machine, filter=filter,
                            **({} if advance is None else {"progress": advance}))
