"""Operator capture (torch_ops sampler) and its FLOP / byte estimates, with real torch on CPU."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil_pgc.instrument import ProfileRegion, Session, SessionConfig
from cuvil_pgc.instrument.samplers import op_cost
from cuvil_pgc.instrument.samplers._kineto_clock import MARK_PREFIX, OpClock, anchor
from cuvil_pgc.instrument.samplers.op_cost import estimate_cost
from cuvil_pgc.instrument.samplers.torch_ops import TorchOpSampler, nesting_depths, read_ops
from tests._regionlines import with_paths

F4 = "float"


# --- formulas, against hand-computed numbers ------------------------------------------------------
def test_mm_family_flops_and_bytes():
    # mm: 2*m*k*n; bytes = (m*k + k*n + m*n) * 4
    assert estimate_cost("aten::mm", [[64, 32], [32, 16]], [F4, F4]) == (2 * 64 * 32 * 16, (64 * 32 + 32 * 16 + 64 * 16) * 4, False)
    # addmm adds the bias read; FLOPs of the product only (as torch.utils.flop_counter)
    cost = estimate_cost("aten::addmm", [[16], [64, 32], [32, 16], [], []], [F4, F4, F4, "Scalar", "Scalar"])
    assert cost.flops == 65536 and cost.bytes == (16 + 64 * 32 + 32 * 16 + 64 * 16) * 4
    cost = estimate_cost("aten::bmm", [[4, 8, 16], [4, 16, 2]], [F4, F4])
    assert cost.flops == 2 * 4 * 8 * 16 * 2 and cost.bytes == (4 * 8 * 16 + 4 * 16 * 2 + 4 * 8 * 2) * 4
    cost = estimate_cost("aten::baddbmm", [[4, 8, 2], [4, 8, 16], [4, 16, 2], [], []], [F4] * 3 + ["Scalar"] * 2)
    assert cost.flops == 2 * 4 * 8 * 16 * 2


def test_matmul_and_linear():
    # batched with broadcasting: [2,1,8,16] @ [3,16,4] -> [2,3,8,4]
    cost = estimate_cost("aten::matmul", [[2, 1, 8, 16], [3, 16, 4]], [F4, F4])
    assert cost.flops == 2 * 6 * 8 * 16 * 4
    assert cost.bytes == (2 * 8 * 16 + 3 * 16 * 4 + 2 * 3 * 8 * 4) * 4
    # vector @ matrix -> [n]
    assert estimate_cost("aten::matmul", [[16], [16, 4]], [F4, F4]).bytes == (16 + 64 + 4) * 4
    # linear: input [..., in], weight [out, in], bias [out] -> [..., out]
    cost = estimate_cost("aten::linear", [[5, 7, 64], [32, 64], [32]], [F4, F4, F4])
    assert cost.flops == 2 * 35 * 64 * 32
    assert cost.bytes == (35 * 64 + 32 * 64 + 32 + 35 * 32) * 4
    half = estimate_cost("aten::linear", [[5, 64], [32, 64], []], ["c10::Half", "c10::Half", ""])
    assert half.bytes == (5 * 64 + 32 * 64 + 5 * 32) * 2


CONV2D_SHAPES = [[2, 3, 16, 16], [8, 3, 3, 3], [8], [], [], [], []]
CONV2D_DTYPES = [F4, F4, F4, "ScalarList", "ScalarList", "ScalarList", "Scalar"]
# out [2, 8, 8, 8]: 2 * N*Cout*Hout*Wout * Cin*kh*kw
CONV2D_FLOPS = 2 * (2 * 8 * 8 * 8) * (3 * 3 * 3)
CONV2D_BYTES = (2 * 3 * 16 * 16 + 8 * 27 + 8 + 2 * 8 * 8 * 8) * 4


def test_conv_overloads_map_their_argument_order():
    conv2d = estimate_cost("aten::conv2d", CONV2D_SHAPES, CONV2D_DTYPES, [None] * 3 + [[2, 2], [1, 1], [1, 1], 1])
    assert conv2d == (CONV2D_FLOPS, CONV2D_BYTES, False)
    # mkldnn_convolution: (input, weight, bias, padding, stride, dilation, groups)
    mkldnn = estimate_cost("aten::mkldnn_convolution", CONV2D_SHAPES, CONV2D_DTYPES,
                           [None] * 3 + [[1, 1], [2, 2], [1, 1], 1])
    assert mkldnn == conv2d
    # convolution: (input, weight, bias, stride, padding, dilation, transposed, output_padding, groups)
    conv = estimate_cost("aten::convolution", CONV2D_SHAPES[:3] + [[]] * 6, CONV2D_DTYPES[:3] + ["Scalar"] * 6,
                         [None] * 3 + [[2, 2], [1, 1], [1, 1], False, [0, 0], 1])
    assert conv == conv2d


def test_conv1d_3d_grouped_and_transposed():
    # conv1d, padding 0: L_out = 10 - 3 + 1 = 8
    c1 = estimate_cost("aten::conv1d", [[1, 2, 10], [4, 2, 3], [], [], [], [], []],
                       [F4, F4, "", "ScalarList", "ScalarList", "ScalarList", "Scalar"], [None] * 3 + [[1], [0], [1], 1])
    assert c1.flops == 2 * (1 * 4 * 8) * (2 * 3)
    assert c1.bytes == (20 + 24 + 32) * 4
    # conv3d with groups=2: weight [4, 1, 3, 3, 3], padding 1 keeps 4x4x4
    c3 = estimate_cost("aten::conv3d", [[1, 2, 4, 4, 4], [4, 1, 3, 3, 3], [], [], [], [], []],
                       [F4, F4, ""] + ["ScalarList"] * 3 + ["Scalar"], [None] * 3 + [[1, 1, 1], [1, 1, 1], [1, 1, 1], 2])
    assert c3.flops == 2 * (1 * 4 * 64) * (1 * 27)
    # conv_transpose2d: (input, weight, bias, stride, padding, output_padding, groups, dilation)
    # H_out = (4 - 1) * 2 - 2 * 1 + 1 * (3 - 1) + 1 + 1 = 8; weight [Cin=3, Cout=5, 3, 3]
    ct = estimate_cost("aten::conv_transpose2d", [[1, 3, 4, 4], [3, 5, 3, 3], [], [], [], [], [], []],
                       [F4, F4, ""] + ["ScalarList"] * 3 + ["Scalar", "ScalarList"],
                       [None] * 3 + [[2, 2], [1, 1], [1, 1], 1, [1, 1]])
    # transposed: every input point meets the whole filter: 2 * N*H_in*W_in * Cin*Cout*kh*kw
    assert ct.flops == 2 * (1 * 16) * (3 * 5 * 9)
    assert ct.bytes == (1 * 3 * 16 + 3 * 5 * 9 + 1 * 5 * 8 * 8) * 4


def test_sdpa_and_variants():
    q = [2, 4, 8, 16]
    # QK^T and PV: 2 * (2*b*h*s_q*s_k*d)
    expected = 2 * (2 * 2 * 4 * 8 * 8 * 16)
    for name in ("aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
                 "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_attention_math"):
        cost = estimate_cost(name, [q, q, q], [F4] * 3)
        assert cost.flops == expected, name
        assert cost.bytes == 4 * 1024 * 4, name
    # flash kernels take (batch, seq, heads, dim)
    bshd = [2, 8, 4, 16]
    assert estimate_cost("aten::_flash_attention_forward", [bshd] * 3, [F4] * 3).flops == expected


def test_the_formulas_are_torch_flop_counter_s():
    """Written out so the analyzer estimates a torch.profiler trace's ops without importing torch;
    they must stay torch.utils.flop_counter's."""
    from torch.utils import flop_counter

    for a, b in (([3, 5], [5, 7]), ([1, 512], [512, 10])):
        assert op_cost._mm_flop(a, b) == flop_counter.mm_flop(a, b)
    assert op_cost._bmm_flop([4, 3, 5], [4, 5, 7]) == flop_counter.bmm_flop([4, 3, 5], [4, 5, 7])
    for x, w, out, transposed in (([2, 3, 32, 32], [16, 3, 3, 3], [2, 16, 30, 30], False),
                                  ([1, 8, 10], [8, 4, 5], [1, 4, 14], True)):
        assert op_cost._conv_flop(x, w, out, transposed) == flop_counter.conv_flop_count(x, w, out, transposed)
    for q, kv in (([2, 4, 8, 16], [2, 4, 12, 16]), ([1, 8, 5, 32], [1, 2, 5, 32])):     # GQA too
        assert op_cost._sdpa_flop(q, kv, kv) == flop_counter.sdpa_flop_count(q, kv, kv)
    assert estimate_cost("aten::mm", [[3, 5], [6, 7]], [F4] * 2).flops is None     # mismatched: unknown


