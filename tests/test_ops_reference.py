"""``operator_stats`` against a plain reference implementation (pairwise nesting, dict lookups).

The traces mix what multi-rank and multi-process files hold: two sources whose correlation ids
restart at 1, and two processes using the same thread id at the same times. Each op's nesting is
on its own (source, pid, tid), and a kernel belongs to the launch with its correlation id in its
own source.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict

from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil_pgc.analyze.operators import operator_stats
from cuvil_pgc.trace.columns import Source
from tests._tracebuild import build_trace

NAMES = ["aten::linear", "aten::addmm", "aten::relu", "aten::copy_", "aten::empty"]


def _tree(rng: random.Random, lane: tuple[int, int, int], start: float, stop: float, depth: int,
          out: list[dict], corr: list[int]) -> None:
    """Properly nested ops in [start, stop); some launch a kernel (a runtime call inside them)."""
    t = start
    while True:
        t += rng.choice([0.0, 1.0, 2.5])
        dur = rng.choice([1.0, 3.0, 8.0, 20.0, 40.0])
        if t + dur > stop:
            return
        src, pid, tid = lane
        e = {"kind": "op", "name": rng.choice(NAMES), "ts": t, "dur": dur, "pid": pid, "tid": tid,
             "source": src, "flops": rng.choice([None, 10.0, 100.0])}
        out.append(e)
        if dur >= 3.0 and rng.random() < 0.5:
            corr[src] += 1
            out.append({"kind": "runtime", "name": "cudaLaunchKernel", "ts": t + dur - 1.0, "dur": 0.5,
                        "pid": pid, "tid": tid, "source": src, "correlation": corr[src]})
            out.append({"kind": "kernel", "name": "k", "ts": t + dur, "dur": rng.choice([1.0, 7.0, 30.0]),
                        "pid": 0, "tid": 7, "source": src, "correlation": corr[src]})
        if depth < 3 and dur > 3.0:
            _tree(rng, lane, t, t + dur - 1.5, depth + 1, out, corr)
        t += dur


def _events(seed: int) -> list[dict]:
    rng = random.Random(seed)
    out: list[dict] = []
    corr = {0: 0, 1: 0}
    for lane in [(0, 1, 1), (0, 2, 1), (1, 1, 1), (0, 1, 3)]:     # same tid in two pids and two sources
        _tree(rng, lane, 0.0, 300.0, 0, out, corr)
    return out


def _reference(events: list[dict]) -> dict[str, tuple]:
    ops = [e for e in events if e["kind"] == "op"]
    lane = [(e["source"], e["pid"], e["tid"]) for e in ops]

    def innermost(ln, t, end, longer_than=0.0):
        """The shortest op of lane ``ln`` containing [t, end] and longer than ``longer_than``."""
        best = None
        for j, o in enumerate(ops):
            if lane[j] == ln and o["ts"] <= t and end <= o["ts"] + o["dur"] and o["dur"] > longer_than:
                if t < o["ts"] + o["dur"] and (best is None or o["dur"] < ops[best]["dur"]):
                    best = j
        return best

    parent = [innermost(lane[i], o["ts"], o["ts"] + o["dur"], o["dur"]) for i, o in enumerate(ops)]
    merged = _remove_dup_nodes(ops, parent)
    self_cpu = [o["dur"] - sum(c["dur"] for j, (c, p) in enumerate(zip(ops, parent, strict=True))
                               if p == i and j not in merged) for i, o in enumerate(ops)]
    launches = {(e["source"], e["correlation"]): e for e in events if e["kind"] == "runtime"}
    self_dev = [0.0] * len(ops)
    for k in (e for e in events if e["kind"] == "kernel"):
        call = launches[(k["source"], k["correlation"])]
        owner = innermost((call["source"], call["pid"], call["tid"]), call["ts"], call["ts"])
        if owner is not None:
            self_dev[owner] += k["dur"]
    for j in sorted(merged, key=lambda j: -len(_ancestors(parent, j))):      # innermost first
        self_dev[merged[j]] += self_dev[j]
        self_dev[j] = 0.0
    total_dev = list(self_dev)
    for i in range(len(ops)):
        p = parent[i]
        while p is not None:
            total_dev[p] += self_dev[i]
            p = parent[p]
    acc: dict[str, list] = defaultdict(lambda: [0, 0.0, 0.0, 0.0, 0.0, None])
    for i, o in enumerate(ops):
        if i in merged:
            continue
        a = acc[o["name"]]
        a[0] += 1
        a[1] += max(self_cpu[i], 0.0)
        a[2] += o["dur"]
        a[3] += self_dev[i]
        a[4] += total_dev[i]
        if o["flops"] is not None:
            a[5] = (a[5] or 0.0) + o["flops"]
    return {name: tuple(a) for name, a in acc.items()}


def _ancestors(parent: list, j: int) -> list[int]:
    out = []
    while parent[j] is not None:
        j = parent[j]
        out.append(j)
    return out


def _remove_dup_nodes(ops: list[dict], parent: list) -> dict[int, int]:
    """torch.profiler's ``EventList._remove_dup_nodes``: an op that is the only child of an op of its
    name merges into it (its children become the parent's), until none is left. Rewrites ``parent``;
    returns merged op -> the op it merged into. Quadratic and plain, as a reference is."""
    merged: dict[int, int] = {}
    while True:
        alive = [i for i in range(len(ops)) if i not in merged]
        children = {i: [j for j in alive if parent[j] == i] for i in alive}
        dup = next((j for j in alive if parent[j] is not None and ops[parent[j]]["name"] == ops[j]["name"]
                    and len(children[parent[j]]) == 1), None)
        if dup is None:
            break
        for c in children[dup]:
            parent[c] = parent[dup]
        merged[dup] = parent[dup]
    for j in merged:                      # into the op that remains
        while merged[j] in merged:
            merged[j] = merged[merged[j]]
    return merged


def _check(seed: int) -> None:
    events = _events(seed)
    sources = [Source(path=f"rank{r}", format="kineto", metadata={}, rank=r) for r in (0, 1)]
    got = {r.name: (r.calls, r.self_cpu_us, r.total_cpu_us, r.self_device_us, r.device_us, r.flops)
           for r in operator_stats(build_trace(events, sources=sources))}
    want = _reference(events)
    assert got.keys() == want.keys()
    for name, w in want.items():
        g = got[name]
        assert g[0] == w[0], name
        for a, b in zip(g[1:5], w[1:5], strict=True):
            assert math.isclose(a, b, abs_tol=1e-6), (name, g, w)
        assert (g[5] is None) == (w[5] is None) and (w[5] is None or math.isclose(g[5], w[5])), name


def test_operator_stats_match_the_reference_on_multi_process_multi_rank_ops():
    _check(7)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_operator_stats_match_the_reference_property(seed):
    _check(seed)


def test_an_only_child_of_its_own_name_is_one_call_as_in_key_averages():
    """``mean`` calls ``div_``, whose kernel runs in a nested ``div_``: torch.profiler's table counts
    one call of 40 µs total, and so does ours; a parent with two children of its name keeps them."""
    ev = [{"kind": "op", "name": "aten::mean", "ts": 0.0, "dur": 100.0, "pid": 1, "tid": 1},
          {"kind": "op", "name": "aten::div_", "ts": 50.0, "dur": 40.0, "pid": 1, "tid": 1},
          {"kind": "op", "name": "aten::div_", "ts": 52.0, "dur": 30.0, "pid": 1, "tid": 1},
          {"kind": "op", "name": "aten::empty", "ts": 55.0, "dur": 5.0, "pid": 1, "tid": 1},
          {"kind": "op", "name": "aten::add", "ts": 200.0, "dur": 50.0, "pid": 1, "tid": 1},
          {"kind": "op", "name": "aten::add", "ts": 205.0, "dur": 10.0, "pid": 1, "tid": 1},
          {"kind": "op", "name": "aten::add", "ts": 220.0, "dur": 10.0, "pid": 1, "tid": 1}]
    rows = {r.name: (r.calls, r.self_cpu_us, r.total_cpu_us) for r in operator_stats(build_trace(ev))}
    assert rows["aten::div_"] == (1, 35.0, 40.0)
    assert rows["aten::mean"] == (1, 60.0, 100.0)
    assert rows["aten::add"] == (3, 50.0, 70.0)


def test_processes_sharing_a_tid_and_ranks_sharing_correlation_ids_do_not_mix():
    """Before: ops nested across pids with the same tid, and a kernel found the launch of the other
    rank with its correlation id."""
    ev = [{"kind": "op", "name": "outer", "ts": 0.0, "dur": 100.0, "pid": 1, "tid": 1, "source": 0},
          {"kind": "op", "name": "inner_other_pid", "ts": 10.0, "dur": 20.0, "pid": 2, "tid": 1, "source": 0},
          {"kind": "op", "name": "launcher_rank1", "ts": 10.0, "dur": 20.0, "pid": 1, "tid": 1, "source": 1},
          {"kind": "runtime", "name": "cudaLaunchKernel", "ts": 15.0, "dur": 1.0, "pid": 1, "tid": 1,
           "source": 1, "correlation": 5},
          {"kind": "kernel", "name": "k", "ts": 40.0, "dur": 9.0, "pid": 0, "tid": 7, "source": 1, "correlation": 5},
          {"kind": "runtime", "name": "cudaLaunchKernel", "ts": 50.0, "dur": 1.0, "pid": 1, "tid": 1,
           "source": 0, "correlation": 5},
          {"kind": "kernel", "name": "k", "ts": 60.0, "dur": 4.0, "pid": 0, "tid": 7, "source": 0, "correlation": 5}]
    sources = [Source(path=f"rank{r}", format="kineto", metadata={}, rank=r) for r in (0, 1)]
    rows = {r.name: r for r in operator_stats(build_trace(ev, sources=sources))}
    assert rows["outer"].self_cpu_us == 100.0                   # no child in another pid or rank
    assert rows["outer"].self_device_us == 4.0                  # its own rank's kernel only
    assert rows["launcher_rank1"].self_device_us == 9.0
    assert rows["inner_other_pid"].device_us == 0.0
