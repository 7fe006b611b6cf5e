"""Regenerate the reader's golden traces under tests/data/.

    python scripts/make_kineto_fixtures.py [--only cpu|gpu|ours]

- ``kineto_cpu/``: real torch.profiler exports (CPU, ``record_shapes=True``, ``with_flops=True``,
  ``record_function`` annotations, an op outside any annotation).
- ``kineto_gpu/``: no GPU here, so these are written to follow, field by field, what
  torch.profiler / Kineto writes for CUDA (libkineto ``output_json.cpp`` and
  ``CuptiActivity.cpp``): ``cuda_runtime`` / ``cuda_driver`` launches with ``cbid`` and
  ``correlation``, ``kernel`` / ``gpu_memcpy`` / ``gpu_memset`` on ``pid`` = device and ``tid`` =
  stream with their launch configuration, ``ac2g`` flow start/end pairs keyed by correlation id,
  ``External id`` links to the launching op, ``deviceProperties``, ``distributedInfo``,
  ``baseTimeNanoseconds`` with ``ts`` in µs after it.
- ``ours/``: real cuvil-pgc sessions (finished plain and gzip files, and partial files of a
  session killed with SIGKILL).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
BASE_NS = 1_790_857_026_000_000_000


# ----------------------------------------------------------------------------- CPU (real)
def cpu_fixtures(out: Path) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    lin0, lin1 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 4)

    with torch.inference_mode(), profile(activities=[ProfilerActivity.CPU], record_shapes=True,
                                         with_flops=True) as prof:
        torch.ones(4).add(1)                               # an op outside every annotation
        for _ in range(2):
            with record_function("preprocess"):
                x = torch.randn(8, 16).mul(2)
            with record_function("model"):
                with record_function("layer0"):
                    h = lin0(x).relu()
                with record_function("layer1"):
                    lin1(h)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "cpu_annotated.json"
    prof.export_chrome_trace(str(path))
    with open(path, "rb") as f, gzip.open(out / "cpu_annotated.json.gz", "wb") as g:
        shutil.copyfileobj(f, g)


# ----------------------------------------------------------------------------- GPU (Kineto's format)
class _KinetoWriter:
    """Writes events in the layout ChromeTraceLogger uses (ts relative to baseTimeNanoseconds)."""

    def __init__(self, pid: int, tid: int) -> None:
        self.pid, self.tid = pid, tid
        self.events: list[str] = []
        self.next_ext = 1
        self.next_corr = 100

    @staticmethod
    def _ts(ns: int) -> str:
        return f"{ns // 1000}.{ns % 1000:03d}"

    def meta(self, name: str, pid: int, tid: int, args: dict) -> None:
        self.events.append(
            f'  {{\n    "name": "{name}", "ph": "M", "ts": {self._ts(0)}, "pid": {pid}, "tid": {tid},\n'
            f'    "args": {{\n      {json.dumps(args)[1:-1]}\n    }}\n  }}')

    def x(self, cat: str, name: str, pid, tid, start_ns: int, dur_ns: int, args: dict | None) -> None:
        body = "" if args is None else f',\n    "args": {{\n      {json.dumps(args)[1:-1]}\n    }}'
        pid_s = json.dumps(pid)
        tid_s = json.dumps(tid)
        self.events.append(
            f'  {{\n    "ph": "X", "cat": "{cat}", "name": {json.dumps(name)}, "pid": {pid_s}, "tid": {tid_s},\n'
            f'    "ts": {self._ts(start_ns)}, "dur": {self._ts(dur_ns)}{body}\n  }}')

    def flow(self, ph: str, ident: int, pid: int, tid: int, ns: int) -> None:
        bp = ', "bp": "e"' if ph == "f" else ""
        self.events.append(
            f'  {{\n    "ph": "{ph}", "id": {ident}, "pid": {pid}, "tid": {tid}, "ts": {self._ts(ns)},\n'
            f'    "cat": "ac2g", "name": "ac2g"{bp}\n  }}')

    def op(self, name: str, start: int, dur: int, dims: list, types: list) -> int:
        ext = self.next_ext
        self.next_ext += 1
        self.x("cpu_op", name, self.pid, self.tid, start, dur,
               {"External id": ext, "Record function id": 0, "Input Dims": dims, "Input type": types})
        return ext

    def launch(self, ext: int, start: int, gpu_start: int, gpu_dur: int, kernel: str, *,
               api: str = "cudaLaunchKernel", cbid: int = 211, cat: str = "kernel", stream: int = 7,
               config: dict | None = None) -> int:
        corr = self.next_corr
        self.next_corr += 1
        runtime_cat = "cuda_driver" if api.startswith("cu") and not api.startswith("cuda") else "cuda_runtime"
        self.x(runtime_cat, api, self.pid, self.tid, start, 4_000, {"External id": ext, "cbid": cbid,
                                                                   "correlation": corr})
        self.flow("s", corr, self.pid, self.tid, start)
        args = {"External id": ext}
        if cat == "kernel":
            args.update({"queued": 0, "device": 0, "context": 1, "stream": stream, "correlation": corr,
                         "registers per thread": 32, "shared memory": 0, "blocks per SM": 0.030303,
                         "warps per SM": 0.121212, "grid": [4, 1, 1], "block": [128, 1, 1],
                         "est. achieved occupancy %": 3})
            args.update(config or {})
        else:
            nbytes = 1 << 20
            bw = nbytes / gpu_dur if gpu_dur else "N/A"
            args.update({"device": 0, "context": 1, "stream": stream, "correlation": corr,
                         "bytes": nbytes, "memory bandwidth (GB/s)": bw})
        self.x(cat, kernel, 0, stream, gpu_start, gpu_dur, args)
        self.flow("f", corr, 0, stream, gpu_start)
        return corr


def gpu_trace() -> str:
    """Two regions (preprocess, decode/attention) with launches, memcpy, memset and flows."""
    pid = tid = 4242
    w = _KinetoWriter(pid, tid)
    w.meta("process_name", pid, 0, {"name": "python"})
    w.meta("process_labels", pid, 0, {"labels": "CPU"})
    w.meta("process_name", 0, 0, {"name": "python"})
    w.meta("process_labels", 0, 0, {"labels": "GPU 0"})
    w.meta("thread_name", pid, tid, {"name": f"thread {tid} (python)"})
    w.meta("thread_name", 0, 7, {"name": "stream 7 "})
    us = 1000
    t0 = 5_162_873_024_000 * us
    w.x("user_annotation", "preprocess", pid, tid, t0 + 10 * us, 120 * us, {"External id": 900})
    ext = w.op("aten::copy_", t0 + 15 * us, 40 * us, [[256, 1024], [256, 1024], []], ["float", "float", "Scalar"])
    w.launch(ext, t0 + 20 * us, t0 + 30 * us, 60 * us, "Memcpy HtoD (Pageable -> Device)",
             api="cudaMemcpyAsync", cbid=41, cat="gpu_memcpy")
    ext = w.op("aten::zero_", t0 + 70 * us, 20 * us, [[256]], ["float"])
    w.launch(ext, t0 + 72 * us, t0 + 95 * us, 2 * us, "Memset (Device)", api="cudaMemsetAsync", cbid=51,
             cat="gpu_memset")
    ext = w.op("aten::mul", t0 + 100 * us, 20 * us, [[256, 1024], []], ["float", "Scalar"])
    w.launch(ext, t0 + 105 * us, t0 + 110 * us, 15 * us,
             "void at::native::vectorized_elementwise_kernel<4, at::native::MulFunctor<float>>()")
    w.x("gpu_user_annotation", "preprocess", 0, 7, t0 + 30 * us - 1, 95 * us + 2, {"External id": 900})
    # decode: many tiny kernels separated by launch gaps (launch-bound)
    start = t0 + 200 * us
    w.x("user_annotation", "decode", pid, tid, start, 400 * us, {"External id": 901})
    w.x("user_annotation", "attention", pid, tid, start + 5 * us, 200 * us, {"External id": 902})
    t = start + 10 * us
    for i in range(8):
        ext = w.op("aten::add", t, 18 * us, [[64], [64], []], ["float", "float", "Scalar"])
        w.launch(ext, t + 3 * us, t + 12 * us, 2 * us,
                 "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>()",
                 config={"grid": [1, 1, 1], "block": [64, 1, 1]})
        t += 22 * us + (i % 2) * us
    ext = w.op("aten::softmax", start + 220 * us, 30 * us, [[64, 64], []], ["float", "Scalar"])
    w.launch(ext, start + 225 * us, start + 240 * us, 9 * us, "triton_per_fused_softmax_0",
             api="cuLaunchKernel", cbid=307, config={"registers per thread": 40, "shared memory": 2048})
    w.x("cuda_runtime", "cudaDeviceSynchronize", pid, tid, start + 300 * us, 60 * us, {"cbid": 165, "correlation": 999})
    w.x("cpu_op", "aten::item", pid, tid, start + 620 * us, 5 * us, {"External id": 950, "Input Dims": [[]],
                                                                      "Input type": ["float"]})
    w.x("Trace", "PyTorch Profiler (0)", "Spans", "PyTorch Profiler", t0, 700 * us, {"Op count": 0})
    device = {"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 84929347584, "computeMajor": 9,
              "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
              "regsPerBlock": 65536, "warpSize": 32, "sharedMemPerBlock": 49152, "numSms": 132,
              "regsPerMultiprocessor": 65536, "sharedMemPerBlockOptin": 232448,
              "sharedMemPerMultiprocessor": 233472}
    dist = {"backend": "nccl", "rank": 1, "world_size": 2, "pg_count": 1, "pg_config": [], "nccl_version": "2.21.5"}
    head = ('\n  {\n    "schemaVersion": 1,\n    "deviceProperties": [\n    ' + json.dumps(device)
            + '\n    ],\n  "distributedInfo": ' + json.dumps(dist) + ',\n  "cuda_driver_version": 12040,'
            '\n  "cuda_runtime_version": 12040,\n  "cupti_version": 22,\n  "trace_id": "3F2B9C1D",'
            '\n  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": ' + str(BASE_NS) + ',\n  "traceEvents": [\n')
    end = (f'  {{\n    "name": "Record Window End", "ph": "i", "s": "g",\n    "pid": "", "tid": "", '
           f'"ts": {w._ts(t0 + 700 * us)}\n  }}\n  ],\n  "traceName": "gpu_two_regions.json"\n}}')
    return head + ",\n".join(w.events) + ",\n" + end


def gpu_fixtures(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = gpu_trace()
    json.loads(text)
    (out / "gpu_two_regions.json").write_text(text)


# ----------------------------------------------------------------------------- ours (real sessions)
_RECORDER = textwrap.dedent("""
    import sys, time
    from cuvil_pgc import ProfileRegion, profile
    with profile(sys.argv[1], ops=False, gpu="off", sample_hz=0, compile=False, flush_interval_s=0.1):
        i = 0
        while True:
            with ProfileRegion("step", i=i):
                with ProfileRegion("inner"):
                    time.sleep(0.001)
            i += 1
