"""Bad input: a TraceError naming the file and the problem, never a raw traceback or a huge allocation."""

from __future__ import annotations

import gzip
import json
import struct
import tracemalloc
from pathlib import Path

import pytest

from cuvil_pgc.errors import CuvilError, TraceError
from cuvil_pgc.trace import load_trace
from tests.test_reader_invariants import DATA

KINETO_CPU = DATA / "kineto_cpu" / "cpu_annotated.json"
OURS = DATA / "ours" / "regions.trace.json"


def _fails(path: Path | str, *fragments: str) -> TraceError:
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message
    assert "unexpectedly" not in message, message
    return info.value


def _write(tmp_path: Path, name: str, data: bytes | str) -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def test_trace_error_is_a_cuvil_error() -> None:
    assert issubclass(TraceError, CuvilError)


def test_missing_file_directory_empty_file(tmp_path: Path) -> None:
    _fails(tmp_path / "nope.trace.json", "no such file")
    _fails(tmp_path, "is a directory")
    _fails(_write(tmp_path, "empty.json", b""), "is empty")
    _fails(_write(tmp_path, "blank.json", b" \n\t "), "is empty")
    _fails(_write(tmp_path, "empty.json.gz", gzip.compress(b"")), "decompresses to nothing")
    with pytest.raises(TraceError, match="no trace files given"):
        load_trace()


def test_invalid_json(tmp_path: Path) -> None:
    _fails(_write(tmp_path, "a.json", '{"traceEvents": [}'), "not valid JSON", "byte")
    _fails(_write(tmp_path, "b.json", "hello"), "not valid JSON")
    _fails(_write(tmp_path, "c.json", '{"traceEvents": []} trailing'), "not valid JSON")