def test_pooling_elementwise_views_and_unknowns():
    pool = estimate_cost("aten::max_pool2d", [[1, 2, 9, 9], [], [], [], [], []], [F4] + ["ScalarList"] * 4 + ["Scalar"],
                         [None, [2, 2], [2, 2], [0, 0], [1, 1], True])
    assert pool.bytes == (2 * 81 + 2 * 5 * 5) * 4            # ceil_mode: 9 -> 5
    adaptive = estimate_cost("aten::adaptive_avg_pool2d", [[3, 8, 7, 7], []], [F4, "ScalarList"], [None, [1, 1]])
    assert adaptive.bytes == (3 * 8 * 49 + 3 * 8) * 4
    add = estimate_cost("aten::add", [[4, 1], [1, 5], []], [F4, F4, "Scalar"])
    assert add == (20, (4 + 5 + 20) * 4, False)
    inplace = estimate_cost("aten::add_", [[4, 5], [], []], [F4, "long int", "Scalar"])
    assert inplace == (20, 20 * 4 + 8 + 20 * 4, False)       # reads self and a 0-dim long, writes self
    assert estimate_cost("aten::eq", [[10], [10]], [F4, F4]).bytes == 80 + 10
    assert estimate_cost("aten::transpose", [[32, 64], [], []], [F4, "Scalar", "Scalar"]) == (0, 0, False)
    assert estimate_cost("aten::copy_", [[8, 32], [8, 32], []], [F4, F4, "Scalar"]).bytes == 2 * 8 * 32 * 4
    assert estimate_cost("aten::cat", [[], []], ["TensorList", "Scalar"]).partial
    unknown = estimate_cost("aten::sum", [[4, 4], [], []], [F4, "ScalarList", "Scalar"])
    assert unknown == (None, 64, True)
    assert estimate_cost("aten::reshape", [[4, 4], []], [F4, "ScalarList"]).bytes is None
    # a conv without its recorded scalars: inputs only, marked partial
    assert estimate_cost("aten::conv2d", CONV2D_SHAPES, CONV2D_DTYPES, None) == (None, (6144 + 864 + 32), True)


