"""SQL over many traces with a real DuckDB: trace files, globs and Parquet directories as views."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest

from tests._fleet_traces import write_run

pytest.importorskip("pyarrow")
pytest.importorskip("duckdb")

from cuvil_pgc import load_trace, sql  # noqa: E402
from cuvil_pgc.analyze.sql import QUERIES  # noqa: E402
from cuvil_pgc.errors import ConfigError, TraceError  # noqa: E402
from cuvil_pgc.trace import write_parquet  # noqa: E402


@pytest.fixture
def fleet(tmp_path):
    """Two days of a 4-rank job (rank 3 slow) exported to Parquet, and a third day as trace files."""
    ds = tmp_path / "ds"
    for day in (0, 1):
        for p in write_run(tmp_path / f"day{day}", "job", ranks=4, slow=3, day=day, scale=1.0 + day):
            write_parquet(load_trace(p), ds)
    files = write_run(tmp_path / "day2", "job", ranks=4, slow=3, day=2, scale=1.0)
    return ds, files


def test_group_by_region_over_parquet_and_trace_files(fleet, tmp_path):
    ds, files = fleet
    table = sql("SELECT region, count(*) AS calls, count(DISTINCT trace_key) AS traces FROM regions "
                "GROUP BY region ORDER BY region", ds, str(tmp_path / "day2" / "*.trace.json"))
    assert sql("SELECT count(*) AS n FROM traces", ds, tmp_path / "day2").to_pylist() == [{"n": 12}]
    assert table.column_names == ["region", "calls", "traces"]
    assert table.to_pylist() == [{"region": "request", "calls": 12 * 20, "traces": 12},
                                 {"region": "request/decode", "calls": 12 * 20, "traces": 12}]


def test_join_on_trace_key_reaches_the_trace_metadata(fleet):
    ds, _ = fleet
    rows = sql("SELECT t.host, r.rank, count(*) AS n FROM ops r JOIN traces t USING (trace_key) "
               "GROUP BY ALL ORDER BY r.rank", ds).to_pylist()
    assert [(r["host"], r["rank"]) for r in rows] == [("host0", 0), ("host0", 1), ("host1", 2), ("host1", 3)]
    assert all(r["n"] == 2 * 20 * 3 for r in rows)


def test_shipped_queries_answer_what_they_say(fleet):
    ds, files = fleet
    slowest = sql("slowest-ranks", ds, *files).to_pylist()
    assert slowest[0]["rank"] == 3 and slowest[0]["above_median_pct"] > 10
    by_day = sql("regressions-by-day", ds).to_pylist()
    top = by_day[0]
    assert top["change_pct"] > 50 and str(top["day"]) == "2026-12-01"   # day 1 ran at twice the scale
    kernels = sql("top-kernels", ds)
    assert kernels.num_rows == 0 and "total_ms" in kernels.column_names   # no GPU rows: empty, not an error
    ops = sql("top-ops", ds).to_pylist()
    assert ops[0]["name"] == "aten::linear" and ops[0]["usual_region"] == "request/decode"
    assert sql("compile-time", ds).to_pylist()[0]["cache_misses"] == 8
    assert sql("traces", ds).num_rows == 8
    for name in QUERIES:                      # every shipped query runs on a plain trace file too
        sql(name, files[0])


def test_bad_sql_and_bad_sources_are_clear_errors(fleet, tmp_path):
    ds, _ = fleet
    with pytest.raises(ConfigError, match="SQL query failed"):
        sql("SELECT nope FROM regions", ds)
    with pytest.raises(TraceError, match="matches no files"):
        sql("SELECT 1", str(tmp_path / "none*.json"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(TraceError, match="holds no trace files"):
        sql("SELECT 1", tmp_path / "plain")
    with pytest.raises(TraceError, match="does not exist"):
        sql("SELECT 1", tmp_path / "gone.trace.json")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "cuvil_pgc", "sql", *args], capture_output=True, text=True,
                          timeout=300)


def test_sql_cli_prints_json_csv_and_a_table(fleet):
    ds, files = fleet
    run = _cli("SELECT rank, count(*) AS n FROM regions GROUP BY rank ORDER BY rank", str(ds), "--json")
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert doc["columns"] == ["rank", "n"] and doc["rows"][0] == {"rank": 0, "n": 80}
    run = _cli("--query", "slowest-ranks", str(ds), *map(str, files), "--csv")
    assert run.returncode == 0, run.stderr
    rows = list(csv.DictReader(io.StringIO(run.stdout)))
    assert rows[0]["rank"] == "3"
    run = _cli("--query", "top-regions", str(ds))
    assert run.returncode == 0 and "request/decode" in run.stdout
    run = _cli("--query", "no-such-query", str(ds))
    assert run.returncode != 0 and "top-kernels" in run.stderr
