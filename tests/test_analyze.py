"""Analyzer on synthetic columnar traces: statistics, call tree, hotness, bottleneck rules, errors."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil_pgc.analyze import analyze
from cuvil_pgc.analyze._prepare import OUTSIDE, top_level
from cuvil_pgc.analyze.analysis import BOTTLENECKS, Analysis
from cuvil_pgc.analyze.machine import MachineModel
from cuvil_pgc.errors import AnalysisError, ConfigError
from tests._tracebuild import build_trace, kernel, op, op_chain, region

CPU = MachineModel(device="cpu", name="test cpu", fingerprint="t", peak_flops={"fp32": 100e9}, mem_bw=10e9,
                   dispatch_overhead_s=3e-6)
GPU = MachineModel(device="cuda:0", name="test gpu", fingerprint="g", peak_flops={"fp32": 20e12}, mem_bw=1e12,
                   dispatch_overhead_s=3e-6, launch_latency_s=5e-6)


def _tiny_chain(path: str, start: float, n: int = 400) -> list[dict]:
    return [region(path, start, n * 5.5 + 20)] + op_chain(["aten::add"] * n, start + 10, 4.0, 1.5)


def test_statistics_self_time_and_call_tree():
    evs = [region("step", 0, 1000), region("step/a", 100, 300), region("step/a/x", 150, 100),
           region("step", 2000, 3000), region("step/a", 2100, 500)]
    a = analyze(build_trace(evs), machine=CPU)
    step, sa, sax = a.region("step"), a.region("step/a"), a.region("step/a/x")
    assert (step.calls, step.total_us, step.self_us) == (2, 4000.0, 4000.0 - 800.0)
    assert (sa.calls, sa.self_us) == (2, 700.0)
    assert step.mean_us == 2000.0 and step.p50_us == 1000.0 and step.p99_us == 3000.0
    assert (sa.parent, sa.depth, sax.parent, sax.depth, step.parent, step.depth) == ("step", 1, "step/a", 2, None, 0)
    assert step.share == pytest.approx(4000.0 / 5000.0)
    assert sum(sax.histogram["counts"]) == 1


def test_hotness_ranks_by_saving_not_by_time():
    # "big" is 3x longer than "tiny" but runs one op at the memory roof: little to save.
    evs = [region("big", 0, 40_000), op("aten::add", 10, 39_900, bytes=384e6, flops=32e6)]
    evs += _tiny_chain("tiny", 50_000)
    a = analyze(build_trace(evs), machine=CPU)
    big, tiny = a.region("big"), a.region("tiny")
    assert big.total_us > tiny.total_us
    assert [r.path for r in a.regions] == ["tiny", "big"]
    assert tiny.hotness > big.hotness
    assert big.evidence["roofline_bound_us"] == pytest.approx(3.0 + 38_400.0)


@pytest.mark.parametrize("events, expected", [
    (_tiny_chain("r", 0), "launch_overhead"),
    ([region("r", 0, 60_000)] + op_chain(["aten::add"] * 3, 10, 19_000, 5, bytes=384e6, flops=32e6),
     "memory_bandwidth"),
    ([region("r", 0, 40_000)] + op_chain(["aten::mm"] * 2, 10, 19_000, 5, flops=2 * 1024 ** 3, bytes=12.6e6),
     "compute"),
    ([region("r", 0, 40_000)] + op_chain(["aten::mm"] * 2, 10, 19_000, 5), "compute"),       # by name
    ([region("r", 0, 10_000), op("aten::add", 10, 50)], "host_bound"),
    # tiny ops stretched by a loaded machine (20 µs each) stay overhead: their work is 64 bytes
    ([region("r", 0, 10_000)] + op_chain(["aten::add"] * 400, 10, 20.0, 4.0, bytes=64, flops=16), "launch_overhead"),
])
def test_cpu_bottleneck_classes(events, expected):
    r = analyze(build_trace(events), machine=CPU).region("r")
    assert r.bottleneck == expected
    assert 0.0 < r.confidence <= 1.0
    assert r.evidence["explained_us"][expected] == max(r.evidence["explained_us"].values())


def test_memory_vs_compute_evidence_uses_ridge_point():
    evs = [region("r", 0, 40_000)] + op_chain(["aten::mm"] * 2, 10, 19_000, 5, flops=2 * 1024 ** 3, bytes=12.6e6)
    ev = analyze(build_trace(evs), machine=CPU).region("r").evidence
    assert ev["ridge"] == pytest.approx(10.0)
    assert ev["intensity"] == pytest.approx(2 * 1024 ** 3 / 12.6e6)
    assert ev["achieved_flops_s"] == pytest.approx(2 * 2 * 1024 ** 3 / 38_000e-6)
    assert ev["frac_peak_flops"] == pytest.approx(ev["achieved_flops_s"] / 100e9)
    assert ev["op_count"] == 2 and ev["median_op_us"] == 19_000


def test_idle_needs_low_cpu_utilization():
    evs = [region("r", 0, 10_000), op("aten::add", 10, 50)]
    busy = analyze(build_trace(evs, counters=[{"name": "cpu_util", "ts": 0, "value": 100.0}]), machine=CPU)
    idle = analyze(build_trace(evs, counters=[{"name": "cpu_util", "ts": 0, "value": 2.0}]), machine=CPU)
    assert busy.region("r").bottleneck == "host_bound" and busy.region("r").evidence["cpu_util"] == 1.0
    assert idle.region("r").bottleneck == "idle" and idle.region("r").evidence["cpu_util"] == pytest.approx(0.02)
    assert idle.region("r").hotness < busy.region("r").hotness / 10   # waiting: nothing to recompile away
    # the CPU sampler's series as the reader names it: cores this process kept busy
    sampled = analyze(build_trace(evs, counters=[{"name": "cpu_util.process_cores", "ts": 0, "value": 0.05},
                                                 {"name": "cpu_util.total", "ts": 0, "value": 90.0}]), machine=CPU)
    assert sampled.region("r").bottleneck == "idle" and sampled.region("r").evidence["cpu_util"] == 0.05


def test_nested_ops_counted_once_with_childs_flops():
    # aten::linear (no flops) wraps aten::addmm (flops): one top-level op carrying the child's FLOPs.
    evs = [region("r", 0, 1000)]
    for k in range(3):
        evs += [op("aten::linear", 10 + 300 * k, 200), op("aten::addmm", 20 + 300 * k, 150, flops=1e6, bytes=1e5)]
    ev = analyze(build_trace(evs), machine=CPU).region("r").evidence
    assert ev["op_count"] == 3 and ev["flops"] == 3e6 and ev["bytes"] == 3e5


def test_top_level_detection_per_lane():
    lane = np.array([1, 1, 1, 2, 1])
    ts = np.array([0.0, 1.0, 10.0, 2.0, 10.0])
    dur = np.array([5.0, 2.0, 3.0, 1.0, 1.0])
    top, anc = top_level(lane, ts, dur)
    assert top.tolist() == [True, False, True, True, False]
    assert anc.tolist() == [0, 0, 2, 3, 2]


def test_gpu_short_kernels_with_launch_gaps_are_launch_overhead():
    evs = [region("decode", 0, 2000)]
    for k in range(200):
        t = 5 + k * 9.0
        evs.append({"kind": "runtime", "name": "cudaLaunchKernel", "ts": t, "dur": 4.0, "region": "decode"})
        evs.append(kernel("void elementwise_kernel<float>", t + 6, 2.5, region="decode"))
    r = analyze(build_trace(evs), machine=GPU).region("decode")
    assert r.evidence["device"] == "cuda" and r.evidence["kernel_count"] == 200
    assert r.bottleneck == "launch_overhead"


def test_gpu_busy_gemm_is_compute_and_idle_gpu_with_busy_cpu_is_host_bound():
    evs = [region("gemm", 0, 10_000)] + [kernel("ampere_sgemm_128x64_nn", 10 + 1000 * k, 990, region="gemm")
                                         for k in range(10)]
    evs += [region("pre", 20_000, 10_000), kernel("void copy_kernel", 20_010, 20, region="pre")]
    evs += op_chain(["aten::index_select", "aten::cat"] * 20, 20_050, 200, 40)
    a = analyze(build_trace(evs), machine=GPU)
    assert a.region("gemm").bottleneck == "compute"
    assert a.region("pre").bottleneck == "host_bound"
    assert "cuda" in a.machine


def test_a_filter_hides_rows_and_leaves_the_savings_of_the_rows_it_shows():
    """Regions of two threads running at once share the time they overlap (savings are counted
    once). Before, a --filter that hid one thread's regions gave the other the whole time: its
    saving tripled."""
    evs = []
    for tid, path in ((1, "A/iter"), (2, "B/iter")):
        evs += [region(path, 0, 3000, tid=tid)] + op_chain(["aten::add"] * 200, 10, 4.0, 10.0, tid=tid)
    every = analyze(build_trace(evs), machine=CPU)
    shown = analyze(build_trace(evs), machine=CPU, filter="^B")
    assert [r.path for r in shown.regions] == ["B/iter"]
    assert shown.regions[0].hotness == pytest.approx(every.region("B/iter").hotness)
    assert every.region("B/iter").evidence["wall_us"] < 0.6 * every.region("B/iter").self_us


def test_trace_without_regions_analyses_ops_outside_regions():
    evs = op_chain(["aten::add"] * 50, 0, 4.0, 1.0)
    a = analyze(build_trace(evs), machine=CPU)
    assert [r.path for r in a.regions] == [OUTSIDE]
    assert a.regions[0].evidence["op_count"] == 50
    quarter = analyze(build_trace(op_chain(["aten::add"] * 3, 0, 4.25, 1.0)), machine=CPU).regions[0]
    assert quarter.total_us == quarter.self_us == quarter.p50_us == 12.75     # was cut to 12.0


def test_filter_keeps_matching_paths():
    evs = _tiny_chain("enc/a", 0) + _tiny_chain("dec/b", 5000)
    a = analyze(build_trace(evs), machine=CPU, filter=r"^dec")
    assert [r.path for r in a.regions] == ["dec/b"]
    assert a.trace["filter"] == r"^dec"
    with pytest.raises(ConfigError, match="regular expression"):
        analyze(build_trace(evs), machine=CPU, filter="(")
    with pytest.raises(AnalysisError, match="no region path matches.*dec/b"):
        analyze(build_trace(evs), machine=CPU, filter="nothing")


def test_empty_trace_is_a_clear_error():
    with pytest.raises(AnalysisError, match="no regions, operators or kernels"):
        analyze(build_trace([{"kind": "other", "name": "x", "ts": 0, "dur": 1}]), machine=CPU)


def test_json_shape_and_round_trip():
    a = analyze(build_trace(_tiny_chain("r", 0) + [region("s", 5000, 100)]), machine=CPU)
    doc = a.to_json(include_timeline=True)
    assert set(doc) >= {"regions", "fusion_candidates", "compile", "machine", "trace", "timeline"}
    keys = {"path", "calls", "total_us", "self_us", "mean_us", "p50_us", "p95_us", "p99_us", "share", "hotness",
            "bottleneck", "confidence", "evidence"}
    assert all(keys <= set(r) for r in doc["regions"])
    assert all(r["bottleneck"] in BOTTLENECKS for r in doc["regions"])
    hot = [r["hotness"] for r in doc["regions"]]
    assert hot == sorted(hot, reverse=True)
    assert doc["machine"]["cpu"]["dispatch_overhead_s"] == 3e-6
    spans = doc["timeline"]["spans"]
    assert len({len(v) for v in spans.values()}) == 1 and len(spans["path"]) == 2
    back = Analysis.from_json(doc)
    assert back.regions[0].path == a.regions[0].path and back.timeline.spans == spans


def test_fallback_machine_is_reported(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path))
    a = analyze(build_trace(_tiny_chain("r", 0)))
    assert a.machine["cpu"]["source"] == "fallback"
    assert any("fallback" in w for w in a.trace["warnings"])


def test_timeline_counters_are_decimated(monkeypatch):
    from cuvil_pgc.analyze import timeline

    monkeypatch.setattr(timeline, "MAX_POINTS", 10)
    counters = [{"name": "cpu_util", "ts": float(t), "value": float(t % 2) * 100} for t in range(1000)]
    a = analyze(build_trace(_tiny_chain("r", 0), counters=counters), machine=CPU)
    series = a.timeline.counters["cpu_util"]
    assert len(series["ts_us"]) == 10 and all(abs(v - 50.0) < 1.0 for v in series["value"])


def test_compile_summary_is_included_when_available():
    summary = pytest.importorskip("cuvil_pgc.analyze.compile_summary")
    evs = _tiny_chain("r", 0) + [{"kind": "compile", "name": "dynamo", "ts": 5000, "dur": 300,
                                  "args": {"compile_id": "0/0", "phase": "dynamo"}}]
    trace = build_trace(evs)
    a = analyze(trace, machine=CPU)
    assert a.compile == summary.summarize_compile(trace) and a.compile
    assert a.timeline.compile_spans["graph"] == ["0/0"]


def test_public_analyze_is_callable_whatever_the_import_order():
    import subprocess
    import sys

    code = ("import cuvil_pgc.analyze.machine\n"          # package imported first: it shadows the function
            "from cuvil_pgc import analyze\n"
            "from tests._tracebuild import build_trace, op_chain\n"
            "print(analyze(build_trace(op_chain(['aten::add'] * 3, 0, 1, 1))).regions[0].path)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == OUTSIDE


def test_a_pass_run_alone_gets_what_it_requires_first():
    """HTA's rule: each analysis can run alone. attribute_bottlenecks needs the regions and their
    top ops from region_stats; asked for alone it still gives the full analysis' verdicts."""
    from cuvil_pgc.analyze.analyzer import PASSES
    from cuvil_pgc.analyze.bottleneck import attribute_bottlenecks
    from cuvil_pgc.analyze.fusion import mine_fusion
    from cuvil_pgc.analyze.hot_regions import region_stats
    from cuvil_pgc.analyze.hotness import score_hotness
    from cuvil_pgc.analyze.passes import with_prerequisites

    evs = [region("big", 0, 40_000), op("aten::add", 10, 39_900, bytes=384e6, flops=32e6)]
    evs += [region("step", 50_000, 6_000)] + op_chain(["aten::mm", "aten::add", "aten::relu"] * 60, 50_010, 20, 5)
    trace = build_trace(evs)
    full = analyze(trace, machine=CPU)
    assert full.fusion_candidates
    alone = analyze(trace, machine=CPU, passes=[attribute_bottlenecks])
    assert {r.path for r in alone.regions} == {r.path for r in full.regions}
    for r in alone.regions:
        whole = full.region(r.path)
        assert r.top_ops == whole.top_ops and r.top_ops
        assert (r.bottleneck, r.confidence) == (whole.bottleneck, whole.confidence)
    assert with_prerequisites([mine_fusion]) == [region_stats, attribute_bottlenecks, score_hotness, mine_fusion]
    assert analyze(trace, machine=CPU, passes=[mine_fusion]).fusion_candidates == full.fusion_candidates
    assert with_prerequisites(PASSES) == PASSES        # the default list runs each pass after what it needs
