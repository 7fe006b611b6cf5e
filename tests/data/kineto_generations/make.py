"""Writes the small synthetic traces of this folder, one per Kineto generation or feature the reader
must handle (issue 25, item 1). Their shapes follow real files: the torch 1.8-1.10 layout of the
ResNet-50 samples of the Kineto repository, torch 2.x's ``ac2g`` / ``fwdbwd`` flows, and the
CUPTI range profiler's ``cuda_profiler_range`` events. Rerun after changing it:
``python tests/data/kineto_generations/make.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
T0_US = 1623142623460000            # torch 1.8: absolute Unix µs, integers
T0_NS = 1700000000000000000         # Unix ns, integers


def x(cat, name, ts, dur, pid, tid, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def torch18() -> dict:
    """Capitalised categories, lower-case ``external id``, string tids, ``async``/``launch`` flows."""
    t, cpu, gpu = T0_US, 25738, 0
    ev = [
        {"name": "process_name", "ph": "M", "ts": t, "pid": cpu, "tid": 0, "args": {"name": "python"}},
        x("Operator", "aten::conv2d", t + 100, 50, cpu, str(cpu), **{"External id": 1, "Trace name": "PyTorch Profiler"}),
        x("Runtime", "cudaLaunchKernel", t + 110, 5, cpu, str(cpu), cbid=211, correlation=11, **{"external id": 1}),
        x("Kernel", "volta_sgemm_128x64_nn", t + 130, 20, gpu, "stream 7", queued=0, device=0, stream=7,
          correlation=11, grid=[4, 1, 1], block=[256, 1, 1], **{"external id": 1, "registers per thread": 128}),
        x("Runtime", "cudaMemcpyAsync", t + 120, 40, cpu, str(cpu), cbid=41, correlation=12, **{"external id": 1}),
        x("Memcpy", "Memcpy HtoD (Pageable -> Device)", t + 155, 2, gpu, "stream 7", device=0, stream=7,
          correlation=12, bytes=1024, **{"external id": 1}),
        x("Runtime", "cudaMemsetAsync", t + 162, 3, cpu, str(cpu), cbid=51, correlation=13, **{"external id": 1}),
        x("Memset", "Memset (Device)", t + 170, 1, gpu, "stream 7", device=0, stream=7, correlation=13,
          bytes=512, **{"external id": 1}),
        x("Runtime", "cudaLaunchKernel", t + 166, 4, cpu, str(cpu), cbid=211, correlation=14, **{"external id": 1}),
        x("Kernel", "vectorized_elementwise_kernel", t + 180, 10, gpu, "stream 7", device=0, stream=7,
          **{"external id": 1}),               # no correlation in args: the flow gives it
        {"ph": "s", "id": 14, "pid": cpu, "tid": cpu, "ts": t + 166, "cat": "async", "name": "launch"},
        {"ph": "f", "id": 14, "pid": gpu, "tid": "stream 7", "ts": t + 180, "cat": "async", "name": "launch", "bp": "e"},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": cpu, "tid": cpu, "ts": t + 101, "args": {"Bytes": 4}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": cpu, "tid": cpu, "ts": t + 102, "args": {"Bytes": -4}},
        x("Trace", "PyTorch Profiler (0)", t, 200, "Traces", "PyTorch Profiler", **{"Op count": 0}),
    ]
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "Tesla V100-DGXS-32GB", "numSms": 80}],
            "traceEvents": ev}


def ns_flows() -> dict:
    """Unix-ns integer timestamps, ``ac2g`` flows, ``fwdbwd`` flows to an autograd thread,
    ``gpu_user_annotation`` and ``cuda_sync`` rows."""
    t, cpu, gpu = T0_NS, 4242, 0
    ev = [
        x("user_annotation", "forward", t + 0, 100_000, cpu, 1),
        x("cpu_op", "aten::linear", t + 10_001, 30_000, cpu, 1, **{"External id": 7}),
        x("cpu_op", "aten::addmm", t + 10_001, 29_000, cpu, 1, **{"External id": 8}),   # starts with linear
        x("cuda_runtime", "cudaLaunchKernel", t + 12_345, 4_321, cpu, 1, correlation=21, **{"External id": 8}),
        x("kernel", "sm90_xmma_gemm", t + 20_003, 9_997, gpu, 7, device=0, stream=7, **{"External id": 8}),
        x("cuda_runtime", "cudaLaunchKernel", t + 41_000, 3_000, cpu, 1, correlation=22, **{"External id": 9}),
        x("kernel", "triton_poi_fused_relu_0", t + 45_000, 1_500, gpu, 7, device=0, stream=7, correlation=22),
        x("gpu_user_annotation", "forward", t + 20_003, 26_497, gpu, 7),
        x("cuda_sync", "Stream Sync", t + 46_500, 500, gpu, 7, stream=7),
        x("cpu_op", "LinearBackward0", t + 200_000, 40_000, cpu, 2, **{"External id": 30}),
        {"ph": "s", "id": 21, "pid": cpu, "tid": 1, "ts": t + 12_345, "cat": "ac2g", "name": "ac2g"},
        {"ph": "f", "id": 21, "pid": gpu, "tid": 7, "ts": t + 20_003, "cat": "ac2g", "name": "ac2g", "bp": "e"},
        {"ph": "s", "id": 5, "pid": cpu, "tid": 1, "ts": t + 10_001, "cat": "fwdbwd", "name": "fwdbwd"},
        {"ph": "f", "id": 5, "pid": cpu, "tid": 2, "ts": t + 200_000, "cat": "fwdbwd", "name": "fwdbwd", "bp": "e"},
    ]
    return {"schemaVersion": 1, "displayTimeUnit": "ns", "traceEvents": ev}


def profiler_range() -> dict:
    """CUPTI range profiling (kernel replay): kernels as ``cuda_profiler_range`` events with counters."""
    t, cpu = 1000.0, 4242
    ffma, fadd = "smsp__sass_thread_inst_executed_op_ffma_pred_on.sum", "smsp__sass_thread_inst_executed_op_fadd_pred_on.sum"
    ev = [x("cpu_op", "aten::mm", t, 50.0, cpu, 1, **{"External id": 1}),
          x("cuda_runtime", "cudaLaunchKernel", t + 5, 5.0, cpu, 1, correlation=3, **{"External id": 1}),
          x("cpu_op", "aten::add", t + 60, 20.0, cpu, 1, **{"External id": 2}),
          x("cuda_runtime", "cudaLaunchKernel", t + 62, 5.0, cpu, 1, correlation=4, **{"External id": 2})]
    ev += [x("cuda_profiler_range", name, t + 100 * k, 100.0, 0, 0, **{ffma: f, fadd: a})
           for k, (name, f, a) in enumerate((("ampere_sgemm_32x32_sliced1x4_nn", 4096, 0),
                                            ("vectorized_elementwise_kernel", 0, 1024)))]
    return {"schemaVersion": 1, "baseTimeNanoseconds": 1700000000000000000, "traceEvents": ev}


def gpu_figures() -> dict:
    """Known GPU figures (worked out in tests/test_gpu_figures.py): two streams, a host-wait gap, a
    kernel-wait gap, an other gap, an NCCL kernel overlapping a compute kernel, a memset whose
    launch is outside the trace."""
    cpu, gpu = 100, 0

    def launch(name, ts, dur, corr):
        return x("cuda_runtime", name, ts, dur, cpu, 1, correlation=corr)

    def work(cat, name, ts, dur, stream, corr):
        return x(cat, name, ts, dur, gpu, stream, device=0, stream=stream, correlation=corr)

    ev = [launch("cudaLaunchKernel", 0, 5, 1), work("kernel", "gemm_a", 10, 20, 7, 1),
          launch("cudaLaunchKernel", 6, 4, 2), work("kernel", "gemm_b", 32, 3, 7, 2),
          launch("cudaLaunchKernel", 100, 5, 3), work("kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL", 110, 40, 8, 3),
          launch("cudaLaunchKernel", 101, 3, 4), work("kernel", "elementwise", 120, 10, 7, 4),
          launch("cudaMemcpyAsync", 104, 2, 5), work("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 200, 5, 7, 5),
          work("gpu_memset", "Memset (Device)", 210, 2, 8, 99)]
    return {"schemaVersion": 1, "baseTimeNanoseconds": T0_NS,
            "deviceProperties": [{"id": 0, "name": "NVIDIA A100-SXM4-80GB", "numSms": 108}], "traceEvents": ev}


def one_kernel_16_memcpys() -> dict:
    """A region whose GPU work is 1 kernel and 16 memcpys (issue 25 item 9: it was labelled "17 kernels")."""
    cpu, gpu = 100, 0
    ev = [x("user_annotation", "step", 0, 1000, cpu, 1)]
    for k in range(17):
        ev.append(x("cuda_runtime", "cudaLaunchKernel" if k == 0 else "cudaMemcpyAsync", 10 + 50 * k, 5, cpu, 1,
                    correlation=k))
        ev.append(x("kernel" if k == 0 else "gpu_memcpy", "gemm" if k == 0 else "Memcpy DtoH (Device -> Pinned)",
                    20 + 50 * k, 2, gpu, 7, device=0, stream=7, correlation=k, bytes=4096))
    return {"schemaVersion": 1, "baseTimeNanoseconds": T0_NS, "traceEvents": ev}


if __name__ == "__main__":
    for name, doc in (("torch18_capitalised.json", torch18()), ("ns_flows.json", ns_flows()),
                      ("profiler_range.json", profiler_range()), ("gpu_figures.json", gpu_figures()),
                      ("one_kernel_16_memcpys.json", one_kernel_16_memcpys())):
        (HERE / name).write_text(json.dumps(doc, indent=1) + "\n")