_shape = st.lists(st.integers(min_value=-2, max_value=64), max_size=5)


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(sorted(op_cost._RULES) + ["aten::add", "aten::sum", "aten::copy_", "x"]),
       shapes=st.lists(_shape, max_size=8),
       dtypes=st.lists(st.sampled_from([F4, "c10::Half", "Scalar", "TensorList", "", "weird"]), max_size=8),
       concrete=st.none() | st.lists(st.none() | st.integers(-3, 5) | st.lists(st.integers(-3, 5), max_size=3)
                                     | st.booleans() | st.sampled_from(["same", "valid"]), max_size=10))
def test_estimate_never_raises(name, shapes, dtypes, concrete):
    cost = estimate_cost(name if name.startswith(("aten::", "x")) else f"aten::{name}", shapes, dtypes, concrete)
    assert cost.flops is None or isinstance(cost.flops, int)
    assert cost.bytes is None or isinstance(cost.bytes, int)


def test_nesting_depths():
    # thread 1: A [0,100) > B [10,50) > C [20,30); D [60,70) inside A; E [100,110) after A. thread 2: F.
    tids = np.array([1, 1, 1, 1, 1, 2])
    starts = np.array([0, 10, 20, 60, 100, 15])
    ends = np.array([100, 50, 30, 70, 110, 40])
    assert nesting_depths(tids, starts, ends).tolist() == [0, 1, 2, 1, 0, 0]


