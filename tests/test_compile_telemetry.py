"""Compile track: torch.compile phases, graph breaks, recompiles and cache hits in the trace.

Fast tests replay structured-trace records captured from real torch.compile runs
(tests/data/compile_records, see capture.py there); slow tests compile for real on CPU.
"""

from __future__ import annotations

import gzip
import inspect
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil_pgc.instrument.factory import profile
from cuvil_pgc.instrument.samplers import _compile_explain as explain
from cuvil_pgc.instrument.samplers._compile_hooks import (
    HOOK_CALLBACKS,
    HOOK_STRUCTURED,
    TRACE_LOGGER,
    CompileHooks,
    StructuredTraceHandler,
)
from cuvil_pgc.instrument.samplers._compile_records import CompileRecordProcessor

GOLDEN = Path(__file__).parent / "data" / "compile_records"
CAPTURE_BREAK_LINE = next(i for i, line in enumerate((GOLDEN / "capture.py").read_text().splitlines(), 1)
                          if "graph_break()" in line and "torch._dynamo" in line)


def _golden(name: str) -> list[dict]:
    records = [tuple(orjson.loads(line)) for line in gzip.open(GOLDEN / f"{name}.jsonl.gz")]
    t0 = records[0][0] / 1000.0
    processor = CompileRecordProcessor(lambda us: us - t0, pid=1)
    return processor.feed(records) + processor.finish()


def _of(events: list[dict], phase: str, compile_id: str | None = None) -> list[dict]:
    return [e for e in events if e["args"]["phase"] == phase
            and (compile_id is None or e["args"]["compile_id"] == compile_id)]


# -- golden records (real torch 2.13 output, replayed) --------------------------------------------
def test_golden_graph_break_gives_two_graphs_and_one_break_per_call():
    events = _golden("cold")
    frames = _of(events, "frame")
    assert [(e["args"]["compile_id"], e["name"]) for e in frames] == [
        ("0/0", "f"), ("1/0", f"torch_dynamo_resume_in_f_at_{CAPTURE_BREAK_LINE}"),
        ("0/1", "f"), ("1/1", f"torch_dynamo_resume_in_f_at_{CAPTURE_BREAK_LINE}")]
    breaks = _of(events, "graph_break", "0/0")
    assert len(breaks) == 1 and len(_of(events, "graph_break", "1/0")) == 0
    assert breaks[0]["args"]["location"].endswith(f"capture.py:{CAPTURE_BREAK_LINE}")
    assert "graph_break()" in breaks[0]["args"]["reason"]
    assert breaks[0]["dur"] == 0.0


def test_golden_recompile_names_the_input_and_the_guard():
    events = _golden("cold")
    recompiles = _of(events, "recompile")
    assert [e["args"]["compile_id"] for e in recompiles] == ["0/1", "1/1"]
    assert recompiles[0]["args"]["reason"] == (
        "recompile of f (0/1): input x shape changed [4, 8] -> [6, 8] "
        "(guard: tensor 'x' size mismatch at index 0. expected 4, actual 6)")


def test_golden_cache_misses_are_explained_against_the_previous_compile():
    events = _golden("cold")
    first = _of(events, "fx_graph_cache", "0/0")[0]["args"]
    assert first["cache"] == "miss" and "first compile of this frame" in first["reason"]
    again = _of(events, "fx_graph_cache", "0/1")[0]["args"]
    assert again["cache"] == "miss"
    assert "input 0 shape [4, 8] -> [s77, 8]" in again["reason"]
    assert "new size symbol s77" in again["reason"]
    aot = _of(events, "aot_autograd_cache", "0/1")[0]["args"]
    assert aot["cache"] == "miss" and "input x shape changed [4, 8] -> [6, 8]" in aot["reason"]
    assert {e["args"]["fx_cache"] for e in _of(events, "frame")} == {"miss"}


