"""Fuzzing load_trace: mutated traces either load into a valid Trace or raise TraceError, nothing else."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import load_trace
from tests.test_reader_invariants import DATA, assert_valid_trace

SEEDS = [
    (DATA / "ours" / "regions.trace.json").read_bytes(),
    (DATA / "kineto_gpu" / "gpu_two_regions.json").read_bytes(),
    (DATA / "ours" / "crashed.trace.json.partial").read_bytes(),
    json.dumps({"traceEvents": [
        {"ph": "M", "name": "cuvil_session", "pid": 1, "tid": 0, "args": {"start_unix_ns": 10**18}},
        {"ph": "X", "cat": "region", "name": "r", "pid": 1, "tid": 1, "ts": 1.0, "dur": 9.0,
         "args": {"path": "r", "id": 1, "parent": None, "k": "v"}},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 2.0, "dur": 1.0,
         "args": {"region": "r", "flops": 10, "bytes": 20, "Input Dims": [[2, 2], [2, 2]]}},
        {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 3.0, "dur": 1.0,
         "args": {"correlation": 4, "grid": [1, 1, 1]}},
        {"ph": "C", "name": "sm_util", "pid": 0, "ts": 4.0, "args": {"gpu0": 50}},
        {"ph": "s", "id": 4, "pid": 1, "tid": 1, "ts": 2.5, "cat": "ac2g", "name": "ac2g"},
    ], "cuvil": {"start_unix_ns": 10**18}}).encode(),
]
JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=6),
    st.lists(st.integers(min_value=-5, max_value=5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
_DIR = Path(tempfile.mkdtemp(prefix="cuvil_fuzz_"))


@st.composite
def mutated_trace(draw) -> tuple[str, bytes]:
    seed = draw(st.sampled_from(SEEDS))
    how = draw(st.sampled_from(["flip", "truncate", "swap", "splice", "swap"]))
    if how == "flip":
        data = bytearray(seed)
        for _ in range(draw(st.integers(1, 8))):
            data[draw(st.integers(0, len(data) - 1))] ^= draw(st.integers(1, 255))
        data = bytes(data)
    elif how == "truncate":
        data = seed[: draw(st.integers(0, len(seed)))]
    elif how == "splice":
        at = draw(st.integers(0, len(seed)))
        data = seed[:at] + draw(st.binary(min_size=1, max_size=12)) + seed[at:]
    else:
        data = _swap_type(draw, seed)
    suffix = draw(st.sampled_from([".json", ".json", ".trace.json.partial", ".json.gz", ".trace.json.gz.partial"]))
    if suffix.endswith((".gz", ".gz.partial")):
        packed = gzip.compress(data)
        if draw(st.booleans()):
            packed = packed[: draw(st.integers(0, len(packed)))]
        data = packed
    return suffix, data


def _swap_type(draw, seed: bytes) -> bytes:
    try:
        doc = json.loads(seed)
    except ValueError:       # the partial seed: swap in one line instead
        lines = seed.split(b",\n")
        i = draw(st.integers(1, len(lines) - 2))
        try:
            event = json.loads(lines[i])
        except ValueError:
            return seed
        _swap_in(draw, event)
        lines[i] = json.dumps(event).encode()
        return b",\n".join(lines)
    events = doc.get("traceEvents", [])
    if events and draw(st.integers(0, 9)):
        _swap_in(draw, events[draw(st.integers(0, len(events) - 1))])
    else:
        key = draw(st.sampled_from(sorted(doc)))
        doc[key] = draw(JSON_VALUES)
    return json.dumps(doc).encode()


def _swap_in(draw, event: dict) -> None:
    target = event
    if isinstance(event.get("args"), dict) and event["args"] and draw(st.booleans()):
        target = event["args"]
    key = draw(st.sampled_from(sorted(target) + ["ts", "dur", "ph", "cat", "pid", "args"]))
    if draw(st.integers(0, 9)) == 0:
        target.pop(key, None)
    else:
        target[key] = draw(JSON_VALUES)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=mutated_trace(), with_valid=st.booleans())
def test_mutated_traces_load_or_raise_trace_error(case: tuple[str, bytes], with_valid: bool) -> None:
    suffix, data = case
    path = _DIR / f"fuzz{suffix}"
    path.write_bytes(data)
    try:
        trace = load_trace(path, DATA / "ours" / "regions.trace.json") if with_valid else load_trace(path)
    except TraceError as exc:
        message = str(exc)
        assert str(path) in message
        assert "unexpectedly" not in message, message
        return
    assert_valid_trace(trace)
