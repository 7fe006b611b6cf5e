"""Files passed for a trace that are something else: named, with what to pass instead.

Contract: ``not_a_trace(path, head)`` returns a TraceError naming the file's format from its first
bytes (and its suffix, for formats without a magic number), or None for anything that may be a
trace. ``json_not_a_trace(path, head)`` does the same for JSON documents of PyTorch's other tools.
Nothing here parses the file: an Nsight report or a pickle is never opened as one.
"""

from __future__ import annotations

import re

from cuvil_pgc.errors import TraceError

#: What to record instead, for every format cuvil-pgc does not read.
RECORD = ("cuvil-pgc reads the JSON traces torch.profiler (`prof.export_chrome_trace(...)`) and "
          "`cuvil-pgc profile` write, gzipped or not: record the run with one of them")
_NSIGHT = "Nsight Systems"

_MAGIC: list[tuple[bytes, str, str]] = [
    (b"SQLite format 3\x00", f"an SQLite database ({_NSIGHT}' `nsys export --type sqlite` writes one)", RECORD),
    (b"PK\x03\x04", "a zip archive (a .cuvilpkg build, a torch.save checkpoint or a .pt2 export?)",
     "pass the .trace.json(.gz) the profile wrote (a .cuvilpkg build is for `load_build`)"),
    (b"\x28\xb5\x2f\xfd", "compressed with zstd", "decompress it (`zstd -d`) or gzip it instead"),
    (b"\xfd7zXZ\x00", "compressed with xz", "decompress it (`xz -d`) or gzip it instead"),
    (b"BZh", "compressed with bzip2", "decompress it (`bunzip2`) or gzip it instead"),
]
_SUFFIXES: dict[str, str] = {
    ".nsys-rep": f"an {_NSIGHT} report", ".qdrep": f"an {_NSIGHT} report",
    ".ncu-rep": "an Nsight Compute report", ".pftrace": "a Perfetto protobuf trace",
    ".perfetto-trace": "a Perfetto protobuf trace",
}
_PICKLE_PROTOCOLS = range(2, 6)
_GZIP = b"\x1f\x8b"            # a gzipped JSON trace, whatever its name

#: How many of a file's first bytes the checks look at.
HEAD_BYTES = 4096
_JSON_KINDS: list[tuple[re.Pattern[bytes], re.Pattern[bytes], str, str]] = [
    (re.compile(rb'"nodes"\s*:\s*\['), re.compile(rb'"schema"\s*:'),
     "a PyTorch execution trace (ExecutionTraceObserver): operators and their inputs, without times",
     "pass the Kineto trace recorded beside it (torch.profiler with execution_trace_observer writes both)"),
    (re.compile(rb'"segments"\s*:'), re.compile(rb'"device_traces"\s*:'),
     "a CUDA memory snapshot (torch.cuda.memory._snapshot())",
     "open it in https://pytorch.org/memory_viz; " + RECORD),
]


def not_a_trace(path: str, head: bytes) -> TraceError | None:
    for magic, what, fix in _MAGIC:
        if head.startswith(magic):
            return TraceError(f"is {what}, which cuvil-pgc cannot analyse", path=path, fix=fix)
    if len(head) > 1 and head[0] == 0x80 and head[1] in _PICKLE_PROTOCOLS:
        return TraceError("is a Python pickle (a memory snapshot or a torch.save file?), which cuvil-pgc cannot analyse and "
                          "does not load (unpickling runs code the file names)", path=path, fix=RECORD)
    for suffix, what in _SUFFIXES.items():
        if path.lower().endswith(suffix) and head.lstrip()[:1] not in (b"{", b"[") and not head.startswith(_GZIP):
            return TraceError(f"is {what}, which cuvil-pgc cannot analyse", path=path, fix=RECORD)
    return None


def json_not_a_trace(path: str, head: bytes) -> TraceError | None:
    for first, second, what, fix in _JSON_KINDS:
        if first.search(head, 0, HEAD_BYTES) and second.search(head, 0, HEAD_BYTES):
            return TraceError(f"is {what}, which cuvil-pgc cannot analyse", path=path, fix=fix)
    return None
