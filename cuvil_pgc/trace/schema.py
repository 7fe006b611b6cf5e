"""The trace interchange format: event categories, counter names, metadata keys.

Files are Chrome Trace Event JSON in object form (Perfetto, chrome://tracing and
HolisticTraceAnalysis open them) with a top-level ``cuvil`` object; see DESIGN.md.
Timestamps (``ts``) and durations (``dur``) are microseconds as floats. In our files ``ts`` counts
from the session start; ``cuvil.start_unix_ns`` anchors it to wall-clock time.

A file being written is ``<path>.partial``: one JSON value per line, each followed by a comma, so
everything flushed before a crash can be recovered line by line (``trace.reader``). A finished
file replaces the partial atomically and ends with the ``cuvil`` metadata.
"""

from __future__ import annotations

import enum

SCHEMA_VERSION = 2
"""2: region events carry ``args.id``/``args.parent`` and their name, no ``args.path`` (the reader
rebuilds paths, trace._region_tree), and ``cuvil_region`` events declare regions written before
they end; the partial file carries the drop counters (``cuvil_dropped`` events). 1: ``args.path``."""
PARTIAL_SUFFIX = ".partial"
#: Largest ts / dur a reader accepts (µs; about year 5100 as Unix time): beyond it a file is damaged.
MAX_TIME_US = 1e17
TRACE_SUFFIXES = (".trace.json.gz", ".trace.json", ".json.gz", ".json")


def split_trace_path(path: str) -> tuple[str, str]:
    """``out/run.trace.json.gz`` -> (``out/run``, ``.trace.json.gz``): where rank, window and pid
    tags go in a trace file's name."""
    for suffix in TRACE_SUFFIXES:
        if path.endswith(suffix) and len(path) > len(suffix):
            return path[:-len(suffix)], suffix
    return path, ""


def display_path(path: str) -> str:
    """A region path (``parent/child``) without the ancestors its own name repeats: instrument_module
    names regions by qualified module path, so ``model/model.layer1/model.layer1.0`` reads
    ``model.layer1.0``; ``serve/model/model.fc`` reads ``serve/model.fc``. How every table and
    figure shows a path, and a form ``ops --region`` accepts."""
    parts = path.split("/")
    kept = [p for p, nxt in zip(parts, parts[1:] + [""], strict=True) if not nxt.startswith(p + ".")]
    return "/".join(kept)


# Event categories (`cat`) written by cuvil-pgc.
CAT_REGION = "region"
CAT_CPU_OP = "cpu_op"
CAT_KERNEL = "kernel"
CAT_RUNTIME = "cuda_runtime"
CAT_MEMCPY = "gpu_memcpy"
CAT_MEMSET = "gpu_memset"
CAT_COMPILE = "compile"

# Kineto categories understood when reading torch.profiler traces.
KINETO_REGION_CATS = ("user_annotation",)
KINETO_RUNTIME_CATS = ("cuda_runtime", "cuda_driver", "hip_runtime")

# Counter (`ph: "C"`) names.
COUNTER_SM_UTIL = "sm_util"
COUNTER_SM_OCCUPANCY = "sm_occupancy"
COUNTER_MEM_BW_UTIL = "mem_bw_util"
COUNTER_CPU_UTIL = "cpu_util"
COUNTER_SM_CLOCK = "sm_clock_mhz"
COUNTER_POWER = "power_w"
COUNTER_MEM_USED = "mem_used_bytes"

# Metadata event carrying the session header, written first so partial files can be recovered.
META_SESSION_EVENT = "cuvil_session"
# Metadata event declaring a region (name, id, parent) before a line names it (schema 2).
META_REGION_EVENT = "cuvil_region"
# Metadata event carrying the drop counters so far (per source), appended to the partial file
# whenever they change, so a trace recovered after a crash still has ``dropped`` (schema 2).
META_DROPPED_EVENT = "cuvil_dropped"


class Kind(enum.IntEnum):
    """Event kinds of the columnar Trace (one small integer per event)."""

    REGION = 0
    CPU_OP = 1
    KERNEL = 2
    RUNTIME = 3
    MEMCPY = 4
    MEMSET = 5
    COMPILE = 6
    OTHER = 7


CAT_TO_KIND: dict[str, Kind] = {
    CAT_REGION: Kind.REGION,
    "user_annotation": Kind.REGION,
    CAT_CPU_OP: Kind.CPU_OP,
    "operator": Kind.CPU_OP,
    CAT_KERNEL: Kind.KERNEL,
    "cuda_runtime": Kind.RUNTIME,
    "cuda_driver": Kind.RUNTIME,
    "hip_runtime": Kind.RUNTIME,
    CAT_MEMCPY: Kind.MEMCPY,
    CAT_MEMSET: Kind.MEMSET,
    CAT_COMPILE: Kind.COMPILE,
    # torch 1.8-1.10 (Kineto's first format) wrote `Operator`, `Runtime`, `Kernel`, `Memcpy`,
    # `Memset`; categories are matched case-insensitively, so these lower-case aliases cover them.
    "runtime": Kind.RUNTIME,
    "memcpy": Kind.MEMCPY,
    "memset": Kind.MEMSET,
}

# Kineto categories read as Kind.OTHER rows on purpose (named in notes, never counted as GPU time):
# the GPU-side span of a user annotation, and CUPTI range-profiler kernels, whose times Kineto
# synthesises (it splits the profiling span evenly between the ranges) and whose args hold the
# hardware counters of one kernel each.
CAT_GPU_ANNOTATION = "gpu_user_annotation"

# torch.profiler's ``with_stack=True`` records every nn.Module call as a ``python_function`` event
# named ``nn.Module: <Class>_<n>`` (``n`` counts the instances of that class): in a Kineto file,
# these are regions (paths ``Sequential_0/Linear_1``), as the TensorBoard plugin's module view reads
# them; the other Python functions stay other events.
CAT_PYTHON_FUNCTION = "python_function"
MODULE_CALL_PREFIX = "nn.Module: "
CAT_PROFILER_RANGE = "cuda_profiler_range"

# Keys of the top-level `cuvil` metadata object.
META_KEYS = (
    "schema_version", "version", "host", "cpu", "pid", "rank", "world_size", "python", "torch", "devices",
    "start_unix_ns", "start_monotonic_ns", "command", "dropped", "samplers",
)

# Sampler status values in `cuvil.samplers[name]["status"]`.
STATUS_OK = "ok"
STATUS_UNAVAILABLE = "unavailable"
STATUS_FAILED = "failed"
STATUS_DISABLED = "disabled"
