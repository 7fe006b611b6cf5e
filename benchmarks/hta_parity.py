"""Side by side: ``analyze``'s ``trace.gpu`` figures against HolisticTraceAnalysis (HTA) on the same traces.

For each trace (default: the two real ResNet-50 traces in tests/data/kineto_resnet50),
HTA (``pip install HolisticTraceAnalysis``, the ``bench`` extra) runs its temporal breakdown,
kernel-type breakdown, idle-time breakdown, queue-length summary and kernel-launch statistics,
and the table shows each figure next to ours with the relative difference. HTA runs with
``include_last_profiler_step=True``: by default it drops the last ``ProfilerStep`` and the GPU
work launched in it (a sixth of these traces), which we never do. HTA's figures that are defined
differently are explained in ``cuvil_pgc.analyze.gpu_figures``.

Usage: ``python benchmarks/hta_parity.py [TRACE ...] [--markdown]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import warnings
from pathlib import Path

DEFAULT = sorted((Path(__file__).resolve().parents[1] / "tests" / "data" / "kineto_resnet50").glob("*.json.gz"))


def hta_figures(path: Path) -> dict[str, float]:
    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    from hta.trace_analysis import TraceAnalysis

    with tempfile.TemporaryDirectory() as d:
        os.symlink(path.resolve(), os.path.join(d, "rank0" + "".join(path.suffixes[-2:])))
        # HTA's default drops the last ProfilerStep and the GPU work it launched; compare whole traces.
        ta = TraceAnalysis(trace_dir=d, include_last_profiler_step=True)
        temporal = ta.get_temporal_breakdown(visualize=False).iloc[0]
        kinds, _ = ta.get_gpu_kernel_breakdown(visualize=False, include_memory_kernels=True)
        idle, _ = ta.get_idle_time_breakdown(visualize=False)
        queue = ta.get_queue_length_summary(ranks=[0])
        launch = ta.get_cuda_kernel_launch_stats(ranks=[0], visualize=False)[0]
    out = {"kernel time span (HTA kernel_time)": float(temporal["kernel_time(us)"]),
           "idle_us": float(temporal["idle_time(us)"]),
           "compute union_us": float(temporal["compute_time(us)"])}
    for _, row in kinds.iterrows():
        out[f"kind {row['kernel_type']} us"] = float(row["sum"])
    for _, row in idle.iterrows():
        out[f"stream {row['stream']} idle {row['idle_category']}_us"] = float(row["idle_time"])
    if queue is not None:
        for (_rank, stream), row in queue.iterrows():
            out[f"stream {stream} queue mean"] = float(row[("queue_length", "mean")])
            out[f"stream {stream} queue max"] = float(row[("queue_length", "max")])
    out["launches"] = float(len(launch))
    out["launch delay p50"] = float(launch["launch_delay"].quantile(0.5))
    out["launch delay p95"] = float(launch["launch_delay"].quantile(0.95))
    out["launches longer than kernel"] = float((launch["cpu_duration"] > launch["gpu_duration"]).sum())
    return out


def our_figures(path: Path) -> dict[str, float]:
    from cuvil_pgc.analyze.analyzer import analyze

    gpu = analyze(str(path)).trace["gpu"]
    (dev,) = gpu.values()
    out = {"kernel time span (HTA kernel_time)": dev["span_us"], "idle_us": dev["idle_us"],
           "compute union_us": dev["kinds"].get("compute", {}).get("union_us", 0.0)}
    for kind, hta_name in (("compute", "COMPUTATION"), ("communication", "COMMUNICATION"), ("memory", "MEMORY")):
        if kind in dev["kinds"]:
            out[f"kind {hta_name} us"] = dev["kinds"][kind]["union_us"]
    for stream, st in dev["streams"].items():
        for cause, us in st["idle_causes_us"].items():
            out[f"stream {stream} idle {cause}_us"] = us
        out[f"stream {stream} queue mean"] = st["queue_length"]["mean"]
        out[f"stream {stream} queue max"] = st["queue_length"]["max"]
    ld = dev["launch_delay_us"]
    out.update({"launches": ld["count"], "launch delay p50": ld["p50"], "launch delay p95": ld["p95"],
                "launches longer than kernel": ld["longer_than_kernel"]})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="*", type=Path, default=DEFAULT)
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if not args.traces:
        sys.exit("no traces given and none in tests/data/kineto_resnet50")
    for path in args.traces:
        hta, ours = hta_figures(path), our_figures(path)
        print(f"\n{path.name}")
        print("| figure | HTA | cuvil-pgc | diff |" if args.markdown else f"{'figure':44} {'HTA':>14} {'cuvil':>14} diff")
        if args.markdown:
            print("| --- | ---: | ---: | ---: |")
        for key in sorted(set(hta) | set(ours)):
            h, o = hta.get(key), ours.get(key)
            diff = "-" if h is None or o is None else (f"{(o - h) / h:+.2%}" if h else ("0" if o == h else "inf"))
            hs = "-" if h is None else f"{h:,.1f}"
            os_ = "-" if o is None else f"{o:,.1f}"
            print(f"| {key} | {hs} | {os_} | {diff} |" if args.markdown else f"{key:44} {hs:>14} {os_:>14} {diff}")


if __name__ == "__main__":
    main()
