"""Regenerate the golden structured-trace records of the compile sampler's unit tests.

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) python tests/data/compile_records/capture.py cold.jsonl.gz
    (same cache dir again)                python tests/data/compile_records/capture.py warm.jsonl.gz

Records exactly what the sampler's handler keeps (``_compile_hooks``) while torch.compile runs a
function with one graph break on a [4, 8] input, then on a [6, 8] input (one recompile per
frame). One JSON line per record: ``[wall_ns, tid, metadata, payload]``. To keep the files small,
config dumps (``*_config`` strings) are dropped and cache-key ``components`` are kept only in the
cache artifacts (torch repeats them in chromium event args); nothing else is changed.
"""

from __future__ import annotations

import gzip
import sys
from collections import deque

import orjson

from cuvil_pgc.instrument.samplers._compile_hooks import CompileHooks


def main(out: str) -> None:
    sink: deque = deque()
    hooks = CompileHooks(sink, 1_000_000)
    hooks.install()
    import torch

    def f(x):
        y = x.sin() + 1
        torch._dynamo.graph_break()
        return y.cos() * 2

    compiled = torch.compile(f)
    compiled(torch.randn(4, 8))
    compiled(torch.randn(6, 8))
    hooks.remove()
    with gzip.open(out, "wb") as fh:
        for record in sink:
            fh.write(orjson.dumps(_trimmed(*record), default=repr) + b"\n")


def _trimmed(wall_ns: int, tid: int, md: dict, payload: object) -> list:
    kind = next(iter(md))
    if kind == "compilation_metrics":
        md = {**md, kind: _drop_configs(md[kind])}
    elif kind == "chromium_event" and isinstance(payload, str):
        event = orjson.loads(payload)
        args = _drop_configs(event.get("args") or {})
        if "components" in args:
            args["components"] = []
        payload = orjson.dumps({**event, "args": args}).decode()
    return [wall_ns, tid, md, payload]


def _drop_configs(fields: dict) -> dict:
    return {k: v for k, v in fields.items() if not k.endswith("_config")}


if __name__ == "__main__":
    main(sys.argv[1])
