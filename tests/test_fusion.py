"""Fusion candidate miner: frequent consecutive op sequences inside hot regions."""

from __future__ import annotations

import pytest

from cuvil_pgc.analyze import analyze, fusion
from cuvil_pgc.analyze.machine import MachineModel
from tests._tracebuild import build_trace, op_chain, region

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
    a = analyze(build_trace(_calls("block", BLOCK, calls=10)), machine=CPU)
    cands = [c for c in a.fusion_candidates if c.region == "block"]
    assert [c.ops for c in cands] == [BLOCK]          # sub-sequences dropped: contained in the block
    c = cands[0]
    assert c.occurrences == 10
    assert c.total_us == pytest.approx(10 * 4 * 10.0)
    assert c.bytes_saved == pytest.approx(10 * 3 * 2 * 3e6 / 3)
    assert c.est_saving_us == pytest.approx(10 * 3 * 3.0 + c.bytes_saved / 10e9 * 1e6)


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
