"""Merging traces (ranks, repeated runs, weights; the one merge of trace.merge) and cross-rank skew."""

from __future__ import annotations

import os

import pytest

from cuvil_pgc.analyze import analyze
from cuvil_pgc.analyze.machine import MachineModel
from cuvil_pgc.trace.columns import Source
from cuvil_pgc.trace.merge import merge_traces
from tests._tracebuild import build_trace, op_chain, region

CPU = MachineModel(device="cpu", name="test cpu", fingerprint="t", peak_flops={"fp32": 100e9}, mem_bw=10e9,
                   dispatch_overhead_s=3e-6)
DATA = os.path.join(os.path.dirname(__file__), "data")


def _rank(rank: int, attn_us: float, weight: float = 1.0, start_ns: int | None = None):
    evs = [region("step", 0, 5000), region("step/attn", 10, attn_us), region("step/mlp", 3000, 1000)]
    evs += op_chain(["aten::mm", "aten::add"] * 5, 20, 50, 5, args={"shapes": [[4, 4]]})
    meta = {} if start_ns is None else {"start_unix_ns": start_ns}
    return build_trace(evs, sources=[Source(path=f"rank{rank}.trace.json", format="cuvil", metadata=meta,
                                            rank=rank, weight=weight)])


def test_merge_keeps_rows_strings_sources_and_args():
    a, b = _rank(0, 1000), _rank(1, 2500)
    m = merge_traces([a, b])
    assert len(m) == len(a) + len(b)
    assert [s.rank for s in m.sources] == [0, 1]
    assert (m.events["ts"][1:] >= m.events["ts"][:-1]).all()
    paths = {m.strings[i] for i in m.events["region"] if i >= 0}
    assert paths == {"step", "step/attn", "step/mlp"}
    assert len(m.args) == len(a.args) + len(b.args)
    assert all(m.args[row]["shapes"] == [[4, 4]] for row in m.args)
    assert set(m.events["source"].tolist()) == {0, 1}


def test_merge_aligns_sources_on_wall_clock():
    m = merge_traces([_rank(0, 1000, start_ns=10_000_000), _rank(1, 1000, start_ns=10_500_000)])
    first_of_1 = m.events["ts"][m.events["source"] == 1].min()
    assert first_of_1 == pytest.approx(500.0)


def test_weights_scale_totals():
    one = analyze(_rank(0, 1000), machine=CPU).region("step/attn")
    two = analyze(_rank(0, 1000, weight=2.0), machine=CPU).region("step/attn")
    # A weight says what one recorded call stands for (repeated runs, 1-in-N sampling): calls scale too.
    assert two.total_us == pytest.approx(2 * one.total_us) and two.calls == 2 * one.calls
    assert two.mean_us == pytest.approx(one.mean_us)
    assert two.hotness == pytest.approx(2 * one.hotness) and one.hotness > 0


def test_rank_skew_names_the_straggler():
    a = analyze([_rank(0, 1000), _rank(1, 2500), _rank(2, 1100)], machine=CPU)
    assert a.region("step/attn").calls == 3
    ranks = a.ranks
    assert ranks["ranks"] == [0, 1, 2]
    attn = next(r for r in ranks["regions"] if r["path"] == "step/attn")
    assert attn["slowest_rank"] == 1 and attn["fastest_rank"] == 0
    assert attn["skew_us"] == pytest.approx(2500 - 1100)
    assert ranks["stragglers"][0]["path"] == "step/attn"
    assert a.region("step/attn").evidence["slowest_rank"] == 1
    assert "ranks" in a.to_json()
    lanes = set(a.timeline.spans["lane"])
    assert {lane.split()[0] for lane in lanes} == {"r0", "r1", "r2"}


def test_single_rank_has_no_skew_section():
    assert analyze([_rank(0, 1000), _rank(0, 1200)], machine=CPU).ranks == {}


def test_merge_orders_rows_as_the_reader_does_longest_first_on_ties():
    parent = build_trace([region("step", 0, 500)], sources=[Source(path="a", format="cuvil", metadata={})])
    child = build_trace([region("other", 0, 100)], sources=[Source(path="b", format="cuvil", metadata={})])
    m = merge_traces([child, parent])         # same start: the longer row comes first, whatever the order given
    assert m.events["dur"].tolist() == [500.0, 100.0]
    assert [m.strings[i] for i in m.events["name"]] == ["step", "other"]


@pytest.mark.parametrize("files", [["ours/regions.trace.json", "kineto_cpu/cpu_annotated.json"],
                                   ["kineto_gpu/gpu_two_regions.json", "ours/regions.trace.json"]])
def test_merging_loaded_traces_equals_loading_them_together(files):
    from cuvil_pgc.trace import load_trace

    paths = [os.path.join(DATA, f) for f in files]
    together = load_trace(*paths)
    apart = merge_traces([load_trace(p) for p in paths])
    assert len(apart) == len(together)
    for col in ("kind", "source", "pid", "tid", "dur"):
        assert apart.events[col].tolist() == together.events[col].tolist(), col
    assert apart.events["ts"] == pytest.approx(together.events["ts"], abs=1e-3)
    names = [[t.strings[i] for i in t.events["name"]] for t in (apart, together)]
    assert names[0] == names[1]
    assert apart.counters["ts"] == pytest.approx(together.counters["ts"], abs=1e-3)
    assert [apart.args.get(r) for r in range(len(apart))] == [together.args.get(r) for r in range(len(together))]