def test_golden_second_process_hits_both_caches():
    events = _golden("warm")
    lookups = _of(events, "fx_graph_cache") + _of(events, "aot_autograd_cache")
    assert len(lookups) == 8 and {e["args"]["cache"] for e in lookups} == {"hit"}
    assert all(e["args"]["reason"] is None and e["args"]["key"] for e in lookups)
    assert {e["args"]["cache"] for e in _of(events, "frame")} == {"hit"}


def test_golden_phases_nest_inside_their_frame():
    events = _golden("cold")
    phases = {e["args"]["phase"] for e in events}
    assert {"dynamo", "aot_autograd", "inductor_lowering", "inductor_codegen", "kernel_compile"} <= phases
    for frame in _of(events, "frame"):
        cid, start, end = frame["args"]["compile_id"], frame["ts"], frame["ts"] + frame["dur"]
        inner = [e for e in events if e["args"]["compile_id"] == cid and e["args"]["phase"] != "frame"]
        assert inner
        assert all(start - 1.0 <= e["ts"] and e["ts"] + e["dur"] <= end + 1.0 for e in inner), cid


# -- the record processor --------------------------------------------------------------------------
def _chromium(name: str, ph: str, ts_us: float, compile_id: str | None = "0/0", **args) -> tuple:
    event = {"name": name, "ph": ph, "ts": ts_us, "args": {"compile_id": str(compile_id), **args}}
    return (int(ts_us * 1000), 7, {"chromium_event": {}}, json.dumps(event))


def test_begin_end_pairs_become_x_events_on_the_trace_clock():
    processor = CompileRecordProcessor(lambda us: us - 1_000_000.0, pid=42)
    events = processor.feed([
        _chromium("entire_frame_compile", "B", 1_000_100.0),
        _chromium("GraphLowering.run", "B", 1_000_200.0),
        _chromium("GraphLowering.run", "E", 1_000_450.0),
        _chromium("entire_frame_compile", "E", 1_000_900.0),
    ]) + processor.finish()
    lowering = _of(events, "inductor_lowering")[0]
    assert (lowering["ts"], lowering["dur"], lowering["pid"], lowering["tid"]) == (200.0, 250.0, 42, 7)
    frame = _of(events, "frame")[0]
    assert (frame["ts"], frame["dur"], frame["args"]["compile_id"]) == (100.0, 800.0, "0/0")


def test_compile_still_running_at_stop_is_closed_and_marked():
    processor = CompileRecordProcessor(lambda us: us, pid=1)
    processor.feed([_chromium("entire_frame_compile", "B", 10.0), _chromium("bytecode_tracing", "B", 20.0),
                    (50_000, 7, {"str": ["x.py", 0]}, None)])
    events = processor.finish()
    frame = _of(events, "frame")[0]
    assert frame["dur"] == 40.0 and "still compiling" in frame["args"]["reason"]
    assert _of(events, "dynamo")[0]["args"]["reason"] == "unfinished when the session stopped"


def test_dynamo_reset_does_not_compare_with_compiles_before_it():
    processor = CompileRecordProcessor(lambda us: us, pid=1)

    def compile_once(start: float, size: list[int]) -> list[tuple]:
        md = {"frame_id": 0, "frame_compile_id": 0}
        return [_chromium("entire_frame_compile", "B", start),
                (int(start * 1000), 7, {"describe_tensor": {"id": 0, "describer_id": 0, "size": size,
                                                            "dtype": "torch.float32", "stride": [1]}, **md}, None),
                (int(start * 1000), 7, {"describe_source": {"id": 0, "describer_id": 0, "source": "L['x']"}, **md},
                 None),
                _chromium("entire_frame_compile", "E", start + 5),
                (int((start + 6) * 1000), 7, {"compilation_metrics": {"compile_id": "0/0", "co_name": "g"}}, None)]

    events = processor.feed(compile_once(0.0, [4]) + compile_once(100.0, [6])) + processor.finish()
    assert len(_of(events, "frame")) == 2 and not _of(events, "recompile")


