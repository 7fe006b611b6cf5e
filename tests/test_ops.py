"""The operator view: `cuvil-pgc ops`, the report's table, summary of a regionless trace, and the
profile pass-throughs (record_shapes, with_stack, profile_memory)."""

from __future__ import annotations

import csv
import gzip
import io
import json

import pytest
from typer.testing import CliRunner

from cuvil_pgc.analyze.operators import operator_stats
from cuvil_pgc.cli import app
from tests._tracebuild import build_trace, op, region


def _runtime(ts, corr, tid=1):
    return {"kind": "runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2.0, "tid": tid, "correlation": corr}


def _kernel(ts, dur, corr):
    return {"kind": "kernel", "name": "sgemm", "ts": ts, "dur": dur, "tid": 7, "pid": 0, "correlation": corr}


def test_self_total_and_device_time_follow_nesting_and_correlation():
    events = [region("model/model.fc", 0.0, 100.0),
              op("aten::linear", 10.0, 50.0, flops=1000.0, bytes=400.0),
              op("aten::addmm", 20.0, 30.0, flops=1000.0),
              _runtime(25.0, 1), _kernel(60.0, 40.0, 1),
              op("aten::relu", 70.0, 10.0), _runtime(72.0, 2), _kernel(110.0, 5.0, 2),
              op("aten::relu", 200.0, 6.0)]
    rows = {r.name: r for r in operator_stats(build_trace(events))}
    linear, addmm, relu = rows["aten::linear"], rows["aten::addmm"], rows["aten::relu"]
    assert (linear.calls, linear.total_cpu_us, linear.self_cpu_us) == (1, 50.0, 20.0)
    assert (addmm.self_cpu_us, addmm.self_device_us, addmm.device_us) == (30.0, 40.0, 40.0)
    assert (linear.self_device_us, linear.device_us) == (0.0, 40.0)      # its child's kernel counts in total
    assert (relu.calls, relu.self_cpu_us, relu.device_us) == (2, 16.0, 5.0)
    assert linear.flops == 1000.0 and linear.bytes == 400.0 and relu.flops is None
    by_calls = operator_stats(build_trace(events), sort="calls")
    assert by_calls[0].name == "aten::relu"
    assert operator_stats(build_trace(events), sort="self_device")[0].name == "aten::addmm"


def test_region_keeps_the_subtree_and_group_by_shape_splits_rows():
    events = [region("model/model.a", 0.0, 50.0), region("model/model.b", 60.0, 50.0),
              op("aten::mm", 5.0, 10.0, args={"shapes": [[2, 3], [3, 4]]}),
              op("aten::mm", 20.0, 10.0, args={"shapes": [[8, 3], [3, 4]]}),
              op("aten::mm", 70.0, 10.0, args={"shapes": [[2, 3], [3, 4]]})]
    trace = build_trace(events)
    assert [r.calls for r in operator_stats(trace, region="model.a")] == [2]
    assert [r.calls for r in operator_stats(trace, region="model/model.b")] == [1]
    shapes = {r.shapes: r.calls for r in operator_stats(trace, group_by_shape=True)}
    assert shapes == {"[2, 3], [3, 4]": 2, "[8, 3], [3, 4]": 1}
    from cuvil_pgc.errors import ConfigError

    with pytest.raises(ConfigError, match="no operators inside region"):
        operator_stats(trace, region="model.zzz")
    # a module call of a torch.profiler trace is named by itself, wherever it sits, with what runs inside it
    stack = build_trace([region("Net_0/Enc_0/Layer_1", 0.0, 50.0), region("Net_0/Enc_0/Layer_1/Linear_3", 5.0, 20.0),
                         region("Net_0/Layer_10", 60.0, 20.0),
                         op("aten::mm", 8.0, 10.0), op("aten::relu", 30.0, 5.0), op("aten::mm", 62.0, 10.0)])
    assert sorted((r.name, r.calls) for r in operator_stats(stack, region="Layer_1")) == [("aten::mm", 1),
                                                                                         ("aten::relu", 1)]
    assert [(r.name, r.calls) for r in operator_stats(stack, region="Linear_3")] == [("aten::mm", 1)]
    with pytest.raises(ConfigError, match="--sort"):
        operator_stats(trace, sort="flops")


def _kineto_trace(path):
    """A small torch.profiler (Kineto) trace: ops with shapes, a launch and its kernel."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::conv2d", "pid": 1, "tid": 1, "ts": 1000.0, "dur": 80.0,
           "args": {"Input Dims": [[1, 3, 8, 8], [4, 3, 3, 3]], "External id": 1}},
          {"ph": "X", "cat": "cpu_op", "name": "aten::cudnn_convolution", "pid": 1, "tid": 1, "ts": 1010.0,
           "dur": 60.0, "args": {"Input Dims": [[1, 3, 8, 8], [4, 3, 3, 3]], "External id": 2}},
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1020.0,
           "dur": 5.0, "args": {"correlation": 7, "External id": 2}},
          {"ph": "X", "cat": "kernel", "name": "implicit_gemm", "pid": 0, "tid": 7, "ts": 1100.0, "dur": 33.0,
           "args": {"correlation": 7, "External id": 2, "device": 0, "stream": 7}}]
    with gzip.open(path, "wt") as f:
        json.dump({"schemaVersion": 1, "traceEvents": ev}, f)
    return str(path)


def test_ops_command_on_a_kineto_trace_at_80_columns(tmp_path):
    trace = _kineto_trace(tmp_path / "k.pt.trace.json.gz")
    result = CliRunner().invoke(app, ["ops", trace, "--group-by-shape"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "aten::cudnn_convolution" in out and "[1, 3, 8, 8], [4, 3, 3, 3]" in out and "33 µs" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    doc = json.loads(CliRunner().invoke(app, ["ops", trace, "--json", "--sort", "device"]).stdout)
    assert doc["rows"][0]["device_us"] == 33.0 and doc["columns"][0] == "name"
    rows = list(csv.DictReader(io.StringIO(CliRunner().invoke(app, ["ops", trace, "--csv"]).stdout)))
    assert {r["name"] for r in rows} == {"aten::conv2d", "aten::cudnn_convolution"}


def test_an_event_without_a_duration_is_zero_long_and_said_so(tmp_path):
    """An X event without ``dur`` was read as 0 µs without a word, by ops and analyze alike."""
    ev = [{"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": 1, "tid": 1, "ts": 0.0, "dur": 60.0},
          {"ph": "X", "cat": "cpu_op", "name": "aten::relu", "pid": 1, "tid": 1, "ts": 70.0}]
    path = tmp_path / "nodur.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    result = CliRunner().invoke(app, ["ops", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert {r["name"]: r["total_cpu_us"] for r in json.loads(result.stdout)["rows"]} == {"aten::addmm": 60.0,
                                                                                       "aten::relu": 0.0}
    assert "1 complete (X) events have no duration (dur): read as 0" in " ".join(result.stderr.split())


def test_summary_of_a_script_without_regions_shows_top_operators(tmp_path):
    trace = _kineto_trace(tmp_path / "k.pt.trace.json.gz")
    result = CliRunner().invoke(app, ["summary", trace], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "Top operators" in result.stdout and "aten::cudnn_convolution" in result.stdout


def test_report_has_the_operator_table(tmp_path):
    from cuvil_pgc.analyze import analyze
    from cuvil_pgc.trace import load_trace
    from cuvil_pgc.viewer.html import render_html

    analysis = analyze(load_trace(_kineto_trace(tmp_path / "k.pt.trace.json.gz")))
    html = render_html(analysis, plotly_js="cdn")
    assert 'id="operators"' in html and 'id="ops-table"' in html and "aten::cudnn_convolution" in html


def test_profile_passes_shapes_stack_and_memory_through(tmp_path):
    import torch

    from cuvil_pgc import profile

    path = str(tmp_path / "p.trace.json")
    with profile(path, ops=True, gpu="off", sample_hz=0, with_stack=True, profile_memory=True,
                 record_shapes=False):
        x = torch.randn(32, 32)
        (x @ x).relu()
    doc = json.loads(open(path).read())
    config = doc["cuvil"]["config"]
    assert (config["record_shapes"], config["with_stack"], config["profile_memory"]) == (False, True, True)
    cats = {e.get("cat") for e in doc["traceEvents"]}
    assert "python_function" in cats
    memory = [e for e in doc["traceEvents"] if e.get("name") == "memory_allocated"]
    assert memory and max(e["args"]["bytes"] for e in memory) >= 32 * 32 * 4
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    assert ops and all(e["args"]["shapes"] is None for e in ops)


def test_ops_and_report_take_a_directory_of_traces_as_analyze_does(tmp_path):
    """``analyze DIR`` worked, ``ops DIR`` and ``report DIR`` said the directory is not a trace file."""
    runs = tmp_path / "runs"
    runs.mkdir()
    _kineto_trace(runs / "a.pt.trace.json.gz")
    _kineto_trace(runs / "b.pt.trace.json.gz")
    doc = json.loads(CliRunner().invoke(app, ["ops", str(runs), "--json"]).stdout)
    assert {r["name"]: r["calls"] for r in doc["rows"]} == {"aten::conv2d": 2, "aten::cudnn_convolution": 2}
    result = CliRunner().invoke(app, ["report", str(runs), "-o", str(tmp_path / "r.html")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.html").stat().st_size > 0