# --- real capture through a session ---------------------------------------------------------------
def _record(tmp_path, body, **config):
    path = tmp_path / "ops.trace.json"
    cfg = SessionConfig(path=str(path), gpu="off", sample_hz=0, compile=False, **config)
    with Session(cfg, samplers=[TorchOpSampler()]):
        body()
    with open(path) as f:
        trace = json.load(f)
    return trace


def _ops(trace, name=None):
    with_paths(trace["traceEvents"])       # args.region: the path of the op's args.region_id
    return [e for e in trace["traceEvents"]
            if e.get("cat") == "cpu_op" and (name is None or e["name"] == name)]


def _regions(trace):
    return {e["args"]["path"]: e for e in with_paths(trace["traceEvents"])}


def test_ops_attributed_to_innermost_region_and_none_outside(tmp_path):
    x = torch.randn(16, 16)

    def body():
        with ProfileRegion("outer"):
            torch.neg(x)
            with ProfileRegion("inner"):
                torch.sigmoid(x)
        torch.exp(x)

    trace = _record(tmp_path, body)
    assert trace["cuvil"]["samplers"]["torch_ops"]["status"] == "ok"
    assert [e["args"]["region"] for e in _ops(trace, "aten::neg")] == ["outer"]
    assert [e["args"]["region"] for e in _ops(trace, "aten::sigmoid")] == ["outer/inner"]
    assert [e["args"]["region"] for e in _ops(trace, "aten::exp")] == [None]


def test_ops_keep_their_regions_when_the_wall_clock_pairing_is_off(tmp_path, monkeypatch):
    # The session's (monotonic, wall) pair read 3 ms late, as a wall-clock step or a slewing NTP
    # leaves it: ops placed through the wall clock would all land 3 ms off their regions.
    from cuvil_pgc.instrument import clock as clock_mod
    from cuvil_pgc.instrument import session as session_mod

    real = clock_mod.SessionClock.now

    def skewed():
        pair = real()
        return clock_mod.SessionClock(pair.start_mono_ns, pair.start_unix_ns + 3_000_000)

    monkeypatch.setattr(session_mod.SessionClock, "now", staticmethod(skewed))
    x = torch.randn(16, 16)

    def body():
        torch.exp(x)
        with ProfileRegion("outer"):
            torch.neg(x)
            with ProfileRegion("inner"):
                torch.sigmoid(x)

    trace = _record(tmp_path, body)
    status = trace["cuvil"]["samplers"]["torch_ops"]
    assert status["clock"]["aligned_by"] == "clock marks"
    assert abs(status["clock"]["wall_offset_us"] + 3000) < 500       # the marks measured the skew
    assert [e["args"]["region"] for e in _ops(trace, "aten::exp")] == [None]
    assert [e["args"]["region"] for e in _ops(trace, "aten::neg")] == ["outer"]
    assert [e["args"]["region"] for e in _ops(trace, "aten::sigmoid")] == ["outer/inner"]
    assert not [e for e in _ops(trace) if e["name"].startswith(MARK_PREFIX)]


def test_a_torch_that_cannot_stamp_clock_marks_still_records_its_ops(tmp_path, monkeypatch):
    import torch._C._profiler as torch_profiler

    class Broken:
        def __init__(self, name):
            raise RuntimeError("no RecordFunction here")

    monkeypatch.setattr(torch_profiler, "_RecordFunctionFast", Broken)
    x = torch.randn(4, 4)

    def body():
        with ProfileRegion("outer"):
            torch.neg(x)

    trace = _record(tmp_path, body)
    status = trace["cuvil"]["samplers"]["torch_ops"]
    assert status["status"] == "ok" and status["clock"]["aligned_by"] == "wall clock"
    assert [e["args"]["region"] for e in _ops(trace, "aten::neg")] == ["outer"]
    assert not torch.autograd._profiler_enabled()