def test_compiled_module_frames_name_the_user_call_site():
    md = {"frame_id": 0, "frame_compile_id": 1}
    stack = [{"line": 8, "name": "<module>", "filename": 0, "loc": "model(x)"},
             {"line": 67, "name": "inner", "filename": 1}]
    processor = CompileRecordProcessor(lambda us: us, pid=1)
    events = processor.feed([
        (0, 7, {"str": ["/app/serve.py", 0]}, None),
        (0, 7, {"str": ["/venv/site-packages/torch/_dynamo/external_utils.py", 1]}, None),
        (1000, 7, {"artifact": {"name": "recompile_reasons", "encoding": "json"}, **md}, "0/0: ___check_type_id"),
        (1000, 7, {"dynamo_start": {"stack": stack}, **md}, None),
        _chromium("entire_frame_compile", "B", 1.0, "0/1"),
        _chromium("entire_frame_compile", "E", 9.0, "0/1"),
        (9000, 7, {"compilation_metrics": {"compile_id": "0/1", "co_name": "inner"}}, None),
    ]) + processor.finish()
    frame = _of(events, "frame")[0]["args"]
    assert (frame["frame"], frame["caller"]) == ("inner", "/app/serve.py:8")
    assert _of(events, "recompile")[0]["args"]["reason"] == (
        "recompile of inner (0/1, called at serve.py:8): guard failed: ___check_type_id")


def test_cache_bypass_and_disabled_lookups():
    md = {"frame_id": 0, "frame_compile_id": 0}
    bypass = json.dumps({"cache_state": "bypass", "cache_bypass_reason": "Can't cache torchbind objects"})
    processor = CompileRecordProcessor(lambda us: us, pid=1)
    events = processor.feed([
        _chromium("entire_frame_compile", "B", 0.0),
        (1000, 7, {"artifact": {"name": "fx_graph_cache_bypass", "encoding": "json"}, **md}, bypass),
        _chromium("autograd_cache_disabled", "i", 2.0),
        _chromium("entire_frame_compile", "E", 5.0),
        (6000, 7, {"compilation_metrics": {"compile_id": "0/0", "co_name": "g"}}, None),
    ]) + processor.finish()
    fx, aot = _of(events, "fx_graph_cache")[0]["args"], _of(events, "aot_autograd_cache")[0]["args"]
    assert fx["cache"] == "bypass" and fx["reason"] == "FX graph cache bypassed for g (0/0): Can't cache torchbind objects"
    assert aot["cache"] is None and aot["reason"] == "AOTAutograd cache disabled for g (0/0)"
    assert _of(events, "frame")[0]["args"]["aot_cache"] is None


_KINDS = st.sampled_from(["chromium_event", "artifact", "str", "dynamo_start", "describe_tensor",
                          "describe_source", "compilation_metrics", "cuvil_callback", "other"])
_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                                 max_size=3), max_leaves=8)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**62), st.integers(0, 9), _KINDS, _VALUES,
                          st.none() | st.text(max_size=40) | _VALUES.map(json.dumps)), max_size=12))
def test_processor_never_raises_on_malformed_records(raw):
    processor = CompileRecordProcessor(lambda us: us, pid=1)
    records = [(t, tid, {kind: body, "frame_id": 0, "frame_compile_id": 0}, payload)
               for t, tid, kind, body, payload in raw]
    events = processor.feed(records) + processor.finish()
    assert all(e["cat"] == "compile" and e["dur"] >= 0 for e in events)


def test_phase_names_across_releases():
    from cuvil_pgc.trace.compile_phases import phase_of

    assert phase_of("entire_frame_compile") == phase_of("_compile.compile_inner") == "frame"
    assert phase_of("dynamo") is None                    # wrapper of the frame span
    assert phase_of("compile_attempt_3") == "dynamo"
    assert phase_of("GraphLowering.run") == "inductor_lowering"
    assert phase_of("AlgorithmSelectorCache.benchmark_example_value") == "autotuning"
    assert phase_of("autotune_select_algorithm") == "autotuning"
    assert phase_of("fx_graph_cache_hit") == "fx_graph_cache"
    assert phase_of("something_new_in_2_14") == "other"


