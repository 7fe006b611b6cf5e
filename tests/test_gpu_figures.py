"""Per-device GPU figures (trace.gpu, HTA parity) on traces of known truth, and the interval helpers."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil_pgc.analyze import intervals
from cuvil_pgc.analyze.analyzer import analyze
from cuvil_pgc.analyze.gpu_figures import kernel_kind, work_label
from cuvil_pgc.viewer.console import key_evidence
from tests.test_kineto_generations import GEN, RESNET_FILES, needs_resnet

spans = st.lists(st.tuples(st.integers(0, 60), st.integers(0, 15)), max_size=30)


def covered(pairs: list[tuple[int, int]]) -> set[int]:
    return {t for s, d in pairs for t in range(s, s + d)}


@settings(max_examples=200, deadline=None)
@given(spans, spans)
def test_union_and_intersection_match_brute_force(a, b) -> None:
    def arr(pairs):
        return np.array([s for s, _ in pairs], float), np.array([s + d for s, d in pairs], float)

    assert intervals.union_length(*arr(a)) == len(covered(a))
    got = intervals.intersection_length(intervals.merge(*arr(a)), intervals.merge(*arr(b)))
    assert got == pytest.approx(len(covered(a) & covered(b)))
    s, e, opener = intervals.merge_with_openers(*arr(a))
    assert (s[1:] > e[:-1]).all()
    if len(opener):
        assert (arr(a)[0][opener] == s).all()


def test_kernel_kinds_follow_hta() -> None:
    assert kernel_kind("ncclDevKernel_AllReduce_Sum_f32_RING_LL") == "communication"
    assert kernel_kind("ncclKernel_AllGather_RING_LL_Sum_int8_t") == "communication"
    assert kernel_kind("Memcpy DtoH (Device -> Pinned)") == "memory"
    assert kernel_kind("volta_sgemm_128x64_nn") == "compute"
    assert kernel_kind("ncclDevComm_init") == "compute"          # not a collective kernel (issue 25 item 4)


def test_known_figures_of_a_two_stream_trace() -> None:
    result = analyze(GEN / "gpu_figures.json")
    (dev,) = result.trace["gpu"].values()
    assert dev["device"] == "cuda:0" and dev["name"] == "NVIDIA A100-SXM4-80GB"
    assert (dev["kernel_count"], dev["kernel_us"], dev["memcpy_count"], dev["memcpy_us"],
            dev["memset_count"], dev["memset_us"]) == (4, 73.0, 1, 5.0, 1, 2.0)
    assert (dev["busy_us"], dev["span_us"], dev["idle_us"]) == (70.0, 202.0, 132.0)   # nccl ∥ elementwise
    assert dev["idle_causes_us"] == {"host_wait": 75.0, "kernel_wait": 7.0, "other": 50.0}
    s7, s8 = dev["streams"]["7"], dev["streams"]["8"]
    assert s7["idle_causes_us"] == {"host_wait": 85.0, "kernel_wait": 2.0, "other": 70.0}
    assert s8["idle_causes_us"] == {"host_wait": 0.0, "kernel_wait": 0.0, "other": 60.0}
    assert s7["queue_length"] == {"mean": 1.0, "max": 2.0, "time_mean": pytest.approx(151 / 200)}
    assert s8["queue_length"]["max"] == 1.0
    delay = dev["launch_delay_us"]          # 5, 22, 5, 16, 94 (the memset's launch is not in the trace)
    assert (delay["count"], delay["p50"], delay["longer_than_kernel"]) == (5, 16.0, 1)
    assert delay["p95"] == pytest.approx(22 + 0.8 * 72)
    kinds = dev["kinds"]
    assert kinds["compute"] == {"count": 3, "sum_us": 33.0, "union_us": 33.0}
    assert kinds["communication"]["union_us"] == 40.0 and kinds["memory"]["sum_us"] == 7.0
    assert dev["comm_compute_overlap"] == {"comm_us": 40.0, "overlap_us": 10.0, "ratio": 0.25}
    top = result.trace["gpu_top_kernels"]
    assert [k["name"] for k in top] == ["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "gemm_a", "elementwise", "gemm_b"]
    assert top[0]["share"] == pytest.approx(40 / 73) and top[0]["kind"] == "communication"


def test_every_rank_gets_its_own_device_keys(tmp_path: Path) -> None:
    doc = json.loads((GEN / "gpu_figures.json").read_text())
    paths = []
    for rank in (0, 1):
        doc["distributedInfo"] = {"rank": rank, "world_size": 2}
        paths.append(tmp_path / f"rank{rank}.json")
        paths[-1].write_text(json.dumps(doc))
    gpu = analyze([str(p) for p in paths]).trace["gpu"]
    assert sorted(gpu) == ["rank0/cuda:0", "rank1/cuda:0"]
    assert gpu["rank1/cuda:0"]["busy_us"] == 70.0


def test_profiler_range_kernels_are_counted_per_device() -> None:
    gpu = analyze(GEN / "profiler_range.json").trace["gpu"]
    assert gpu["cuda:0"]["profiler_ranges"] == {"count": 2, "flops": 8192.0 + 1024.0}


def test_labels_say_what_the_gpu_work_is() -> None:
    result = analyze(GEN / "one_kernel_16_memcpys.json")
    step = result.region("step")
    assert step.evidence["gpu_work"] == {"kernels": 1.0, "memcpys": 16.0, "memsets": 0.0}
    assert work_label(step.evidence) == "1 kernel, 16 memcpys"
    assert "1 kernel, 16 memcpys" in key_evidence(step) and "17 kernels" not in key_evidence(step)


def _independent(path: Path) -> dict[str, float]:
    """Figures straight from the JSON, with plain Python (no cuvil code)."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat", "").lower() in ("kernel", "memcpy", "memset")]
    kernels = [e for e in gpu if e["cat"].lower() == "kernel"]
    busy, reach = 0.0, -1.0
    for s, e in sorted((e["ts"], e["ts"] + e["dur"]) for e in gpu):
        if s > reach:
            busy += e - s
            reach = e
        elif e > reach:
            busy += e - reach
            reach = e
    span = max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)
    return {"kernel_count": len(kernels), "kernel_us": float(sum(e["dur"] for e in kernels)),
            "busy_us": busy, "idle_us": span - busy}