def test_clock_marks_bound_the_offset_and_ops_follow_its_drift():
    marks = [("m0", 1000, 1400), ("m1", 2000, 2300), ("m2", 3000, 3900)]
    # Kineto read each mark 5_000_000 ns after the monotonic clock: offset in [k - after, k - before]
    recorded = {"m0": 5_001_200, "m1": 5_002_100, "m2": 5_003_100}
    a = anchor(marks, recorded)
    # brackets [4_999_800, 5_000_200], [4_999_800, 5_000_100], [4_999_200, 5_000_100] intersect
    assert (a.offset_ns, a.error_ns, a.kineto_ns) == (4_999_950, 150, 5_002_100)
    assert anchor(marks, {}) is None
    # marks that contradict each other: the narrowest bracket decides
    b = anchor([("a", 0, 10), ("b", 100, 2000)], {"a": 1_000_005, "b": 1_000_000})
    assert abs(b.offset_ns - 1_000_000) <= 5

    class Session:
        start_mono_ns, start_unix_ns = 1_000, 1_790_000_000_000_000_000
    start = [("s", 1_000, 1_000)]
    stop = [("e", 1_001_000, 1_001_000)]
    base = 1_790_000_000_000_010_000        # Kineto's Unix ns are beyond float64's exact range
    # Kineto runs 20 µs fast over the 1 ms between the ends (a rate difference)
    clock = OpClock.measured(Session, start, stop, {"s": base, "e": base + 1_020_000})
    assert clock.status()["aligned_by"] == "clock marks" and clock.status()["drift_us"] == 20.0
    us = clock.to_us(np.array([base, base + 510_000, base + 1_020_000, base + 5_000_000], dtype=np.int64))
    np.testing.assert_allclose(us, [0.0, 500.0, 1000.0, 1000.0 + (5_000_000 - 1_020_000) / 1000.0], atol=1e-3)
    fallback = OpClock.measured(Session, start, stop, {})
    assert fallback.status()["aligned_by"] == "wall clock"
    assert fallback.to_us(np.array([Session.start_unix_ns + 2_500], dtype=np.int64))[0] == 2.5


def test_ops_on_other_threads_use_their_own_regions(tmp_path):
    x = torch.randn(8, 8)
    ready, go = threading.Event(), threading.Event()
    native: dict[str, int] = {}

    def early():                         # started before the session
        native["early"] = threading.get_native_id()
        ready.set()
        go.wait(5)
        with ProfileRegion("early_region"):
            torch.tanh(x)
        torch.cos(x)

    def late():                          # started during the session
        native["late"] = threading.get_native_id()
        with ProfileRegion("late_region"):
            torch.sin(x)

    pre = threading.Thread(target=early)
    pre.start()
    ready.wait(5)

    def body():
        with ProfileRegion("main_region"):
            go.set()
            t = threading.Thread(target=late)
            t.start()
            t.join()
            pre.join()

    trace = _record(tmp_path, body)
    (tanh,), (cos,), (sin,) = _ops(trace, "aten::tanh"), _ops(trace, "aten::cos"), _ops(trace, "aten::sin")
    assert tanh["args"]["region"] == "early_region" and tanh["tid"] == native["early"]
    assert cos["args"]["region"] is None            # outside any region on its own thread
    assert sin["args"]["region"] == "late_region" and sin["tid"] == native["late"]
    assert _regions(trace)["late_region"]["tid"] == native["late"]