# -- explanations ----------------------------------------------------------------------------------
def test_component_diff_names_inputs_config_and_version():
    meta = "TensorMetadata(dtype=torch.float32, shape=torch.Size([{}]), stride=({}), device=device(type='cpu'))"
    before = explain.parse_components([f"[aaa] example_inputs[0]: {meta.format('4, 8', '8, 1')}",
                                       "[c1] inductor_config[max_autotune]: False", "[t1] torch_version: x"])
    after = explain.parse_components([f"[bbb] example_inputs[0]: {meta.format('4, 8', '1, 4')}",
                                      "[c2] inductor_config[max_autotune]: True", "[t2] torch_version: y"])
    assert explain.diff_components(before, after) == [
        "input 0 stride [8, 1] -> [1, 4]", "torch version changed", "Inductor config max_autotune: False -> True"]


def test_graph_break_payload_parsing():
    payload = ("Graph break in user code at /src/model.py:17\nGraph Break Reason: Encountered graph break when "
               "attempting to trace CALL: a function call, e.g. f(x, y):\n\nCall to `print()`\n  Explanation: "
               "Dynamo does not know how to trace builtin print.\n  Hint: remove it\n\nUser code traceback:\n"
               '  File "/src/model.py", line 17, in forward\n    print(x)\n\nTraceback (most recent call last):\n...')
    reason, location, detail = explain.parse_graph_break(payload)
    assert location == "/src/model.py:17"
    assert reason == "Call to `print()`: Dynamo does not know how to trace builtin print."
    assert "Hint: remove it" in detail
    reason, location, _ = explain.parse_graph_break('User code traceback:\n  File "/a.py", line 3, in g\n')
    assert location == "/a.py:3" and reason


def test_guard_reasons_accept_torch_payload_forms():
    assert explain.guard_reasons("0/0: tensor 'x' size mismatch") == ["0/0: tensor 'x' size mismatch"]
    assert explain.guard_reasons('[\n"0/0: a",\n"0/1: b"\n]') == ["0/0: a", "0/1: b"]
    assert explain.guard_reasons(None) == []
    line = explain.explain_recompile("f (0/2)", ["0/0: a", "0/1: b"], [])
    assert line == "recompile of f (0/2): guard failed: a (+1 more cache entries failed)"


# -- hooks and the session -------------------------------------------------------------------------
def _trace_handlers() -> list[logging.Handler]:
    return [h for h in logging.getLogger(TRACE_LOGGER).handlers if isinstance(h, StructuredTraceHandler)]


def _our_callbacks() -> list:
    from torch._dynamo.callback import callback_handler

    return [cb for cb in callback_handler.start_callbacks + callback_handler.end_callbacks
            if getattr(cb, "__module__", "").startswith("cuvil_pgc")]


def test_session_without_torch_compile_records_nothing_and_leaves_no_hooks(tmp_path):
    out = tmp_path / "eager.trace.json"
    with profile(out, ops=False, gpu="off", sample_hz=0, compile=True) as session:
        torch.ones(8).add(1).sum()
        sampler = next(s for s in session.samplers if s.name == "compile")
        assert _trace_handlers() and sampler.hooks_registered()
    doc = json.loads(out.read_text())
    assert not [e for e in doc["traceEvents"] if e.get("cat") == "compile"]
    status = doc["cuvil"]["samplers"]["compile"]
    assert status["status"] == "ok" and status["compiles"] == 0 and HOOK_STRUCTURED in status["hooks"]
    assert sampler.hooks_registered() == [] and _trace_handlers() == [] and _our_callbacks() == []


def test_hooks_install_dynamo_callbacks_and_remove_everything():
    import collections

    import torch._dynamo  # noqa: F401 - loaded, so the callbacks go in at install

    hooks = CompileHooks(collections.deque(), 10)
    hooks.install()
    assert set(hooks.registered()) == {HOOK_STRUCTURED, HOOK_CALLBACKS} and _our_callbacks()
    hooks.remove()
    assert hooks.registered() == [] and _our_callbacks() == [] and _trace_handlers() == []