""")


def ours_fixtures(out: Path) -> None:
    from cuvil_pgc import ProfileRegion, profile

    out.mkdir(parents=True, exist_ok=True)
    for name in ("regions.trace.json", "regions.trace.json.gz"):
        path = out / name
        path.unlink(missing_ok=True)
        with profile(str(path), ops=False, gpu="off", sample_hz=0, compile=False):
            def work(tag: str) -> None:
                with ProfileRegion("request", worker=tag):
                    with ProfileRegion("decode", step=3):
                        time.sleep(0.001)
                    with ProfileRegion("decode", step=4):
                        time.sleep(0.001)
            threads = [threading.Thread(target=work, args=(f"w{i}",)) for i in range(2)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            work("main")
    for name in ("crashed.trace.json", "crashed_gz.trace.json.gz"):
        _killed_session(out / name)


def _killed_session(path: Path) -> None:
    partial = Path(str(path) + ".partial")
    partial.unlink(missing_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", _RECORDER, str(path)])
    deadline = time.time() + 30
    want = 1500 if str(path).endswith(".gz") else 8000
    while time.time() < deadline and (not partial.exists() or partial.stat().st_size < want):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    data = partial.read_bytes()
    partial.write_bytes(data[:6000] if not str(path).endswith(".gz") else data)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=("cpu", "gpu", "ours"))
    ns = parser.parse_args()
    if ns.only in (None, "cpu"):
        cpu_fixtures(DATA / "kineto_cpu")
    if ns.only in (None, "gpu"):
        gpu_fixtures(DATA / "kineto_gpu")
    if ns.only in (None, "ours"):
        ours_fixtures(DATA / "ours")


if __name__ == "__main__":
    main()
