"""Fusion candidate miner: frequent consecutive op sequences inside hot regions."""

from __future__ import annotations

import numpy as np
import pytest

from cuvil_pgc.analyze import analyze, fusion
from cuvil_pgc.analyze.machine import MachineModel
from tests._tracebuild import build_trace, kernel, op_chain, region

CPU = MachineModel(device="cpu", name="test cpu", fingerprint="t", peak_flops={"fp32": 100e9}, mem_bw=10e9,
                   dispatch_overhead_s=3e-6)
BLOCK = ["aten::linear", "aten::gelu", "aten::layer_norm", "aten::add"]


def _calls(path: str, names: list[str], calls: int, nbytes: float | None = 3e6) -> list[dict]:
    evs, t = [], 0.0
    for _ in range(calls):
        evs.append(region(path, t, len(names) * 12 + 10))
        evs += op_chain(names, t + 5, 10.0, 2.0, bytes=nbytes)
        t += len(names) * 12 + 50
    return evs


def test_repeated_block_is_one_candidate_with_savings():
    a = analyze(build_trace(_calls("block", BLOCK, calls=10, nbytes=3e4)), machine=CPU)
    cands = [c for c in a.fusion_candidates if c.region == "block"]
    assert [c.ops for c in cands] == [BLOCK]          # sub-sequences dropped: contained in the block
    c = cands[0]
    assert c.occurrences == 10
    assert c.total_us == pytest.approx(10 * 4 * 10.0)
    assert c.bytes_saved == pytest.approx(10 * 3 * 2 * 3e4 / 3)
    assert c.est_saving_us == pytest.approx(10 * 3 * 3.0 + c.bytes_saved / 10e9 * 1e6)


def test_a_saving_is_never_more_than_the_time_of_the_ops():
    # 3 MB an op in 10 µs at 10 GB/s: the bytes alone would "save" 6 ms of 0.4 ms
    (c,) = analyze(build_trace(_calls("block", BLOCK, calls=10)), machine=CPU).fusion_candidates
    assert c.bytes_saved == pytest.approx(10 * 3 * 2 * 3e6 / 3) and c.est_saving_us == pytest.approx(c.total_us)


def test_sequences_never_span_two_region_calls():
    # each call holds [A, B]; "B A" would only exist across calls
    a = analyze(build_trace(_calls("r", ["aten::mul", "aten::sub"], calls=8)), machine=CPU)
    assert [c.ops for c in a.fusion_candidates] == [["aten::mul", "aten::sub"]]


def test_minimum_support(monkeypatch):
    evs = _calls("r", BLOCK, calls=fusion.MIN_SUPPORT - 1)
    assert analyze(build_trace(evs), machine=CPU).fusion_candidates == []
    evs = _calls("r", BLOCK, calls=fusion.MIN_SUPPORT)
    assert analyze(build_trace(evs), machine=CPU).fusion_candidates[0].occurrences == fusion.MIN_SUPPORT


def test_run_of_one_op_counts_non_overlapping_and_reports_longest():
    evs = [region("r", 0, 2000)] + op_chain(["aten::add"] * 60, 5, 10.0, 2.0)
    cands = analyze(build_trace(evs), machine=CPU).fusion_candidates
    assert len(cands) == 1
    assert cands[0].ops == ["aten::add"] * fusion.MAX_LEN and cands[0].occurrences == 60 // fusion.MAX_LEN


def test_unknown_bytes_give_zero_bytes_saved():
    a = analyze(build_trace(_calls("block", BLOCK, calls=5, nbytes=None)), machine=CPU)
    assert a.fusion_candidates[0].bytes_saved == 0.0
    assert a.fusion_candidates[0].est_saving_us == pytest.approx(5 * 3 * 3.0)


def test_only_hot_regions_are_mined(monkeypatch):
    monkeypatch.setattr(fusion, "HOT_REGIONS", 1)
    evs = _calls("big", BLOCK, calls=20) + [dict(e, ts=e["ts"] + 1e5) for e in _calls("small", BLOCK, calls=4)]
    a = analyze(build_trace(evs), machine=CPU)
    assert a.regions[0].path == "big"
    assert {c.region for c in a.fusion_candidates} == {"big"}


