"""Compile summary (analyze) and its console rendering (viewer), from raw events and through load_trace."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import orjson
import pytest
from rich.console import Console

from cuvil_pgc.analyze.compile_summary import summarize_compile, summarize_compile_events
from cuvil_pgc.instrument.samplers._compile_records import CompileRecordProcessor
from cuvil_pgc.trace.writer import TraceWriter
from cuvil_pgc.viewer.console_compile import render_compile_summary

GOLDEN = Path(__file__).parent / "data" / "compile_records"
PID = 4242
BREAK_AT = "capture.py:" + str(next(i for i, line in enumerate((GOLDEN / "capture.py").read_text().splitlines(), 1)
                                    if "torch._dynamo.graph_break()" in line))


def _golden_events(name: str) -> tuple[list[dict], int]:
    """Compile events the sampler makes of real torch records (see data/compile_records/capture.py)."""
    records = [tuple(orjson.loads(line)) for line in gzip.open(GOLDEN / f"{name}.jsonl.gz")]
    start_ns = records[0][0]
    processor = CompileRecordProcessor(lambda us: us - start_ns / 1000.0, pid=PID)
    events = processor.feed(records) + processor.finish()
    return json.loads(json.dumps(events)), start_ns


def _ev(name: str, ts: float, dur: float, phase: str, cid: str | None = "0/0", tid: int = 1, **args) -> dict:
    return {"ph": "X", "cat": "compile", "name": name, "pid": PID, "tid": tid, "ts": ts, "dur": dur,
            "args": {"compile_id": cid, "phase": phase, "cache": None, "reason": None, **args}}


def test_golden_cold_summary_counts_graphs_breaks_recompiles_and_misses():
    events, _ = _golden_events("cold")
    summary = summarize_compile_events(events)
    totals = summary["totals"]
    assert (totals["compiles"], totals["graphs"], totals["graph_breaks"], totals["recompiles"]) == (4, 4, 2, 2)
    assert totals["cache_hit_rate"] == 0.0 and totals["fx_cache"] == {"miss": 4} and totals["run_ms"] is None
    by_id = {g["compile_id"]: g for g in summary["graphs"]}
    assert list(by_id) == ["0/0", "1/0", "0/1", "1/1"]
    first = by_id["0/0"]
    assert first["frame"] == "f" and first["cache"] == {"fx": "miss", "aot": "miss"}
    assert len(first["graph_breaks"]) == 1 and first["graph_breaks"][0]["location"].endswith(BREAK_AT)
    assert by_id["0/1"]["recompiles"] == [
        "recompile of f (0/1): input x shape changed [4, 8] -> [6, 8] "
        "(guard: tensor 'x' size mismatch at index 0. expected 4, actual 6)"]
    assert any("input 0 shape [4, 8] -> [s77, 8]" in m for m in by_id["0/1"]["cache_misses"])
    for g in summary["graphs"]:
        assert sum(g["phases"].values()) == pytest.approx(g["total_ms"], rel=1e-3), g["compile_id"]
        assert g["worker_ms"] > 0          # Inductor compiled kernels on a worker thread
    assert totals["compile_ms"] == pytest.approx(sum(g["total_ms"] for g in summary["graphs"]))
    json.dumps(summary)                    # JSON-able as analyze --json needs


def test_golden_warm_summary_is_all_cache_hits():
    summary = summarize_compile_events(_golden_events("warm")[0])
    assert summary["totals"]["cache_hit_rate"] == 1.0 and summary["totals"]["aot_cache_hit_rate"] == 1.0
    assert all(g["cache"] == {"fx": "hit", "aot": "hit"} and not g["cache_misses"] for g in summary["graphs"])


def test_phases_are_exclusive_times_of_nested_blocks():
    events = [_ev("f", 0, 100, "frame", frame="f"), _ev("bytecode_tracing", 10, 20, "dynamo"),
              _ev("backend_compile", 30, 60, "backend_compile"), _ev("inductor_compile", 40, 40, "inductor"),
              _ev("compile_file", 45, 50, "kernel_compile", tid=2)]
    graph = summarize_compile_events(events)["graphs"][0]
    assert graph["phases"] == {"inductor": 0.04, "dynamo": 0.02, "backend_compile": 0.02, "other": 0.02}
    assert graph["total_ms"] == 0.1 and graph["worker_ms"] == 0.05


def test_run_time_comes_from_compiled_region_ranges():
    # 0/0's first run compiles 1/0 (the code after its graph break) inside its own range.
    events = [_ev("f", 0, 100, "frame", frame="f"), _ev("g", 1010, 50, "frame", cid="1/0", frame="g"),
              {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "pid": PID, "tid": 1,
               "ts": 1000, "dur": 300},
              {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 1/0", "pid": PID, "tid": 1,
               "ts": 1100, "dur": 100},
              {"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "pid": PID, "tid": 1,
               "ts": 2000, "dur": 200}]
    summary = summarize_compile_events(events)
    by_id = {g["compile_id"]: g for g in summary["graphs"]}
    assert (by_id["0/0"]["run_ms"], by_id["0/0"]["run_calls"], by_id["1/0"]["run_ms"]) == (0.45, 2, 0.1)
    assert summary["totals"]["run_ms"] == 0.45     # nested 1/0 run counted once, nested compile not at all


def test_no_compile_events_give_an_empty_summary():
    summary = summarize_compile_events([{"ph": "X", "cat": "region", "name": "r", "ts": 0, "dur": 1}])
    assert summary["graphs"] == [] and summary["totals"]["compiles"] == 0
    assert summary["totals"]["cache_hit_rate"] is None
    text = _render(summary)
    assert "no compilation recorded" in text


def test_summary_through_load_trace_matches_raw_events(tmp_path):
    from cuvil_pgc import load_trace

    events, start_ns = _golden_events("cold")
    path = tmp_path / "golden.trace.json"
    meta = {"schema_version": 1, "pid": PID, "start_unix_ns": start_ns}
    writer = TraceWriter(path, meta)
    writer.write_events(events)
    writer.close([{"ph": "M", "name": "process_name", "pid": PID, "tid": 0, "args": {"name": "golden"}}], meta)
    assert summarize_compile(load_trace(path)) == summarize_compile_events(events)


def test_renderer_shows_times_breaks_recompiles_and_misses():
    text = _render(summarize_compile_events(_golden_events("cold")[0]))
    assert "torch.compile: 4 compiles (4 graphs)" in text and "FX cache hit rate 0%" in text
    assert "Graph breaks (2)" in text and BREAK_AT in text
    assert "Recompiles (2)" in text and "input x shape changed [4, 8] -> [6, 8]" in text
    assert "Cache misses (8)" in text and "kernel_compile" in text


def test_renderer_keeps_every_column_on_an_80_column_terminal():
    summary = summarize_compile_events(_golden_events("cold")[0])
    text = _render(summary, width=80)
    header = next(line for line in text.splitlines() if "frame" in line and "compile" in line)
    assert header.rstrip().endswith("breaks") and "fx/aot cache" in header
    rows = [line for line in text.splitlines() if line.strip().split(" ")[0] in ("0/0", "1/0", "0/1", "1/1")]
    assert len(rows) == 4 and all(len(line.rstrip()) <= 80 for line in rows)
    for g, row in zip(summary["graphs"], rows, strict=True):     # times are never cut, names may be
        assert f"{g['total_ms'] / 1000:.2f} s" in row


def _render(summary: dict, width: int = 240) -> str:
    console = Console(record=True, width=width)
    console.print(render_compile_summary(summary))
    return console.export_text()
