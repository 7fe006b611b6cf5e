"""Bottleneck attribution validated on workloads whose truth is known.

CPU: real torch ops recorded by a real session (``profile(ops=True, gpu="off")``), analysed with a
fixed machine model, so the verdicts do not depend on how loaded the test machine is:
- thousands of tiny elementwise ops → launch_overhead
- elementwise add over 32M floats → memory_bandwidth
- 1024x1024 matmuls → compute
GPU: a Kineto-format trace shaped like a launch-bound decode step (short kernels separated by
launch gaps, ``ac2g`` flows linking launches to kernels) → launch_overhead.
"""

from __future__ import annotations

import json

import pytest

from cuvil_pgc.analyze import analyze
from cuvil_pgc.analyze.machine import MachineModel
from cuvil_pgc.trace.reader import load_trace

CPU = MachineModel(device="cpu", name="fixed test cpu", fingerprint="known", peak_flops={"fp32": 100e9},
                   mem_bw=10e9, dispatch_overhead_s=3e-6)
GPU = MachineModel(device="cuda:0", name="fixed test gpu", fingerprint="known-gpu", peak_flops={"fp32": 20e12},
                   mem_bw=1.5e12, dispatch_overhead_s=3e-6, launch_latency_s=5e-6)


#: long enough (~30 ms) that one preemption of the test process on a shared machine (a few ms,
#: counted as time between ops) cannot outweigh the ops' own fixed cost
TINY_OPS = 4000


@pytest.fixture(scope="module")
def cpu_workloads(tmp_path_factory):
    torch = pytest.importorskip("torch")
    import cuvil_pgc
    from cuvil_pgc import ProfileRegion

    path = tmp_path_factory.mktemp("known") / "known.trace.json"
    torch.manual_seed(0)
    small = torch.ones(16)
    big_a, big_b = torch.randn(32 * 1024 * 1024), torch.randn(32 * 1024 * 1024)
    out = torch.zeros_like(big_a)                       # touched: no first-touch page faults
    ma, mb = torch.randn(1024, 1024), torch.randn(1024, 1024)
    with torch.inference_mode(), cuvil_pgc.profile(str(path), ops=True, gpu="off", sample_hz=0):
        with ProfileRegion("tiny_chain"):
            y = small
            for _ in range(TINY_OPS):
                y = y + 1.0
        with ProfileRegion("big_elementwise"):
            for _ in range(3):
                torch.add(big_a, big_b, out=out)
        with ProfileRegion("matmul"):
            for _ in range(3):
                torch.mm(ma, mb)
    trace = load_trace(str(path))
    analysis = analyze(trace, machine=CPU)
    analysis.trace["_loaded"] = trace          # kept for the nesting check below (not serialised)
    return analysis


@pytest.mark.slow
@pytest.mark.parametrize("region, expected", [("tiny_chain", "launch_overhead"),
                                              ("big_elementwise", "memory_bandwidth"),
                                              ("matmul", "compute")])
def test_cpu_workloads_get_their_known_bottleneck(cpu_workloads, region, expected):
    r = cpu_workloads.region(region)
    assert r is not None, [x.path for x in cpu_workloads.regions]
    assert r.bottleneck == expected, (r.bottleneck, r.evidence["explained_us"])
    assert r.confidence >= 0.4         # the winning share of the region's time, on a shared machine


@pytest.mark.slow
def test_cpu_workload_evidence(cpu_workloads):
    tiny, mem, mm = (cpu_workloads.region(p) for p in ("tiny_chain", "big_elementwise", "matmul"))
    assert tiny.evidence["op_count"] == TINY_OPS
    assert mem.evidence["op_count"] == 3 and mm.evidence["op_count"] == 3
    assert mem.evidence["intensity"] < mem.evidence["ridge"] < mm.evidence["intensity"]
    assert mm.evidence["flops"] == pytest.approx(3 * 2 * 1024 ** 3)
    assert tiny.hotness > 0
    # the tiny chain is the fusion candidate: a run of adds
    assert any(c.region == "tiny_chain" and set(c.ops) == {"aten::add"} for c in cpu_workloads.fusion_candidates)


def _launch_bound_kineto(n: int = 120) -> dict:
    """A decode step: n launches of 2 µs kernels, each launch ~7 µs apart (GPU idles between them)."""
    base = 1_700_000_000_000_000.0
    pid, tid, dev, stream = 100, 100, 0, 7
    evs: list[dict] = [{"ph": "X", "cat": "user_annotation", "name": "decode", "pid": pid, "tid": tid,
                        "ts": base, "dur": 10 + n * 7.0, "args": {"External id": 1}}]
    for k in range(n):
        t = base + 5 + k * 7.0
        corr = 1000 + k
        evs.append({"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": pid, "tid": tid, "ts": t, "dur": 6.0,
                    "args": {"External id": 10 + k}})
        evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid, "tid": tid,
                    "ts": t + 1, "dur": 4.0, "args": {"External id": 10 + k, "correlation": corr}})
        evs.append({"ph": "s", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": pid, "tid": tid, "ts": t + 1})
        evs.append({"ph": "X", "cat": "kernel", "name": "void at::native::vectorized_elementwise_kernel<4>",
                    "pid": dev, "tid": stream, "ts": t + 5, "dur": 2.0,
                    "args": {"correlation": corr, "stream": stream, "device": dev, "grid": [1, 1, 1],
                             "block": [128, 1, 1]}})
        evs.append({"ph": "f", "cat": "ac2g", "name": "ac2g", "id": corr, "pid": dev, "tid": stream, "ts": t + 5,
                    "bp": "e"})
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "NVIDIA H100"}],
            "traceEvents": evs, "displayTimeUnit": "ms"}