def test_shapes_flops_bytes_and_depth_from_real_ops(tmp_path):
    a, b = torch.randn(32, 48), torch.randn(48, 16)
    img = torch.randn(2, 3, 16, 16)
    conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
    lin = torch.nn.Linear(48, 16)

    def body():
        with torch.no_grad():
            torch.mm(a, b)
            conv(img)
            lin(a)

    trace = _record(tmp_path, body)
    (mm,) = _ops(trace, "aten::mm")
    assert mm["args"]["shapes"] == [[32, 48], [48, 16]]
    assert mm["args"]["dtypes"] == ["float", "float"]
    assert mm["args"]["flops"] == 2 * 32 * 48 * 16
    assert mm["args"]["bytes"] == (32 * 48 + 48 * 16 + 32 * 16) * 4
    (conv2d,) = _ops(trace, "aten::conv2d")
    assert conv2d["args"]["shapes"][:3] == CONV2D_SHAPES[:3]
    assert (conv2d["args"]["flops"], conv2d["args"]["bytes"]) == (CONV2D_FLOPS, CONV2D_BYTES)
    assert conv2d["args"]["depth"] == 0
    inner = [e for e in _ops(trace) if e["args"]["flops"] == CONV2D_FLOPS and e["args"]["depth"] > 0]
    assert inner, "the convolution's backend op carries the same estimate one level down"
    (linear,) = _ops(trace, "aten::linear")
    (addmm,) = _ops(trace, "aten::addmm")
    assert linear["args"]["depth"] == 0 and addmm["args"]["depth"] == 1
    assert linear["args"]["flops"] == addmm["args"]["flops"] == 2 * 32 * 48 * 16
    assert linear["ts"] <= addmm["ts"] and addmm["ts"] + addmm["dur"] <= linear["ts"] + linear["dur"]


def test_op_times_fall_inside_their_region_on_the_trace_clock(tmp_path):
    x = torch.randn(64, 64)

    def body():
        for i in range(20):
            with ProfileRegion(f"r{i}"):
                torch.mm(x, x)
            time.sleep(0.0005)

    trace = _record(tmp_path, body)
    regions = _regions(trace)
    mms = _ops(trace, "aten::mm")
    assert len(mms) == 20
    for op in mms:
        region = regions[op["args"]["region"]]
        assert region["ts"] <= op["ts"] and op["ts"] + op["dur"] <= region["ts"] + region["dur"]


def test_profiler_bookkeeping_is_not_reported_as_ops(tmp_path):
    x = torch.randn(4)

    def body():
        with torch.autograd.profiler.record_function("user_range"):
            torch.neg(x)

    trace = _record(tmp_path, body, record_shapes=False)
    names = {e["name"] for e in _ops(trace)}
    assert "aten::neg" in names and "user_range" not in names
    assert not any(n.startswith(("ProfilerStep", "[")) for n in names)
    (neg,) = _ops(trace, "aten::neg")
    assert neg["args"]["shapes"] is None and neg["args"]["flops"] is None   # record_shapes=False


def test_unavailable_while_torch_profiler_records(tmp_path):
    # the autograd profiler is what torch.profiler.profile runs underneath (and starts in ms, not s)
    with torch.autograd.profiler.profile(use_kineto=True):
        reason = TorchOpSampler().unavailable()
        trace = _record(tmp_path, lambda: torch.neg(torch.ones(2)))
    assert reason and "already recording" in reason
    status = trace["cuvil"]["samplers"]["torch_ops"]
    assert status["status"] == "unavailable" and "already recording" in status["reason"]
    assert not _ops(trace)


def test_a_torch_profiler_the_program_runs_itself_is_reported_not_an_empty_ok(tmp_path, caplog):
    """torch.profiler takes over the process's one profiler: a program that runs its own ended ours,
    whose ops (before it too) were gone, and the trace said torch_ops "ok" with 0 ops."""
    import pytest

    from cuvil_pgc.analyze import analyze
    from cuvil_pgc.errors import AnalysisError

    def body():
        torch.neg(torch.ones(2))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as own:
            torch.neg(torch.ones(2))
        assert any(e.name == "aten::neg" for e in own.events())       # the program's own trace works

    trace = _record(tmp_path, body)
    status = trace["cuvil"]["samplers"]["torch_ops"]
    assert status["status"] == "failed" and "its own torch.profiler" in status["reason"]
    assert "--no-ops" in status["reason"] and "sampler torch_ops disabled" in caplog.text
    with pytest.raises(AnalysisError, match="samplers that failed while recording: torch_ops: the program ran its own"):
        analyze(str(tmp_path / "ops.trace.json"))


