"""Traces as Arrow tables and a partitioned Parquet dataset: schema, keys, round trip to the same Analysis."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests._fleet_traces import write_run, write_trace

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")

from cuvil_pgc import analyze, load_trace, profile  # noqa: E402
from cuvil_pgc.errors import TraceError  # noqa: E402
from cuvil_pgc.trace import from_arrow, read_parquet, to_arrow, write_parquet  # noqa: E402
from cuvil_pgc.trace.arrow import SCHEMA_VERSION, TABLES, schemas  # noqa: E402

DATA = Path(__file__).parent / "data"
KINETO_GPU = DATA / "kineto_gpu" / "gpu_two_regions.json"
KINETO_CPU = DATA / "kineto_cpu" / "cpu_annotated.json.gz"
OURS = DATA / "ours" / "regions.trace.json"
RESNET = sorted((Path(__file__).resolve().parent / "data" / "kineto_resnet50").glob("*.json.gz"))


def _same(a, b, path="$"):
    """Deep equality with floats compared to 1e-9 relative (NaN equal to NaN)."""
    if isinstance(a, float) or isinstance(b, float):
        assert isinstance(a, (int, float)) and isinstance(b, (int, float)), f"{path}: {a!r} vs {b!r}"
        assert (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-9, abs=1e-9), f"{path}: {a} vs {b}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), f"{path}: keys {sorted(a)} vs {sorted(b)}"
        for k in a:
            _same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), f"{path}: {len(a)} vs {len(b)} items"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} vs {b!r}"


def _analysis_doc(trace):
    doc = analyze(trace).to_json(include_timeline=True)
    for s in doc["trace"]["sources"]:
        s.pop("path")     # the rebuilt trace names the original file too; compared separately
    return doc


@pytest.mark.parametrize("path", [OURS, KINETO_GPU, KINETO_CPU], ids=["ours", "kineto_gpu", "kineto_cpu"])
def test_round_trip_through_parquet_gives_the_same_analysis(tmp_path, path):
    trace = load_trace(path)
    write_parquet(trace, tmp_path / "ds")
    back = read_parquet(tmp_path / "ds")
    assert len(back) == len(trace)
    assert back.sources[0].path == trace.sources[0].path
    _same(_analysis_doc(back), _analysis_doc(trace))
    _same_columns(back, trace)


@pytest.mark.slow
@pytest.mark.skipif(not RESNET, reason="shared real traces not present")
def test_round_trip_of_a_real_torch_profiler_trace_keeps_every_column(tmp_path):
    trace = load_trace(RESNET[0])
    write_parquet(trace, tmp_path / "ds")
    back = read_parquet(tmp_path / "ds")
    _same_columns(back, trace)


def _same_columns(back, trace):
    import numpy as np

    assert len(back) == len(trace)
    for col, values in trace.events.items():
        if col in ("name", "region"):
            assert [back.string(i) for i in back.events[col]] == [trace.string(i) for i in values], col
        elif col in ("pid", "tid"):
            named = values <= -2
            assert np.array_equal(back.events[col][~named], values[~named]), col
            assert [back.strings[-2 - i] for i in back.events[col][named]] == \
                   [trace.strings[-2 - i] for i in values[named]], col
        else:
            assert np.array_equal(back.events[col], values, equal_nan=True), col
    assert {r: back.args[r] for r in back.args} == {r: trace.args[r] for r in trace.args if trace.args[r]}
    assert np.array_equal(back.counters["value"], trace.counters["value"], equal_nan=True)
    assert [back.strings[i] for i in back.counters["name"]] == [trace.strings[i] for i in trace.counters["name"]]


def test_every_row_carries_its_trace_key_and_partitions_by_run_and_rank(tmp_path):
    paths = write_run(tmp_path / "in", "job-a", ranks=3) + write_run(tmp_path / "in", "job-b", ranks=1)
    for p in paths:
        write_parquet(load_trace(p), tmp_path / "ds")
    files = sorted(p.relative_to(tmp_path / "ds").as_posix() for p in (tmp_path / "ds").rglob("*.parquet"))
    assert {f.split("/")[0] for f in files} == {"traces", "regions", "ops", "counters", "compile"}
    assert "regions/run_id=job-a/rank=2/" in "\n".join(files)
    assert "regions/run_id=job-b/rank=0/" in "\n".join(files)
    tables = __import__("cuvil_pgc.trace.parquet", fromlist=["read_tables"]).read_tables([tmp_path / "ds"])
    traces = tables["traces"].to_pylist()
    assert sorted((t["run_id"], t["rank"]) for t in traces) == [("job-a", 0), ("job-a", 1), ("job-a", 2), ("job-b", 0)]
    keys = {t["trace_key"] for t in traces}
    assert len(keys) == 4
    for name in ("regions", "ops", "counters", "compile"):
        assert set(tables[name].column("trace_key").to_pylist()) == keys
    row = next(t for t in traces if t["run_id"] == "job-a" and t["rank"] == 2)
    assert row["world_size"] == 3 and row["host"] == "host1" and row["pid"] == 1002
    assert row["format"] == "cuvil" and row["schema_version"] == SCHEMA_VERSION
    assert row["start_time"] is not None and row["events"] == 20 * 5 + 1
    compile_rows = tables["compile"].to_pylist()
    assert {(r["phase"], r["cache"], r["compile_id"]) for r in compile_rows} == {("dynamo", "miss", "0/0")}
    # every file's schema is the documented one, versioned in the schema metadata
    f = next((tmp_path / "ds" / "regions").rglob("*.parquet"))
    schema = pq.read_schema(f)
    assert schema.metadata[b"cuvil.schema_version"] == str(SCHEMA_VERSION).encode()
    assert [n for n in schemas()["regions"].names if n not in ("run_id", "rank")] == schema.names


def test_exporting_the_same_trace_twice_replaces_its_files(tmp_path):
    p = write_trace(tmp_path / "a.trace.json")
    write_parquet(load_trace(p), tmp_path / "ds")
    before = sorted((tmp_path / "ds").rglob("*.parquet"))
    write_parquet(load_trace(p), tmp_path / "ds")
    assert sorted((tmp_path / "ds").rglob("*.parquet")) == before
    assert len(read_parquet(tmp_path / "ds").sources) == 1


def test_aggregate_summaries_export_as_histograms_and_round_trip(tmp_path):
    from cuvil_pgc import ProfileRegion

    path = tmp_path / "serve.summary.json"
    with profile(path, mode="aggregate", flush_s=60):
        for _ in range(50):
            with ProfileRegion("request"):
                with ProfileRegion("decode"):
                    pass
    trace = load_trace(path)
    tables = to_arrow(trace)
    hist = {r["path"]: r for r in tables["histograms"].to_pylist()}
    assert set(hist) == {"request", "request/decode"}
    assert hist["request"]["count"] == 50 and sum(b["count"] for b in hist["request"]["buckets"]) == 50
    assert tables["traces"].column("format").to_pylist() == ["summary"]
    write_parquet(trace, tmp_path / "ds")
    _same(_analysis_doc(read_parquet(tmp_path / "ds")), _analysis_doc(trace))


def test_kineto_string_lanes_and_nulls_survive(tmp_path):
    trace = load_trace(KINETO_GPU)
    tables = to_arrow(trace)
    assert set(tables) == set(TABLES)
    kernels = tables["kernels"]
    assert kernels.num_rows > 0 and set(kernels.column("kind").to_pylist()) <= {"kernel", "memcpy", "memset"}
    ops = tables["ops"].to_pylist()
    assert any(r["kind"] == "runtime" for r in ops)
    assert all(r["flops"] is None or r["flops"] >= 0 for r in ops)     # NaN becomes null
    assert tables["traces"].column("tool").to_pylist() == ["kineto"]
    _same_columns(from_arrow(tables), trace)          # in memory, without Parquet


def test_a_newer_schema_version_is_refused(tmp_path):
    write_parquet(load_trace(OURS), tmp_path / "ds")
    f = next((tmp_path / "ds" / "traces").rglob("*.parquet"))
    t = pq.read_table(f)
    t = t.set_column(t.schema.get_field_index("schema_version"), "schema_version",
                     pa.array([SCHEMA_VERSION + 1], pa.int32()))
    pq.write_table(t, f)
    with pytest.raises(TraceError, match="schema version"):
        read_parquet(tmp_path / "ds")


def test_export_cli_writes_a_dataset_analyze_reads(tmp_path):
    paths = write_run(tmp_path / "in", "job", ranks=2)
    out = tmp_path / "ds"
    run = subprocess.run([sys.executable, "-m", "cuvil_pgc", "export", str(tmp_path / "in"), "--parquet", str(out),
                          "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    doc = json.loads(run.stdout)
    assert len(doc["traces"]) == 2 and doc["rows"]["regions"] == 2 * 40
    run = subprocess.run([sys.executable, "-m", "cuvil_pgc", "analyze", str(out), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    from_parquet = json.loads(run.stdout)
    direct = analyze(load_trace(*paths)).to_json()
    _same([(r["path"], r["calls"], r["total_us"]) for r in from_parquet["regions"]],
          [(r["path"], r["calls"], r["total_us"]) for r in direct["regions"]])


def test_export_of_a_missing_file_names_it(tmp_path):
    run = subprocess.run([sys.executable, "-m", "cuvil_pgc", "export", str(tmp_path / "nope.trace.json"),
                          "--parquet", str(tmp_path / "ds")], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "nope.trace.json" in run.stderr and "Traceback" not in run.stderr


def test_export_in_two_processes_writes_what_one_process_writes(tmp_path):
    from cuvil_pgc.trace.parquet import export_files, read_tables

    paths = write_run(tmp_path / "in", "job", ranks=3)
    one = export_files(paths, tmp_path / "one", workers=1)
    two = export_files(paths, tmp_path / "two", workers=2)
    assert one.rows == two.rows and one.traces == two.traces and one.files == two.files == 3 * 5
    a, b = read_tables([tmp_path / "one"]), read_tables([tmp_path / "two"])
    for name in a:
        sort = [("trace_key", "ascending")] + ([("row", "ascending")] if "row" in a[name].column_names else [])
        assert a[name].sort_by(sort).equals(b[name].sort_by(sort)), name


def test_our_traces_and_summaries_export_the_cuvil_pgc_version_that_recorded_them(tmp_path):
    from cuvil_pgc import ProfileRegion, __version__

    for path, options in ((tmp_path / "run.trace.json", {"ops": False, "gpu": "off"}),
                          (tmp_path / "serve.summary.json", {"mode": "aggregate"})):
        with profile(path, **options):
            with ProfileRegion("request"):
                pass
        trace = load_trace(path)
        assert trace.sources[0].metadata["version"] == __version__
        facts = to_arrow(trace)["traces"].to_pylist()[0]
        assert (facts["tool"], facts["tool_version"]) == ("cuvil-pgc", __version__), path.name


def _downgrade_to_version_1(directory):
    """An export as version 1 wrote it: no fwdbwd column, no warnings field, no marker file."""
    for f in Path(directory).rglob("*.parquet"):
        t = pq.read_table(f)
        drop = [c for c in ("fwdbwd", "warnings") if c in t.column_names]
        t = t.drop_columns(drop)
        if "schema_version" in t.column_names:
            t = t.set_column(t.schema.get_field_index("schema_version"), "schema_version",
                             pa.array([1] * t.num_rows, pa.int32()))
        pq.write_table(t.replace_schema_metadata({b"cuvil.schema_version": b"1"}), f)
    (Path(directory) / "_cuvil_dataset.json").unlink()


def test_a_version_1_dataset_reads_in_python_analyze_and_sql(tmp_path):
    from cuvil_pgc import sql

    paths = write_run(tmp_path / "in", "job", ranks=2)
    ds = tmp_path / "ds"
    for p in paths:
        write_parquet(load_trace(p), ds)
    assert json.loads((ds / "_cuvil_dataset.json").read_text()) == {"schema_versions": [SCHEMA_VERSION]}
    expected = _analysis_doc(read_parquet(ds))
    _downgrade_to_version_1(ds)
    assert "fwdbwd" not in pq.read_schema(next((ds / "regions").rglob("*.parquet"))).names
    back = read_parquet(ds)
    assert set(back.events["fwdbwd"].tolist()) == {-1} and all(s.warnings == [] for s in back.sources)
    _same(_analysis_doc(back), expected)
    run = subprocess.run([sys.executable, "-m", "cuvil_pgc", "analyze", str(ds), "--json"],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    assert {r["path"] for r in json.loads(run.stdout)["regions"]} == {"request", "request/decode"}
    rows = sql("SELECT schema_version, warnings FROM traces", ds).to_pylist()
    assert rows == [{"schema_version": 1, "warnings": []}] * 2
    fwd = sql("SELECT DISTINCT fwdbwd FROM ops", ds).column("fwdbwd").to_pylist()
    assert fwd == [-1]
    # a version-2 export into the same directory: both versions read together
    (extra,) = write_run(tmp_path / "in2", "later", ranks=1)
    write_parquet(load_trace(extra), ds)
    assert json.loads((ds / "_cuvil_dataset.json").read_text()) == {"schema_versions": [1, 2]}
    rows = sql("SELECT run_id, schema_version, warnings FROM traces ORDER BY run_id, rank", ds).to_pylist()
    assert [(r["run_id"], r["schema_version"], r["warnings"]) for r in rows] == \
        [("job", 1, []), ("job", 1, []), ("later", SCHEMA_VERSION, [])]
    assert sql("SELECT count(*) AS n FROM regions", ds).column("n").to_pylist() == [3 * 40]
    assert len(read_parquet(ds).sources) == 3


def test_args_with_newlines_in_their_raw_json_export_whole(tmp_path):
    """Kineto args stay raw JSON until read; one holding a newline (a pretty-printed file) must not
    split the newline-delimited encode of the args column."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10 + i, "dur": 1,
               "args": {"External id": i + 1, "Input Dims": [[2, 3], [3, 4]], "Input type": ["float", "float"]}}
              for i in range(3)]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 20, "dur": 1})
    text = json.dumps({"schemaVersion": 1, "traceEvents": events})
    text = text.replace('"Input Dims": [[2, 3]', '"Input Dims": [[2,\n 3]', 1)       # the first op only
    path = tmp_path / "pretty.pt.trace.json"
    path.write_text(text)
    trace = load_trace(path)
    ops = to_arrow(trace)["ops"].to_pylist()
    by_row = {r["row"]: r for r in ops}
    assert [json.loads(r["args"]) if r["args"] else {} for r in ops] == \
        [{k: v for k, v in trace.args.get(i, {}).items()} for i in sorted(by_row)]
    assert json.loads(ops[0]["args"])["shapes"] == [[2, 3], [3, 4]] and ops[-1]["args"] is None