def test_truncated_kineto_file_says_so_and_that_nothing_can_be_recovered(tmp_path: Path) -> None:
    data = KINETO_CPU.read_bytes()
    path = _write(tmp_path, "cut.json", data[: len(data) // 2])
    _fails(path, "looks truncated", "nothing to recover")


def test_truncated_finished_cuvil_file_points_to_recovery(tmp_path: Path) -> None:
    data = OURS.read_bytes()
    path = _write(tmp_path, "cut.trace.json", data[: len(data) // 2])
    _fails(path, "looks truncated", "rename it to", ".partial")
    partial = Path(str(path) + ".partial")
    path.rename(partial)
    assert load_trace(partial).sources[0].recovered


def test_missing_trace_events_and_wrong_top_level(tmp_path: Path) -> None:
    _fails(_write(tmp_path, "a.json", '{"foo": 1}'), "no `traceEvents`")
    _fails(_write(tmp_path, "b.json", '"just a string"'), "not a trace object")
    _fails(_write(tmp_path, "c.json", "[1, 2]"), "wrong type", "$[0]")
    _fails(_write(tmp_path, "d.json", '{"traceEvents": {"a": 1}}'), "wrong type", "traceEvents")


@pytest.mark.parametrize("field,value,expect", [
    ("ts", '"soon"', "$.traceEvents[1].ts"),
    ("dur", "[1]", "$.traceEvents[1].dur"),
    ("pid", "1.5", "$.traceEvents[1].pid"),
    ("pid", "99999999999999999999999", "$.traceEvents[1].pid"),
    ("name", "42", "$.traceEvents[1].name"),
    ("args", "[1, 2]", "$.traceEvents[1].args"),
])
def test_wrong_types_name_the_json_path(tmp_path: Path, field: str, value: str, expect: str) -> None:
    event = {"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0, "args": {}}
    text = json.dumps(event).replace(f'"{field}": {json.dumps(event[field])}', f'"{field}": {value}')
    for name, head in (("k.json", ""), ("o.trace.json", '{"ph": "M", "name": "cuvil_session", "args": {}},')):
        first = head or '{"ph": "M", "name": "process_name", "pid": 1, "tid": 0, "args": {"name": "p"}},'
        doc = '{"traceEvents": [' + first + text + "]}"
        _fails(_write(tmp_path, name, doc), "wrong type", expect)


def test_wrong_types_inside_args(tmp_path: Path) -> None:
    kineto = {"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1,
                               "args": {"correlation": "seven"}}]}
    _fails(_write(tmp_path, "k.json", json.dumps(kineto)), "wrong type", "correlation")
    ours = {"traceEvents": [{"ph": "M", "name": "cuvil_session", "args": {}},
                            {"ph": "X", "cat": "region", "name": "r", "ts": 1, "dur": 1,
                             "args": {"path": "r", "id": "one"}}], "cuvil": {}}
    _fails(_write(tmp_path, "o.trace.json", json.dumps(ours)), "event #1", "args.id")
    ours["traceEvents"][1]["args"] = {"path": 5}
    _fails(_write(tmp_path, "p.trace.json", json.dumps(ours)), "args.path must be a string")
    ours["traceEvents"][1] = {"ph": "X", "cat": "cpu_op", "name": "mm", "ts": 1, "dur": 1, "args": {"flops": -3}}
    _fails(_write(tmp_path, "q.trace.json", json.dumps(ours)), "args.flops")
    ours["cuvil"] = ["not", "an", "object"]
    _fails(_write(tmp_path, "r.trace.json", json.dumps(ours)), "wrong type", "cuvil")


@pytest.mark.parametrize("field,value,problem", [
    ("ts", -3.0, "-3.0 timestamp"),
    ("dur", "NaN", "not valid JSON"),           # what Python's json.dumps writes for nan
    ("ts", "Infinity", "not valid JSON"),
    ("dur", "1e999", "out of range"),           # valid JSON, but not a finite float
])
def test_negative_nan_inf_times(tmp_path: Path, field: str, value, problem: str) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "ok", "ts": 1.0, "dur": 1.0},
              {"ph": "X", "cat": "cpu_op", "name": "bad", "ts": 2.0, "dur": 1.0}]
    text = json.dumps({"traceEvents": events})
    text = text.replace('"name": "bad", "ts": 2.0, "dur": 1.0',
                        '"name": "bad", ' + ('"ts": 2.0, "dur": ' + str(value) if field == "dur"
                                             else '"ts": ' + str(value) + ', "dur": 1.0'))
    err = _fails(_write(tmp_path, "t.json", text), problem)
    if problem.endswith(("duration", "timestamp")):
        assert "event #1" in str(err) and "'bad'" in str(err)


def test_a_negative_duration_is_read_as_zero_and_counted(tmp_path: Path) -> None:
    """torch.profiler writes ``dur: -1`` for a CPU event still running when the profile stopped
    (pytorch/pytorch#150131): refused, the whole trace was; read as 0 µs, the reader says how many."""
    events = [{"ph": "X", "cat": "cpu_op", "name": "ok", "ts": 1.0, "dur": 1.0},
              {"ph": "X", "cat": "cpu_op", "name": "unfinished", "ts": 2.0, "dur": -1},
              {"ph": "X", "cat": "cpu_op", "name": "also", "ts": 3.0, "dur": -1.5}]
    trace = load_trace(_write(tmp_path, "t.json", json.dumps({"traceEvents": events})))
    assert sorted(trace.events["dur"].tolist()) == [0.0, 0.0, 1.0]
    said = [w for s in trace.sources for w in s.warnings]
    assert any(w.startswith("2 complete (X) events have a negative duration (dur): read as 0 µs") for w in said), said


def test_x_event_without_timestamp(tmp_path: Path) -> None:
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "dur": 1}]}
    _fails(_write(tmp_path, "a.json", json.dumps(doc)), "missing timestamp", "event #0")


def test_counter_with_bad_timestamp_or_args(tmp_path: Path) -> None:
    doc = {"traceEvents": [{"ph": "C", "name": "sm_util", "ts": -1, "args": {"v": 1}}]}
    _fails(_write(tmp_path, "a.json", json.dumps(doc)), "counter event #0")
    doc = {"traceEvents": [{"ph": "M", "name": "cuvil_session", "args": {}},
                           {"ph": "C", "name": "sm_util", "ts": 1, "args": [1]}]}
    _fails(_write(tmp_path, "b.trace.json", json.dumps(doc)), "counter event's args are not an object")


def test_non_utf8_bytes_are_reported_with_their_offset(tmp_path: Path) -> None:
    data = OURS.read_bytes()
    at = data.index(b'"request"') + 2
    path = _write(tmp_path, "bad.trace.json", data[:at] + b"\xff\xfe" + data[at:])
    _fails(path, "not UTF-8", f"at byte {at}", "0xff")
    text = b'{"traceEvents": [{"name": "\xc3"}]}'
    lone = _write(tmp_path, "lone.json", text)
    at = text.index(b"\xc3")
    _fails(lone, "not UTF-8", f"at byte {at}")