def test_ops_on_by_default_through_profile(tmp_path):
    from cuvil_pgc import profile

    path = tmp_path / "default.trace.json"
    with profile(path, gpu="off", sample_hz=0):
        with ProfileRegion("step"):
            torch.relu(torch.randn(4, 4))
    with open(path) as f:
        trace = json.load(f)
    assert [e["args"]["region"] for e in _ops(trace, "aten::relu")] == ["step"]


def test_load_trace_reads_ops_with_region_and_estimates(tmp_path):
    from cuvil_pgc import load_trace
    from cuvil_pgc.trace.schema import Kind

    a, b = torch.randn(32, 48), torch.randn(48, 16)

    def body():
        with ProfileRegion("matmul"):
            torch.mm(a, b)

    _record(tmp_path, body)
    trace = load_trace(tmp_path / "ops.trace.json")
    rows = [i for i in trace.of_kind(Kind.CPU_OP).tolist() if trace.string(int(trace.name[i])) == "aten::mm"]
    assert len(rows) == 1
    (row,) = rows
    assert trace.string(int(trace.region[row])) == "matmul"
    assert trace.flops[row] == 2 * 32 * 48 * 16
    assert trace.bytes[row] == (32 * 48 + 48 * 16 + 32 * 16) * 4


class _FakeKinetoEvent:
    """Mirrors the _KinetoEvent accessors read_ops uses."""

    def __init__(self, name, start, dur, tid, activity="cpu_op", shapes=(), dtypes=(), concrete=None):
        self._v = (name, start, dur, tid, activity, list(shapes), list(dtypes), concrete)
        self.concrete_calls = 0

    def name(self): return self._v[0]
    def start_ns(self): return self._v[1]
    def duration_ns(self): return self._v[2]
    def device_resource_id(self): return self._v[3]
    def activity_type(self): return self._v[4]
    def shapes(self): return self._v[5]
    def dtypes(self): return self._v[6]

    def concrete_inputs(self):
        self.concrete_calls += 1
        return self._v[7]


def test_read_ops_keeps_cpu_ops_and_counts_unfinished_ones():
    conv = _FakeKinetoEvent("aten::conv2d", 100, 50, 7, shapes=CONV2D_SHAPES, dtypes=CONV2D_DTYPES,
                            concrete=[None] * 3 + [[2, 2], [1, 1], [1, 1], 1])
    mm = _FakeKinetoEvent("aten::mm", 200, 10, 8, shapes=[[2, 3], [3, 4]], dtypes=[F4, F4])
    events = [
        _FakeKinetoEvent("ProfilerStep#3", 0, 1000, 7, activity="user_annotation"),
        _FakeKinetoEvent("[memory]", 5, 0, 7, activity="cpu_instant_event"),
        conv, mm,
        _FakeKinetoEvent("aten::add", 300, -1, 7),            # still running when the profiler stopped
        _FakeKinetoEvent(MARK_PREFIX + "start0", 90, 1, 7),    # clock marks are no ops
    ]
    ops, incomplete = read_ops(events)
    assert incomplete == 1 and ops.marks == {MARK_PREFIX + "start0": 90}
    assert ops.names == ["aten::conv2d", "aten::mm"]
    assert ops.tids == [7, 8] and ops.starts == [100, 200] and ops.ends == [150, 210]
    assert ops.concrete == [[None] * 3 + [[2, 2], [1, 1], [1, 1], 1], None]
    assert conv.concrete_calls == 1 and mm.concrete_calls == 0   # scalars fetched only where needed


def test_failure_while_converting_is_recorded_and_the_profiler_is_released(tmp_path, monkeypatch):
    from cuvil_pgc.instrument.samplers import torch_ops

    def broken(*args):
        raise ValueError("conversion exploded")

    monkeypatch.setattr(torch_ops, "to_trace_events", broken)
    trace = _record(tmp_path, lambda: torch.neg(torch.ones(3)))
    status = trace["cuvil"]["samplers"]["torch_ops"]
    assert status["status"] == "failed"
    assert status["reason"] == "stop failed: ValueError: conversion exploded"
    assert not torch.autograd._profiler_enabled()     # a later session (or the user) can profile again
    assert not _ops(trace)
