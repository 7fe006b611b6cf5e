"""Commands for many traces: ``cuvil-pgc export --parquet DIR``."""

from __future__ import annotations

from typing import Any

import typer


def register(app: typer.Typer) -> None:
    _register_export(app)


def _register_export(app: typer.Typer) -> None:
    @app.command()
    def export(
        traces: list[str] = typer.Argument(..., metavar="TRACE...",
                                           help="Trace files, globs or directories (ours, torch.profiler, summaries)."),
        parquet_dir: str = typer.Option(..., "--parquet", metavar="DIR",
                                        help="Write Parquet tables here, partitioned by run and rank."),
        json_out: bool = typer.Option(False, "--json", help="Print what was written as one JSON document."),
    ) -> None:
        """Write traces as Parquet tables (traces, regions, ops, kernels, counters, compile) for SQL engines."""
        from rich.console import Console

        from cuvil_pgc.trace.discover import trace_files
        from cuvil_pgc.trace.parquet import export_files

        paths = trace_files(traces)
        err = Console(stderr=True)
        with err.status(f"exporting {len(paths)} trace(s)...") if err.is_terminal else _nothing():
            result = export_files(paths, parquet_dir)
        if json_out:
            from cuvil_pgc.cli import emit_json

            emit_json(result.to_json())
            return
        rows = ", ".join(f"{n:,} {name}" for name, n in sorted(result.rows.items()) if name != "traces")
        Console().print(f"exported {len(result.traces)} trace(s) to {result.directory}: {rows or 'no rows'} "
                        f"({result.files} files)", markup=False, highlight=False)


def _nothing() -> Any:
    import contextlib

    return contextlib.nullcontext()
