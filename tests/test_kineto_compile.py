"""A real torch.profiler trace of a model compiled inside the profiling window.

``tests/data/kineto_cpu/torch_compile_mlp.json.gz``: torch 2.13 on a CPU, ``torch.compile`` of a
3-layer MLP called 4 times under ``profile(activities=[CPU], record_shapes=True)``, so the first
call compiles (8.4 s) in the trace. torch.compile leaves its compiler's work there as ``cpu_op``
ranges (``"<block> (dynamo_timed)"``, phase ranges with ``"<phase>_data: compile_id=0/0"``
annotations) and the ATen ops it runs on fake tensors. Before, these were read as the trace's
operators and as 56 regions ranked as host-bound recompile targets, and the compile summary said
nothing was compiled.
"""

from __future__ import annotations

from pathlib import Path

from cuvil_pgc.analyze import analyze
from cuvil_pgc.analyze.compile_summary import summarize_compile
from cuvil_pgc.analyze.machine import MachineModel
from cuvil_pgc.analyze.operators import operator_stats
from cuvil_pgc.trace.reader import load_trace

TRACE = Path(__file__).parent / "data" / "kineto_cpu" / "torch_compile_mlp.json.gz"
CPU = MachineModel(device="cpu", name="fixed test cpu", fingerprint="known", peak_flops={"fp32": 100e9},
                   mem_bw=10e9, dispatch_overhead_s=3e-6)


def test_the_compilers_ranges_are_one_compile_with_its_phases():
    summary = summarize_compile(load_trace(str(TRACE)))
    assert summary["totals"]["compiles"] == 1 and summary["totals"]["unattributed_ms"] == 0.0
    graph, = summary["graphs"]
    assert graph["compile_id"] == "0/0" and 8000 < graph["total_ms"] < 9000
    assert {"dynamo", "aot_autograd", "inductor_passes", "inductor_codegen", "kernel_compile"} <= graph["phases"].keys()
    assert abs(sum(graph["phases"].values()) - graph["total_ms"]) < 1.0      # exclusive times add up
    assert graph["run_calls"] == 4


def test_the_compilers_ranges_are_neither_operators_nor_regions():
    trace = load_trace(str(TRACE))
    ops = {r.name: r for r in operator_stats(trace)}
    assert not [n for n in ops if n.endswith("(dynamo_timed)") or n in ("dynamo", "entire_frame_compile")]
    assert ops["aten::addmm"].calls < 20           # not the 36 with the fake-tensor ones
    a = analyze(trace, machine=CPU)
    paths = [r.path for r in a.regions]
    assert not [p for p in paths if "_data: " in p]
    graph = next(r for r in a.regions if r.path.startswith("## Call CompiledFxGraph"))
    assert graph.evidence["op_count"] > 0 and graph.bottleneck != "host_bound"
