"""`cuvil-pgc analyze` and `cuvil-pgc diff` end to end on real trace files."""

from __future__ import annotations

import json
import time

import pytest

import cuvil_pgc
from cuvil_pgc import ProfileRegion
from cuvil_pgc.analyze.machine import MachineModel
from cuvil_pgc.cli import main

DATA = "tests/data"


def _cli(argv: list[str], capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def _record(path, sleep_s: float, rank: int | None = None, monkeypatch=None, calls: int = 5) -> str:
    if rank is not None:
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "2")
    with cuvil_pgc.profile(str(path), ops=False, gpu="off", sample_hz=0) as session:
        for _ in range(calls):
            with ProfileRegion("step"), ProfileRegion("work"):
                time.sleep(sleep_s)
    return session.path          # a multi-rank job writes job.rankN.trace.json


@pytest.fixture
def machine_file(tmp_path):
    path = tmp_path / "machine.json"
    MachineModel(device="cpu", name="test cpu", fingerprint="t", peak_flops={"fp32": 100e9}, mem_bw=10e9,
                 dispatch_overhead_s=3e-6).save(path)
    return str(path)


def test_analyze_json_on_kineto_gpu_trace(capsys, machine_file):
    code, out, err = _cli(["analyze", f"{DATA}/kineto_gpu/gpu_two_regions.json", "--json",
                           "--machine", machine_file], capsys)
    assert code == 0
    doc = json.loads(out)
    paths = [r["path"] for r in doc["regions"]]
    assert {"decode", "decode/attention", "preprocess"} <= set(paths)
    assert doc["regions"][0]["hotness"] >= doc["regions"][-1]["hotness"]
    attn = next(r for r in doc["regions"] if r["path"] == "decode/attention")
    assert attn["evidence"]["device"] == "cuda" and attn["evidence"]["kernel_count"] > 0
    assert doc["trace"]["sources"][0]["format"] == "kineto"


def test_analyze_table_and_fallback_warning_on_stderr(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    code, out, err = _cli(["analyze", f"{DATA}/kineto_cpu/cpu_annotated.json", "--top", "3"], capsys)
    assert code == 0
    assert "Hot regions" in out and "model/layer1" in out
    assert "fallback" in err and "fallback" not in out.split("Hot regions")[1]


def test_analyze_filter_and_top(capsys, machine_file):
    code, out, _ = _cli(["analyze", f"{DATA}/kineto_cpu/cpu_annotated.json", "--json", "--machine", machine_file,
                         "--filter", "layer", "--top", "1"], capsys)
    doc = json.loads(out)
    assert code == 0 and len(doc["regions"]) == 1 and "layer" in doc["regions"][0]["path"]


def test_bad_machine_file_and_empty_trace_are_one_line_errors(capsys, tmp_path):
    bad = tmp_path / "machine.json"
    bad.write_text('{"schema_version": 1, "device": "cpu"}')
    code, out, err = _cli(["analyze", f"{DATA}/kineto_cpu/cpu_annotated.json", "--machine", str(bad)], capsys)
    assert code == 1 and out == "" and str(bad) in err and "machine file" in err
    empty = tmp_path / "empty.json"
    empty.write_text('{"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, '
                     '"args": {"name": "x"}}]}')
    code, out, err = _cli(["analyze", str(empty)], capsys)
    assert code == 1 and "no regions, operators or kernels" in err and len(err.strip().splitlines()) == 1


def test_our_traces_from_two_ranks_show_skew(capsys, tmp_path, monkeypatch, machine_file):
    fast = _record(tmp_path / "job.trace.json", 0.002, rank=0, monkeypatch=monkeypatch)
    slow = _record(tmp_path / "job.trace.json", 0.010, rank=1, monkeypatch=monkeypatch)
    assert fast.endswith("job.rank0.trace.json") and slow.endswith("job.rank1.trace.json")
    code, out, _ = _cli(["analyze", fast, slow, "--json", "--machine", machine_file], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["ranks"]["ranks"] == [0, 1]
    work = next(r for r in doc["ranks"]["regions"] if r["path"] == "step/work")
    assert work["slowest_rank"] == 1 and work["skew_us"] > 10_000
    assert next(r for r in doc["regions"] if r["path"] == "step/work")["calls"] == 10


def test_diff_command_finds_the_slower_region(capsys, tmp_path):
    a = _record(tmp_path / "a.trace.json", 0.001, calls=12)      # 12 calls a side: p < 0.01 is reachable
    b = _record(tmp_path / "b.trace.json", 0.006, calls=12)
    code, out, _ = _cli(["diff", a, b, "--json"], capsys)
    doc = json.loads(out)
    work = next(r for r in doc["regions"] if r["path"] == "step/work")
    assert code == 0 and work["verdict"] == "slower" and work["ratio"] > 1.5
    assert work["p_value"] < doc["alpha"] and work["ratio_ci95"][0] > 1.0
    code, out, _ = _cli(["diff", a, b], capsys)
    assert code == 0 and "step/work" in out and "slower" in out