def _loop(names: list[str], calls: int, start: float = 0.0) -> list[dict]:
    """A model called ``calls`` times outside any region (a torch.profiler trace of a plain loop)."""
    evs, t = [], start
    for _ in range(calls):
        evs += op_chain(names, t, 10.0, 2.0)
        t += len(names) * 12 + 5
    return evs


def test_sequences_outside_regions_do_not_span_two_calls_of_the_model():
    # a plain profiled loop: no region marks where one call ends; "aten::add aten::linear" and the
    # 5- and 6-op windows that wrap around a call exist only across two calls
    a = analyze(build_trace(_loop(BLOCK, calls=10)), machine=CPU)
    assert [c.ops for c in a.fusion_candidates] == [BLOCK]
    assert a.fusion_candidates[0].occurrences == 10


def test_kernels_of_a_regions_calls_do_not_span_two_calls():
    # kernels carry no region call of their own: those of consecutive calls meet on the stream
    names = ["gemm", "bias_gelu", "layer_norm", "residual_add"]
    evs, t = [], 0.0
    for _ in range(8):
        evs.append(region("decode", t, 60.0))
        evs += [kernel(n, t + 2 + 12 * i, 10.0, region="decode") for i, n in enumerate(names)]
        t += 100.0
    gpu = MachineModel(device="cuda", name="test gpu", fingerprint="g", peak_flops={"fp32": 1e13}, mem_bw=1e12,
                       dispatch_overhead_s=3e-6, launch_latency_s=4e-6)
    kernel_seqs = [c.ops for c in analyze(build_trace(evs), machine=gpu).fusion_candidates
                   if c.ops[0] in names]
    assert kernel_seqs == [names]


def test_ops_that_launch_kernels_count_no_host_bytes():
    """Their tensors live on the device: the bytes of a fusion go with the kernel sequences, at the
    device's bandwidth, not with the ops at the host's."""
    evs, t = [], 0.0
    for _ in range(6):
        evs.append(region("step", t, 80.0))
        evs += op_chain(BLOCK, t + 1, 10.0, 2.0, bytes=3e6)
        evs += [kernel(f"k_{n}", t + 3 + 12 * i, 9.0, region="step") for i, n in enumerate(BLOCK)]
        t += 100.0
    gpu = MachineModel(device="cuda", name="test gpu", fingerprint="g", peak_flops={"fp32": 1e13}, mem_bw=1e12,
                       dispatch_overhead_s=3e-6, launch_latency_s=4e-6)
    ops = [c for c in analyze(build_trace(evs), machine=gpu).fusion_candidates if c.ops == BLOCK]
    assert len(ops) == 1 and ops[0].bytes_saved == 0.0


def _codes(names: list[str]) -> np.ndarray:
    return np.unique(np.array(names), return_inverse=True)[1].reshape(-1)


def test_repeat_period_is_the_unit_of_a_call_not_of_a_layer():
    layer = ["linear", "gelu", "linear", "add"]
    call = ["embedding", *layer * 6, "linear"]
    assert fusion.repeat_period(_codes(call * 5)) == len(call)
    assert fusion.repeat_period(_codes(layer * 5)) == len(layer)


def test_repeat_period_none_where_nothing_repeats_enough():
    rng = np.random.default_rng(0)
    assert fusion.repeat_period(rng.integers(0, 20, 200)) is None          # no unit
    assert fusion.repeat_period(_codes(BLOCK * (fusion.MIN_SUPPORT - 1))) is None   # too few calls
    assert fusion.repeat_period(_codes(["aten::add"] * 40)) is None        # one op: a long run or many calls


def test_repeat_period_tolerates_a_call_that_differs():
    calls = [list(BLOCK) for _ in range(30)]
    calls[7][2] = "aten::dropout"                 # one call took another path
    assert fusion.repeat_period(_codes([n for c in calls for n in c])) == len(BLOCK)


def test_repeat_period_finds_a_call_whose_first_op_recurs_in_every_layer():
    layer = ["linear", "gelu", "linear", "add"]
    call = [*layer * 40, "layer_norm", "linear"]          # "linear" recurs 80 times before the next call
    assert fusion.repeat_period(_codes(call * 4)) == len(call)
