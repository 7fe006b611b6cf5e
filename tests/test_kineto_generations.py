"""Every Kineto generation the reader meets in the wild (issue 25, item 1), on small synthetic traces
(tests/data/kineto_generations, see make.py there) and on the two real ResNet-50 traces in shared/."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cuvil_pgc.analyze.analyzer import analyze
from cuvil_pgc.trace import load_trace
from cuvil_pgc.trace.schema import Kind
from tests.test_reader_invariants import DATA, assert_valid_trace

GEN = DATA / "kineto_generations"
RESNET = Path(__file__).resolve().parent / "data" / "kineto_resnet50"
RESNET_FILES = sorted(RESNET.glob("*.json.gz")) if RESNET.is_dir() else []
needs_resnet = pytest.mark.skipif(not RESNET_FILES, reason=f"the real ResNet-50 traces are not at {RESNET}")


def named(trace, kind: Kind, name: str | None = None) -> list[int]:
    return [r for r in trace.of_kind(kind).tolist() if name is None or trace.strings[trace.name[r]] == name]


def test_torch18_capitalised_categories_are_read() -> None:
    trace = load_trace(GEN / "torch18_capitalised.json")
    assert_valid_trace(trace)
    counts = np.bincount(trace.kind, minlength=len(Kind))
    assert (counts[Kind.CPU_OP], counts[Kind.RUNTIME], counts[Kind.KERNEL], counts[Kind.MEMCPY],
            counts[Kind.MEMSET]) == (1, 4, 2, 1, 1)
    gpu = np.isin(trace.kind, (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET))
    assert (trace.events["external_id"][gpu] == 1).all()        # lower-case "external id"
    (flowed,) = named(trace, Kind.KERNEL, "vectorized_elementwise_kernel")
    assert trace.correlation[flowed] == 14                      # from the async/launch flow
    assert trace.ts[named(trace, Kind.KERNEL, "volta_sgemm_128x64_nn")[0]] == 130.0
    notes = trace.sources[0].warnings
    assert "ignored events of phase 'i' x2" in notes
    assert any("'Trace' x1" in n for n in notes)


def test_torch17_exports_without_categories_are_operators(tmp_path: Path) -> None:
    """torch <= 1.7's ``export_chrome_trace``: a JSON list of operators with no ``cat`` and the pid
    "CPU functions". Before, every event was kept as "other" and the trace had no operators."""
    import json

    events = []
    for k in range(3):
        t = 120.0 * k
        events += [{"name": "aten::addmm", "ph": "X", "ts": t, "dur": 60.0, "tid": 1, "pid": "CPU functions",
                    "args": {}},
                   {"name": "aten::relu", "ph": "X", "ts": t + 70, "dur": 20.0, "tid": 1, "pid": "CPU functions",
                    "args": {}},
                   {"name": "mystery", "ph": "X", "ts": t + 95, "dur": 1.0, "tid": 1, "pid": 7}]
    path = tmp_path / "torch17.json"
    path.write_text(json.dumps(events))
    trace = load_trace(str(path))
    kinds = trace.events["kind"]
    assert int(np.count_nonzero(kinds == Kind.CPU_OP)) == 6 and int(np.count_nonzero(kinds == Kind.OTHER)) == 3
    assert any("(no cat)' x3" in w for w in trace.sources[0].warnings)     # only the others are named
    assert analyze(trace).regions[0].evidence["op_count"] == 6


def test_torch18_trace_analyses_and_warns_what_it_skipped() -> None:
    result = analyze(GEN / "torch18_capitalised.json")
    assert result.trace["counts"]["kernel"] == 2
    assert any("torch18_capitalised.json: ignored events of phase 'i' x2" == w for w in result.trace["warnings"])


def test_unix_ns_timestamps_convert_exactly_and_flows_link() -> None:
    trace = load_trace(GEN / "ns_flows.json")
    assert_valid_trace(trace)
    src = trace.sources[0]
    assert src.metadata["start_unix_ns"] == 1_700_000_000_000_000_000
    assert any("nanoseconds" in n for n in src.notes)
    (linear,) = named(trace, Kind.CPU_OP, "aten::linear")
    (gemm,) = named(trace, Kind.KERNEL, "sm90_xmma_gemm")
    (launch,) = [r for r in named(trace, Kind.RUNTIME) if trace.correlation[r] == 21]
    assert trace.ts[linear] == pytest.approx(10.001, abs=1e-9) and trace.dur[linear] == 30.0
    assert trace.ts[launch] == pytest.approx(12.345, abs=1e-9) and trace.dur[launch] == pytest.approx(4.321)
    assert trace.ts[gemm] - trace.ts[launch] == pytest.approx(7.658, abs=1e-9)    # not rounded to the µs
    assert trace.correlation[gemm] == 21                                          # from the ac2g flow
    (addmm,) = named(trace, Kind.CPU_OP, "aten::addmm")
    (backward,) = named(trace, Kind.CPU_OP, "LinearBackward0")
    fwdbwd = trace.events["fwdbwd"]
    assert fwdbwd[linear] == fwdbwd[backward] == 5 and fwdbwd[addmm] == -1        # the outermost op gets it
    assert any("'cuda_sync' x1" in w and "'gpu_user_annotation' x1" in w for w in src.warnings)


def test_profiler_range_kernels_are_counted_not_dropped() -> None:
    trace = load_trace(GEN / "profiler_range.json")
    rng = [r for r in named(trace, Kind.OTHER) if trace.args[r].get("cat") == "cuda_profiler_range"]
    assert len(rng) == 2
    assert any("2 cuda_profiler_range events" in w for w in trace.sources[0].warnings)
    by_name = {trace.strings[trace.name[r]]: r for r in rng}
    assert trace.flops[by_name["ampere_sgemm_32x32_sliced1x4_nn"]] == 8192.0      # FMA = 2 FLOPs
    assert trace.flops[by_name["vectorized_elementwise_kernel"]] == 1024.0
    assert trace.args[by_name["vectorized_elementwise_kernel"]]["counters"][
        "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"] == 1024


@needs_resnet
@pytest.mark.parametrize("path", RESNET_FILES, ids=lambda p: p.name.split(".")[0])
def test_real_resnet50_torch18_traces_load_and_analyse(path: Path) -> None:
    trace = load_trace(path)
    assert_valid_trace(trace)
    counts = np.bincount(trace.kind, minlength=len(Kind))
    assert counts[Kind.KERNEL] > 8000 and counts[Kind.CPU_OP] > 20000 and counts[Kind.RUNTIME] > 11000
    assert counts[Kind.MEMCPY] == 12 and counts[Kind.MEMSET] > 300
    gpu = np.isin(trace.kind, (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET))
    assert (trace.correlation[gpu] >= 0).all() and (trace.events["external_id"][gpu] >= 0).mean() > 0.99
    result = analyze(trace)
    assert result.regions and result.trace["counts"]["kernel"] == counts[Kind.KERNEL]