def test_missing_dynamo_hooks_degrade_to_notes(monkeypatch):
    import collections

    import torch._dynamo  # noqa: F401

    from cuvil_pgc.instrument.samplers import _compile_hooks

    monkeypatch.setattr(_compile_hooks, "_dynamo_attr", lambda module, name: None)   # an older torch
    hooks = CompileHooks(collections.deque(), 10)
    hooks.install()
    try:
        assert hooks.used == [HOOK_STRUCTURED]
        assert any("callback_handler not found" in n for n in hooks.notes)
        assert any("counters not found" in n for n in hooks.notes)
        assert hooks.counter_deltas() == {} and hooks.compilation_metrics_since(0.0) == []
    finally:
        hooks.remove()
    assert _trace_handlers() == []


def test_frames_known_only_from_compilation_metrics_still_appear():
    processor = CompileRecordProcessor(lambda us: us - 1_000_000.0, pid=1)
    metrics = {"compile_id": "2/0", "co_name": "forward", "start_time": 1.0, "entire_frame_compile_time_s": 0.5,
               "graph_op_count": 3}
    events = processor.feed([(0, 1, {"compilation_metrics": metrics}, None)]) + processor.finish()
    frame = _of(events, "frame")[0]
    assert (frame["name"], frame["ts"], frame["dur"], frame["args"]["graph_ops"]) == ("forward", 0.0, 500_000.0, 3)


def test_session_in_a_program_that_never_imports_torch_costs_no_import(tmp_path):
    code = ("import sys\nfrom cuvil_pgc import profile\n"
            f"with profile({str(tmp_path / 't.trace.json')!r}, ops=False, gpu='off', sample_hz=0, compile=True):\n"
            "    sum(range(1000))\n"
            "assert 'torch' not in sys.modules, 'the compile sampler imported torch'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    status = json.loads((tmp_path / "t.trace.json").read_text())["cuvil"]["samplers"]["compile"]
    assert status["status"] == "ok" and status["compiles"] == 0 and status["hooks"] == [HOOK_STRUCTURED]


# -- real torch.compile on CPU ---------------------------------------------------------------------
def _break_then_continue(x):
    y = x.sin() + 1
    torch._dynamo.graph_break()
    return y.cos() * 2


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.fixture(scope="module")
def inductor_cache(tmp_path_factory) -> str:
    """One Inductor cache for this module (the second-process test reads what the first compile wrote)."""
    return str(tmp_path_factory.mktemp("inductor_cache"))


@pytest.fixture(scope="module")
def compiled_here(tmp_path_factory, inductor_cache) -> dict:
    """One session in this process: a [4, 8] call (graph break), then a [6, 8] call (recompiles)."""
    from cuvil_pgc.instrument.region import ProfileRegion

    out = tmp_path_factory.mktemp("compile") / "compile.trace.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TORCHINDUCTOR_CACHE_DIR", inductor_cache)
        torch._dynamo.reset()
        compiled = torch.compile(_break_then_continue)
        try:
            with profile(out, ops=False, gpu="off", sample_hz=0, compile=True) as session:
                with ProfileRegion("first"):
                    compiled(torch.randn(4, 8))
                with ProfileRegion("second"):
                    compiled(torch.randn(6, 8))
                sampler = next(s for s in session.samplers if s.name == "compile")
        finally:
            torch._dynamo.reset()
    return {"doc": json.loads(out.read_text()), "sampler": sampler}


