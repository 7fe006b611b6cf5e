"""Always-on aggregates and on-demand capture windows (signal, request file, `cuvil-pgc capture`)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from cuvil_pgc import ProfileRegion, profile
from cuvil_pgc.trace.summary import PathStats, bucket_bounds, bucket_of, merge_summaries
from tests._regionlines import with_paths

WORKER = os.path.join(os.path.dirname(__file__), "_on_demand_worker.py")


def test_bucket_bounds_contain_every_duration():
    for ns in [2, 3, 7, 8, 9, 100, 1000, 12_345, 999_999_937, 2**40 + 5]:
        lo, hi = bucket_bounds(bucket_of(ns))
        assert lo <= ns < hi and (hi - lo) / lo <= 0.125 + 1e-12


def test_aggregate_mode_folds_threads_into_histograms(tmp_path):
    path = tmp_path / "svc.summary.json"

    def work(n):
        for _ in range(n):
            with ProfileRegion("serve"):
                with ProfileRegion("decode"):
                    pass

    with profile(path, mode="aggregate", flush_s=0.05) as session:
        threads = [threading.Thread(target=work, args=(500,)) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        time.sleep(0.2)
        assert session.flushes >= 1            # periodic flush while running
    doc = json.loads(path.read_text())["cuvil_summary"]
    rows = {r["path"]: r for r in doc["regions"]}
    assert set(rows) == {"serve", "serve/decode"}
    for row in rows.values():
        assert row["count"] == 2000 and sum(c for _, c in row["buckets"]) == 2000
        assert row["min_ns"] <= row["sum_ns"] / row["count"] <= row["max_ns"]
    assert rows["serve"]["sum_ns"] > rows["serve/decode"]["sum_ns"]


def _summary_from_process(tmp_path, name, n):
    code = ("import sys\nfrom cuvil_pgc import ProfileRegion, profile\n"
            f"with profile({str(tmp_path / name)!r}, mode='aggregate'):\n"
            f"    for _ in range({n}):\n"
            "        with ProfileRegion('serve'):\n            pass\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    return json.loads((tmp_path / name).read_text())


def test_histograms_merge_across_processes(tmp_path):
    a = _summary_from_process(tmp_path, "a.summary.json", 300)
    b = _summary_from_process(tmp_path, "b.summary.json", 700)
    merged = merge_summaries([a, b])["serve"]
    row_a = PathStats.from_json(a["cuvil_summary"]["regions"][0])
    row_b = PathStats.from_json(b["cuvil_summary"]["regions"][0])
    assert merged.count == 1000 and merged.sum_ns == row_a.sum_ns + row_b.sum_ns
    assert merged.min_ns == min(row_a.min_ns, row_b.min_ns)
    for bucket in set(row_a.buckets) | set(row_b.buckets):
        assert merged.buckets[bucket] == row_a.buckets.get(bucket, 0) + row_b.buckets.get(bucket, 0)


def _start_worker(tmp_path, seconds):
    ready = tmp_path / "pid"
    env = dict(os.environ, CUVIL_PGC_ON_DEMAND="1", CUVIL_PGC_CONTROL_DIR=str(tmp_path))
    proc = subprocess.Popen([sys.executable, WORKER, str(ready), str(seconds)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.05)
    return proc


def _regions_and_ops(path):
    doc = json.loads(open(path, encoding="utf-8").read())
    regions = with_paths(doc["traceEvents"])
    ops = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op"]
    return regions, ops


@pytest.mark.slow
def test_sigusr2_opens_a_window_on_a_running_process(tmp_path):
    proc = _start_worker(tmp_path, seconds=12)
    time.sleep(1.0)
    os.kill(proc.pid, signal.SIGUSR1)      # the host's own handler still works
    os.kill(proc.pid, signal.SIGUSR2)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    window = tmp_path / f"cuvil-pgc-{proc.pid}.0.trace.json"
    regions, ops = _regions_and_ops(window)
    assert {e["args"]["path"] for e in regions} == {"serve", "serve/matmul"}
    assert any(op["name"] == "aten::mm" and op["args"]["region"] == "serve/matmul" for op in ops)
    summary = json.loads((tmp_path / f"cuvil-pgc-{proc.pid}.summary.json").read_text())["cuvil_summary"]
    assert {r["path"] for r in summary["regions"]} == {"serve", "serve/matmul"}


@pytest.mark.slow
def test_cuvil_pgc_capture_gets_the_window_path(tmp_path):
    proc = _start_worker(tmp_path, seconds=20)
    try:
        result = subprocess.run([sys.executable, "-m", "cuvil_pgc", "capture", "--pid", str(proc.pid),
                                 "--seconds", "1", "--dir", str(tmp_path)],
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr
        trace = result.stdout.strip()
        assert trace == str(tmp_path / f"cuvil-pgc-{proc.pid}.0.trace.json")
        regions, _ = _regions_and_ops(trace)
        assert regions and all(e["args"]["path"].startswith("serve") for e in regions)
    finally:
        proc.kill()
        proc.wait()


def test_capture_refuses_a_missing_process(tmp_path):
    result = subprocess.run([sys.executable, "-m", "cuvil_pgc", "capture", "--pid", "999999",
                             "--dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1 and "no process with pid 999999" in result.stderr


def _summary(tmp_path, name, seconds_per_call):
    path = tmp_path / name
    with profile(path, mode="aggregate"):
        for _ in range(200):
            with ProfileRegion("serve"):
                with ProfileRegion("decode"):
                    t = time.perf_counter()
                    while time.perf_counter() - t < seconds_per_call:
                        pass
    return path


def test_analyze_report_and_diff_read_summaries(tmp_path):
    from cuvil_pgc.analyze import analyze
    from cuvil_pgc.analyze.diff import diff
    from cuvil_pgc.trace import load_trace
    from cuvil_pgc.viewer import render_html

    fast = _summary(tmp_path, "fast.summary.json", 0.0002)
    slow = _summary(tmp_path, "slow.summary.json", 0.0008)
    trace = load_trace(fast)
    assert trace.sources[0].format == "summary" and len(trace) == 0
    analysis = analyze(trace)
    serve, decode = analysis.region("serve"), analysis.region("serve/decode")
    assert serve.calls == 200 and decode.parent == "serve" and decode.depth == 1
    assert serve.self_us == pytest.approx(serve.total_us - decode.total_us)
    assert 150 <= decode.p50_us <= 400 and decode.p50_us <= decode.p99_us
    merged = analyze([fast, slow])
    assert merged.region("serve").calls == 400
    html = render_html(analysis)
    assert "serve/decode" in html
    result = diff(fast, slow)
    row = next(r for r in result["regions"] if r["path"] == "serve/decode")
    assert row["verdict"] == "slower" and row["ratio"] > 2


def test_summary_and_events_cannot_mix(tmp_path):
    from cuvil_pgc.analyze import analyze
    from cuvil_pgc.errors import AnalysisError

    summary = _summary(tmp_path, "s.summary.json", 0.0)
    with profile(tmp_path / "e.trace.json", ops=False, compile=False, sample_hz=0, gpu="off"):
        with ProfileRegion("serve"):
            pass
    with pytest.raises(AnalysisError, match="separately"):
        analyze([str(summary), str(tmp_path / "e.trace.json")])


def test_damaged_summary_is_a_clear_error(tmp_path):
    from cuvil_pgc.errors import TraceError
    from cuvil_pgc.trace import load_trace

    path = _summary(tmp_path, "d.summary.json", 0.0)
    doc = json.loads(path.read_text())
    doc["cuvil_summary"]["regions"][0]["count"] = -5
    path.write_text(json.dumps(doc))
    with pytest.raises(TraceError, match="'count' must be a non-negative integer"):
        load_trace(path)