def test_gpu_launch_gaps_are_launch_overhead(tmp_path):
    path = tmp_path / "decode_kineto.json"
    path.write_text(json.dumps(_launch_bound_kineto()))
    a = analyze(load_trace(str(path)), machine=GPU)
    r = a.region("decode")
    assert r.evidence["device"] == "cuda" and r.evidence["kernel_count"] == 120
    assert r.bottleneck == "launch_overhead"
    assert r.evidence["median_kernel_us"] == pytest.approx(2.0)
    assert any(set(c.ops) == {"void at::native::vectorized_elementwise_kernel<4>"} for c in a.fusion_candidates)


def test_gpu_fixture_from_the_reader(tmp_path):
    a = analyze(load_trace("tests/data/kineto_gpu/gpu_two_regions.json"), machine=GPU)
    assert {"decode", "decode/attention", "preprocess"} <= {r.path for r in a.regions}
    assert all(r.bottleneck in ("launch_overhead", "memory_bandwidth", "compute", "host_bound", "idle")
               for r in a.regions)


@pytest.mark.slow
def test_derived_nesting_matches_the_samplers_depth(cpu_workloads):
    import numpy as np

    from cuvil_pgc.analyze._prepare import lane_keys, top_level
    from cuvil_pgc.trace.schema import Kind

    trace = cpu_workloads.trace["_loaded"]
    ops = trace.of_kind(Kind.CPU_OP)
    depth = np.array([trace.args[int(r)]["depth"] for r in ops])
    top, _ = top_level(lane_keys(trace)[ops], trace.events["ts"][ops], trace.events["dur"][ops])
    assert len(ops) > 400 and np.array_equal(top, depth == 0)


@pytest.mark.slow
def test_sleeping_is_idle_and_python_spinning_is_host_bound(tmp_path):
    """A real session with the CPU utilization sampler: a region that sleeps vs one that runs Python."""
    import time

    import cuvil_pgc
    from cuvil_pgc import ProfileRegion

    path = tmp_path / "idle.trace.json"
    with cuvil_pgc.profile(str(path), ops=False, gpu="off", sample_hz=100):
        with ProfileRegion("sleep"):
            time.sleep(0.3)
        with ProfileRegion("python"):
            t0, x = time.perf_counter(), 0
            while time.perf_counter() - t0 < 0.3:
                x += 1
    a = analyze(load_trace(str(path)), machine=CPU)
    assert a.region("sleep").bottleneck == "idle", a.region("sleep").evidence
    assert a.region("python").bottleneck == "host_bound", a.region("python").evidence
    assert a.regions[0].path == "python"          # idle time is no saving


def test_a_region_opened_inside_an_op_owns_the_ops_in_it(tmp_path):
    """torch.compile's ``Torch-Compiled Region`` op holds its ``## Call CompiledFxGraph ##`` range,
    and the graph's ops run inside that range (so does a custom op that opens a record_function).
    Before: the region had no ops (they were the enclosing op's) and was called host-bound, while
    the op outside it counted the region's time a second time in ``(outside regions)``."""
    pid = tid = 1
    evs = []
    for k in range(3):
        t = 1000.0 * k
        evs += [{"ph": "X", "cat": "cpu_op", "name": "Torch-Compiled Region: 0/0", "pid": pid, "tid": tid,
                 "ts": t, "dur": 300.0},
                {"ph": "X", "cat": "user_annotation", "name": "## Call CompiledFxGraph abc ##", "pid": pid,
                 "tid": tid, "ts": t + 5, "dur": 290.0},
                {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": pid, "tid": tid, "ts": t + 10, "dur": 150.0},
                {"ph": "X", "cat": "cpu_op", "name": "aten::tanh", "pid": pid, "tid": tid, "ts": t + 170,
                 "dur": 120.0}]
    path = tmp_path / "compiled.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": evs}))
    a = analyze(load_trace(str(path)), machine=CPU)
    region = a.region("## Call CompiledFxGraph abc ##")
    assert region.evidence["op_count"] == 6 and region.bottleneck != "host_bound", region.evidence
    assert [r.path for r in a.regions] == ["## Call CompiledFxGraph abc ##"]     # nothing left outside


def test_ranges_that_overlap_without_nesting_are_named_and_cut_at_the_outer_end(tmp_path):
    """record_function ranges exited out of order (A starts, B starts, A ends, B ends) are read as
    B inside A; A's self time loses only the part of B inside it, and the reader says so."""
    evs = [{"ph": "X", "cat": "user_annotation", "name": "A_load", "pid": 1, "tid": 1, "ts": 0.0, "dur": 100.0},
           {"ph": "X", "cat": "user_annotation", "name": "B_compute", "pid": 1, "tid": 1, "ts": 60.0, "dur": 90.0},
           {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10.0, "dur": 30.0}]
    path = tmp_path / "overlap.json"
    path.write_text(json.dumps({"schemaVersion": 1, "traceEvents": evs}))
    trace = load_trace(str(path))
    assert any("1 region range(s) end after the range they start in" in w and "'B_compute' in 'A_load'" in w
               for s in trace.sources for w in s.warnings)
    a = analyze(trace, machine=CPU)
    assert a.region("A_load").self_us == 60.0          # 100 minus the 40 of B inside it, not minus 90
