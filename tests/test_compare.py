"""compare: interleaved A/B timing, bootstrap CI of the ratio, verdict (asserted on known speed gaps)."""

from __future__ import annotations

import json
import os
import time
import warnings
from collections import Counter

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile.compare import compare_runnables
from cuvil_pgc.recompile.measure import (
    balanced_orders,
    bootstrap_ci,
    median,
    ratio_ci,
    time_interleaved,
    verdict,
)
from cuvil_pgc.viewer.console_recompile import compare_table


class Tiny(nn.Module):
    def __init__(self, extra_sleep_s: float = 0.0) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.extra_sleep_s = extra_sleep_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra_sleep_s:
            time.sleep(self.extra_sleep_s)      # known extra cost per call
        return self.fc(x)


def tiny():
    torch.manual_seed(0)
    return Tiny().eval(), (torch.randn(1, 8),)


def test_verdict_follows_the_ci():
    assert verdict((1.1, 1.3)) == "faster"
    assert verdict((0.7, 0.95)) == "slower"
    assert verdict((0.9, 1.1)) == "same"


def test_ratio_ci_and_bootstrap_on_known_samples():
    a = [2.0 + 0.01 * (i % 5) for i in range(30)]
    b = [1.0 + 0.01 * (i % 3) for i in range(30)]
    lo, hi = ratio_ci(a, b, n_boot=500)
    assert 1.9 < lo <= median(a) / median(b) <= hi < 2.1
    lo, hi = bootstrap_ci(b, median, n_boot=500)
    assert 1.0 <= lo <= hi <= 1.02


def test_interleaving_rotates_the_order():
    calls = []
    time_interleaved({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=4, warmup=0, inner=1,
                     settle_s=0)
    rounds = ["".join(calls[i:i + 2]) for i in range(0, 8, 2)]
    assert rounds == ["ab", "ba", "ab", "ba"]


@pytest.mark.parametrize("n", range(1, 9))
def test_balanced_orders_give_every_contender_every_predecessor_equally_often(n):
    rows = balanced_orders(n)
    assert all(sorted(row) == list(range(n)) for row in rows)
    assert len(rows) == (n if n % 2 == 0 or n == 1 else 2 * n)
    follows = Counter((row[i - 1], row[i]) for row in rows for i in range(1, n))
    assert set(follows) == {(a, b) for a in range(n) for b in range(n) if a != b}
    assert len(set(follows.values())) <= 1                   # every ordered pair equally often
    assert len({row[0] for row in rows}) == n                 # every contender runs first in some round


def test_interleaving_varies_each_contenders_predecessor():
    """A plain rotation of abc always runs b right after a; the timed order must not."""
    calls = []
    fns = {k: (lambda k=k: calls.append(k)) for k in "abcd"}
    time_interleaved(fns, rounds=8, warmup=0, inner=1, settle_s=0)
    before_b = {calls[i - 1] for i in range(1, len(calls)) if calls[i] == "b"}
    assert before_b >= {"a", "c", "d"}


def test_each_sample_follows_untimed_calls_of_its_own_contender(monkeypatch):
    """The threads a predecessor left spinning must settle before a contender is timed: every timed
    sample comes right after settle_s of its own untimed calls, which its time leaves out."""
    import itertools

    from cuvil_pgc.recompile import measure

    clock = {"t": 0.0}
    monkeypatch.setattr(measure.time, "perf_counter", lambda: clock["t"])
    calls = []

    def contender(name, seconds):
        def call():
            calls.append(name)
            clock["t"] += seconds
        return call

    samples = time_interleaved({"a": contender("a", 0.25), "b": contender("b", 0.5)},
                               rounds=4, warmup=0, inner=2, settle_s=0.75)
    runs = [(name, len(list(group))) for name, group in itertools.groupby(calls)]
    # rounds ab ba ab ba; a settles in 3 calls (0.75 s), b in 2 (1 s), then each takes its 2 timed calls
    assert runs == [("a", 5), ("b", 4 + 4), ("a", 5 + 5), ("b", 4 + 4), ("a", 5)]
    assert samples["a"].seconds == [0.25] * 4 and samples["b"].seconds == [0.5] * 4
    calls.clear()
    time_interleaved({"a": contender("a", 0.25)}, rounds=3, warmup=0, inner=2, settle_s=0.75)
    assert calls == ["a"] * 6                 # alone, a contender is its own predecessor: nothing to settle
    calls.clear()            # asynchronous work (GPU): each settling call waits for its work, as a sample does
    time_interleaved({"a": contender("a", 0.25), "b": contender("b", 0.5)}, rounds=2, warmup=0, inner=2,
                     settle_s=0.75, sync=lambda: calls.append("|"))
    assert "".join(calls) == "a|a|a||aa|" + "b|b||bb|" + "b|b||bb|" + "a|a|a||aa|"


def test_compare_verdict_on_models_of_known_different_speed():
    fast, inputs = tiny()
    slow = Tiny(extra_sleep_s=0.002).eval()
    slow.load_state_dict(fast.state_dict())
    result = compare_runnables(fast, slow, inputs, names=("fast", "slow"), rounds=12, warmup=2)
    assert result["verdict"] == "slower" and result["speedup"] < 1
    assert set(result) >= {"a", "b", "speedup", "speedup_ci95", "verdict"}
    assert set(result["a"]) == {"name", "median_ms", "ci95_ms"} and result["a"]["name"] == "fast"
    reverse = compare_runnables(slow, fast, inputs, names=("slow", "fast"), rounds=12, warmup=2)
    assert reverse["verdict"] == "faster" and reverse["speedup"] > 1
    assert "faster" in compare_table(reverse).title


@pytest.mark.slow
def test_compare_cli_build_vs_eager_json(tmp_path, capsys, monkeypatch):
    from cuvil_pgc.cli import main
    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.signing import generate_keypair

    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = tiny()
    key, pub = generate_keypair(tmp_path / "release.key")
    build = recompile(model, inputs, plan={"": Candidate("", rewrite=True)}, rounds=5, records=False)
    path = build.save(tmp_path / "t.cuvilpkg", signing_key=key)
    spec = f"{os.path.abspath(__file__)}:tiny"
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit) as done:
        warnings.simplefilter("always")
        main(["compare", "--model", spec, "eager", path, "--pubkey", str(pub), "--rounds", "6", "--json"])
    assert done.value.code == 0
    # the model imported from its file is the model the build was made from (issue 22: it warned
    # "module changed since the build" and timed eager against itself)
    assert not [w for w in caught if "changed" in str(w.message)]
    doc = json.loads(capsys.readouterr().out)
    assert doc["a"]["name"] == "eager" and doc["b"]["name"] == path and doc["threads"] >= 1
    assert doc["verdict"] in ("faster", "slower", "same") and len(doc["speedup_ci95"]) == 2
    with pytest.raises(SystemExit) as done:
        main(["compare", "--model", spec, "eager", str(tmp_path / "missing.cuvilpkg")])
    assert done.value.code == 1
    assert "missing.cuvilpkg" in capsys.readouterr().err


def test_compare_cli_measures_at_the_threads_asked_for_and_restores_them(capsys):
    import torch

    from cuvil_pgc.cli import main

    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with pytest.raises(SystemExit) as done:
        main(["compare", "--model", f"{os.path.abspath(__file__)}:tiny", "eager", "eager",
              "--threads", str(target), "--rounds", "5", "--json"])
    assert done.value.code == 0
    assert json.loads(capsys.readouterr().out)["threads"] == target
    assert torch.get_num_threads() == before