def test_nesting_too_deep(tmp_path: Path) -> None:
    deep = b'{"traceEvents": [{"ph": "X", "ts": 1, "args": {"x": ' + b"[" * 5000 + b"]" * 5000 + b"}}]}"
    _fails(_write(tmp_path, "deep.json", deep), "nested too deeply")


def test_gzip_claiming_2gb_in_1kb_is_refused_without_allocating(tmp_path: Path) -> None:
    body = gzip.compress(OURS.read_bytes())
    assert len(body) < 1024
    lying = body[:-4] + struct.pack("<I", 2**31)            # ISIZE trailer: "2 GiB uncompressed"
    path = _write(tmp_path, "lying.trace.json.gz", lying)
    tracemalloc.start()
    try:
        _fails(path, "gzip", "damaged")
        cut = _write(tmp_path, "cut.trace.json.gz", body[: len(body) // 2])
        _fails(cut, "gzip stream ends early")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 << 20, f"peak {peak:,} bytes"
    garbage = _write(tmp_path, "garbage.json.gz", b"\x1f\x8b" + bytes(range(256)) * 4)
    _fails(garbage, "corrupt gzip data")
    trailing = _write(tmp_path, "trailing.json.gz", body + b"not gzip")
    _fails(trailing, "unexpected bytes after the gzip stream")


def test_decompressed_size_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = b'{"traceEvents": [' + b" " * 2_000_000 + b"]}"
    path = _write(tmp_path, "big.json.gz", gzip.compress(doc))
    monkeypatch.setenv("CUVIL_MAX_TRACE_BYTES", "1000000")
    _fails(path, "more than 1,000,000 bytes", "CUVIL_MAX_TRACE_BYTES")
    plain = _write(tmp_path, "big.json", doc)
    _fails(plain, "more than 1,000,000 bytes")
    monkeypatch.setenv("CUVIL_MAX_TRACE_BYTES", "3000000")
    assert len(load_trace(path)) == 0
    monkeypatch.setenv("CUVIL_MAX_TRACE_BYTES", "lots")
    with pytest.raises(TraceError, match="CUVIL_MAX_TRACE_BYTES"):
        load_trace(path)


def test_multi_member_gzip_is_read_whole(tmp_path: Path) -> None:
    data = KINETO_CPU.read_bytes()
    path = _write(tmp_path, "multi.json.gz", gzip.compress(data[:1000]) + gzip.compress(data[1000:]))
    assert len(load_trace(path)) == len(load_trace(KINETO_CPU))


def test_event_count_cap_and_lying_counts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events = [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": i, "dur": 1} for i in range(50)]
    path = _write(tmp_path, "many.json", json.dumps({"traceEvents": events}))
    monkeypatch.setenv("CUVIL_MAX_TRACE_EVENTS", "10")
    _fails(path, "more than the 10 events", "CUVIL_MAX_TRACE_EVENTS")
    monkeypatch.delenv("CUVIL_MAX_TRACE_EVENTS")
    claims = {"traceEvents": events[:2], "cuvil": {"events_written": 10**30, "dropped": {"regions": 2**70},
                                                   "start_unix_ns": 10**40},
              "otherData": {"count": 1e308}}
    trace = load_trace(_write(tmp_path, "claims.trace.json", json.dumps(claims)))
    assert len(trace) == 2
    assert "start_unix_ns" not in trace.sources[0].metadata      # an anchor no clock can hold is ignored
    assert any("cuvil.start_unix_ns" in n and "ignored" in n for n in trace.sources[0].notes)


def test_not_a_path_argument() -> None:
    with pytest.raises(TraceError, match="is not a path"):
        load_trace(42)  # type: ignore[arg-type]


def test_absurd_timestamps_and_anchors(tmp_path: Path) -> None:
    doc = {"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": 1e300, "dur": 1}]}
    _fails(_write(tmp_path, "far.json", json.dumps(doc)), "1e+300 timestamp")
    ours = {"traceEvents": [{"ph": "X", "cat": "region", "name": "r", "ts": 1, "dur": 1, "args": {"path": "r"}}],
            "cuvil": {"start_unix_ns": 10**40}}
    far = _write(tmp_path, "far.trace.json", json.dumps(ours))
    trace = load_trace(far, OURS)
    assert any("no absolute time anchor" in n for n in trace.sources[0].notes)