@pytest.mark.slow
def test_real_compile_graph_break_recompile_and_phases(compiled_here):
    from cuvil_pgc.analyze.compile_summary import summarize_compile_events

    doc = compiled_here["doc"]
    events = [e for e in doc["traceEvents"] if e.get("cat") == "compile"]
    regions = {e["name"]: (e["ts"], e["ts"] + e["dur"]) for e in doc["traceEvents"] if e.get("cat") == "region"}

    # Each event belongs to the region it starts in, split at the midpoint of the gap between the
    # two (under load an event can start within the slop of both windows: counting it by window
    # counted it twice); then each must lie inside its region's window, 1 ms of slop either side.
    split = (regions["first"][1] + regions["second"][0]) / 2
    first = [e for e in events if e["ts"] < split]
    second = [e for e in events if e["ts"] >= split]
    for part, name in ((first, "first"), (second, "second")):   # compile events sit on the region clock
        start, end = regions[name]
        outside = [e for e in part if not (start - 1000.0 <= e["ts"] and e["ts"] + e["dur"] <= end + 1000.0)]
        assert not outside, (name, regions[name], outside[:3])
    break_line = _line_of(_break_then_continue, "graph_break()")
    assert [e["name"] for e in _of(first, "frame")] == [
        "_break_then_continue", f"torch_dynamo_resume_in__break_then_continue_at_{break_line}"]
    breaks = _of(first, "graph_break")
    assert len(breaks) == 1 and breaks[0]["args"]["location"] == f"{__file__}:{break_line}"
    recompiles = _of(second, "recompile")
    assert len(recompiles) == 2
    assert "input x shape changed [4, 8] -> [6, 8]" in recompiles[0]["args"]["reason"]
    assert "tensor 'x' size mismatch at index 0" in recompiles[0]["args"]["reason"]
    assert {"dynamo", "aot_autograd", "inductor_lowering", "inductor_codegen"} <= {e["args"]["phase"] for e in first}
    assert [e["args"]["cache"] for e in _of(first, "fx_graph_cache")] == ["miss", "miss"]
    status = doc["cuvil"]["samplers"]["compile"]
    assert {HOOK_STRUCTURED, HOOK_CALLBACKS} <= set(status["hooks"]) and status["compiles"] == 4
    assert status["counters"]["graph_break.total"] == 2
    totals = summarize_compile_events(doc["traceEvents"])["totals"]
    assert (totals["compiles"], totals["graph_breaks"], totals["recompiles"]) == (4, 2, 2)
    assert compiled_here["sampler"].hooks_registered() == [] and _trace_handlers() == [] and _our_callbacks() == []


_SECOND_PROCESS = """
import sys
from cuvil_pgc import profile

with profile(sys.argv[1], ops=False, gpu="off", sample_hz=0, compile=True):
    import torch            # imported after the session started: the Dynamo hooks install lazily

{source}
    torch.compile(_break_then_continue)(torch.randn(4, 8))
"""


@pytest.mark.slow
def test_second_process_hits_the_fx_graph_cache(tmp_path, inductor_cache, compiled_here):
    source = textwrap.indent(inspect.getsource(_break_then_continue), "    ")
    script = tmp_path / "compile_again.py"
    script.write_text(_SECOND_PROCESS.format(source=source))
    out = tmp_path / "again.trace.json"
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": inductor_cache}
    subprocess.run([sys.executable, str(script), str(out)], env=env, check=True, timeout=300)
    doc = json.loads(out.read_text())
    events = [e for e in doc["traceEvents"] if e.get("cat") == "compile"]
    here = [e for e in compiled_here["doc"]["traceEvents"] if e.get("cat") == "compile"]
    first_keys = [e["args"]["key"] for e in _of(here, "fx_graph_cache")[:2]]
    assert [e["args"]["cache"] for e in _of(here, "fx_graph_cache")[:2]] == ["miss", "miss"]
    lookups = _of(events, "fx_graph_cache")
    assert [e["args"]["cache"] for e in lookups] == ["hit", "hit"]
    assert [e["args"]["key"] for e in lookups] == first_keys
    assert [e["args"]["fx_cache"] for e in _of(events, "frame")] == ["hit", "hit"]
    status = doc["cuvil"]["samplers"]["compile"]
    assert HOOK_CALLBACKS in status["hooks"] and status["counters"]["inductor.fxgraph_cache_hit"] == 2
