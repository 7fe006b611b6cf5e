"""Fuzzing load_trace: mutated traces either load into a valid Trace or raise TraceError, nothing else."""

from __future__ import annotations

import atexit
import gzip
import json
import shutil
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
_DIR = Path(tempfile.mkdtemp(prefix="cuvil_fuzz_"))     # hypothesis runs many examples per test: one directory
atexit.register(shutil.rmtree, _DIR, ignore_errors=True)


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


# --- the `cuvil` metadata (issue 23, item 9) ---------------------------------------------------------------------

META_FIELDS = ["schema_version", "host", "pid", "rank", "world_size", "python", "torch", "platform", "devices",
               "start_unix_ns", "end_unix_ns", "start_monotonic_ns", "command", "dropped", "samplers", "sampling",
               "config", "io_error", "version"]
FINITE_JSON = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([1e308, 1e30, 2**63, -1, 0, 1]),
    st.text(max_size=6))
META_VALUES = st.recursive(FINITE_JSON, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.sampled_from(["status", "reason", "notes", "scale", "every", "rate",
                                                              "regions", "x"]), inner, max_size=3), max_leaves=6)
_OURS = json.loads((DATA / "ours" / "regions.trace.json").read_bytes())


def _metadata_file(overrides: dict, summary: bool) -> Path:
    if summary:
        doc = {"cuvil_summary": {"schema_version": 1, "bucket_scheme": {"per_octave": 8, "unit": "ns"},
                                 "metadata": {**_OURS["cuvil"], **overrides},
                                 "regions": [{"path": "serve", "count": 2, "sum_ns": 3000, "min_ns": 1000,
                                              "max_ns": 2000, "buckets": [[79, 1], [88, 1]]}]}}
        path = _DIR / "meta.summary.json"
    else:
        doc = {**_OURS, "cuvil": {**_OURS["cuvil"], **overrides}}
        path = _DIR / "meta.trace.json"
    path.write_bytes(json.dumps(doc).encode())
    return path


def _analyze_and_render(path: Path) -> None:
    """What `analyze`, `summary` and `report` do with a loaded file."""
    import io

    from rich.console import Console

    from cuvil_pgc.analyze import analyze
    from cuvil_pgc.viewer import render_html
    from cuvil_pgc.viewer.console import render_hot_regions

    analysis = analyze(load_trace(path))
    render_hot_regions(analysis, Console(file=io.StringIO()), top=5)
    render_html(analysis)


@pytest.mark.parametrize("field, value", [
    ("dropped", "lots"), ("sampling", {"scale": 1e308}), ("sampling", {"scale": "2"}), ("sampling", [2]),
    ("dropped", {"regions": -3}), ("dropped", {"regions": 2**200}), ("rank", "0"), ("world_size", 0),
])
def test_bad_metadata_numbers_are_a_trace_error_naming_the_field(field, value):
    for summary in (False, True):
        path = _metadata_file({field: value}, summary)
        prefix = "cuvil_summary.metadata" if summary else "cuvil"
        with pytest.raises(TraceError, match=rf"{path}: {prefix}\.{field}"):
            load_trace(path)


@pytest.mark.parametrize("field, value", [
    ("start_unix_ns", 1e30), ("start_unix_ns", "soon"), ("start_unix_ns", 10**40), ("end_unix_ns", [1]),
    ("samplers", ["cpu"]), ("samplers", {"cpu": {"status": "ok", "notes": 5}}), ("devices", "gpu"),
    ("devices", [1, {"name": "A100"}]), ("command", 5), ("host", {"x": 1}), ("version", 3),
])
def test_bad_descriptive_metadata_is_ignored_with_a_note(field, value, caplog):
    path = _metadata_file({field: value}, summary=False)
    trace = load_trace(path)
    notes = trace.sources[0].notes
    assert any(f"cuvil.{field}" in n and "ignored" in n for n in notes), notes
    assert f"cuvil.{field}" in caplog.text
    _analyze_and_render(path)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(overrides=st.dictionaries(st.sampled_from(META_FIELDS), META_VALUES, min_size=1, max_size=4),
       summary=st.booleans())
def test_any_metadata_analyzes_and_renders_or_names_the_field(overrides: dict, summary: bool) -> None:
    """Whatever the metadata holds: a TraceError naming one of its fields, or analyze, summary and report work."""
    path = _metadata_file(overrides, summary)
    try:
        load_trace(path)
    except TraceError as exc:
        prefix = "cuvil_summary.metadata" if summary else "cuvil"
        assert any(f"{prefix}.{field}" in str(exc) for field in overrides), str(exc)
        return
    _analyze_and_render(path)


@pytest.mark.parametrize("field", ["ts", "dur", "counter"])
def test_a_number_beyond_float_range_is_named_not_a_crash(tmp_path, field):
    """JSON numbers may have any number of digits: an integer past float64's range made NumPy raise
    OverflowError, which the reader reported as failing 'unexpectedly' (the fuzz test found one)."""
    doc = json.loads((DATA / "kineto_gpu" / "gpu_two_regions.json").read_text())
    event = next(e for e in doc["traceEvents"] if e.get("ph") == "X")
    huge = 10**400
    if field == "counter":
        doc["traceEvents"].append({"ph": "C", "name": "mem", "pid": 1, "ts": event["ts"], "args": {"bytes": huge, "ok": 1}})
    else:
        event[field] = huge if field == "ts" else -huge
    path = tmp_path / "huge.json"
    path.write_text(json.dumps(doc))
    what = {"ts": r"event #\d+ .* has inf timestamp", "dur": r"event #\d+ .* has -inf duration",
            "counter": r"Number out of range - at `\$\.traceEvents\[\d+\]\.args\.bytes`"}[field]
    with pytest.raises(TraceError, match=what) as err:
        load_trace(path)
    assert "unexpectedly" not in str(err.value)