@needs_resnet
@pytest.mark.parametrize("path", RESNET_FILES, ids=lambda p: p.name.split(".")[0])
def test_real_resnet50_figures_match_the_json(path: Path, tmp_path: Path) -> None:
    local = tmp_path / path.name
    shutil.copy(path, local)
    (dev,) = analyze(str(local)).trace["gpu"].values()
    for key, want in _independent(path).items():
        assert dev[key] == pytest.approx(want, rel=1e-9), key
    assert dev["name"] == "Tesla V100-DGXS-32GB"
    assert sum(dev["idle_causes_us"].values()) == pytest.approx(dev["idle_us"])


GPU_ROW = ("cuda:0 (NVIDIA A100-SXM4-80GB)", "4 kernels; 1 memcpy; 1 memset", "70 µs (35% of 202 µs)",
           "132 µs: host wait 75 µs, kernel wait 7 µs, other 50 µs",
           "p50 16 µs, p95 79.6 µs; 1 of 5 launches outlast their kernel", "mean 1.0, max 2", "25% of 40 µs")


def test_terminal_gpu_tables_show_the_figures() -> None:
    """``cuvil-pgc analyze`` prints the device's kernel count, busy time and idle causes, and the
    top kernels, as trace.gpu has them (test_known_figures_of_a_two_stream_trace)."""
    import io

    from rich.console import Console

    from cuvil_pgc.viewer.console import render_analysis

    console = Console(record=True, width=300, file=io.StringIO())
    render_analysis(analyze(GEN / "gpu_figures.json"), console)
    out = console.export_text()
    section = out[out.index("GPU devices"):]
    for cell in GPU_ROW:
        assert cell in section, cell
    kernels = section[section.index("Top GPU kernels"):]
    nccl = next(line for line in kernels.splitlines() if "ncclDevKernel_AllReduce" in line)
    assert "communication" in nccl and "40 µs" in nccl and "55%" in nccl


def test_report_gpu_section_shows_the_figures() -> None:
    from cuvil_pgc.viewer.html import render_html

    html = render_html(analyze(GEN / "gpu_figures.json"))
    table = html[html.index('id="gpu-table"'):]
    table = table[:table.index("</table>")]
    for cell in (*GPU_ROW, "compute 33 µs, communication 40 µs, memory 7 µs"):
        assert f"<td>{cell}</td>" in table, cell
    kernels = html[html.index('id="gpu-kernels-table"'):]
    assert '<td data-v="ncclDevKernel_AllReduce_Sum_f32_RING_LL">' in kernels and "54.8%" in kernels
