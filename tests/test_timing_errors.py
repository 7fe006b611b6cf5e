"""A program that passes its check call and raises at a later one, while timed (a torch.compile
program recompiling on a later call, a runtime failing on reuse), is rejected with its reason; the
other contenders are timed without it, and the search and the final race go on instead of ending
with the candidate's exception."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import checked_build, measure, plan
from cuvil_pgc.recompile import search as search_mod
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.measure import time_surviving
from cuvil_pgc.recompile.trials import SearchOptions

QUICK = {"rounds": 4, "warmup": 0, "inner": 1, "settle_s": 0.0}


def _calls(fail_at: int | None = None):
    count = [0]

    def fn():
        count[0] += 1
        if fail_at is not None and count[0] >= fail_at:
            raise RuntimeError(f"call {count[0]} failed\nsecond line")
    return fn


def test_a_contender_that_raises_is_left_out_and_the_others_timed():
    samples, failed = time_surviving({"eager": _calls(), "a": _calls(3), "b": _calls()}, **QUICK)
    assert set(samples) == {"eager", "b"} and all(len(s.seconds) == 4 for s in samples.values())
    assert failed == {"a": "RuntimeError: call 3 failed"}


def test_eager_that_raises_is_the_model_s_error():
    with pytest.raises(RuntimeError, match="call 2 failed"):
        time_surviving({"eager": _calls(2), "a": _calls()}, **QUICK)


class Raising(nn.Module):
    """The scope's own module, which raises while ``when`` says the timing runs."""

    def __init__(self, inner: nn.Module, when: list[str], stage: str) -> None:
        super().__init__()
        self.inner, self.when, self.stage = inner, when, stage

    def forward(self, *args):
        if self.stage in self.when:
            raise RuntimeError(f"failed while the {self.stage} timed it")
        return self.inner(*args)


def _timed_as(module, stage: str, timing: list[str], monkeypatch) -> None:
    """``module.time_interleaved`` marks ``stage`` in ``timing`` while it runs."""
    real = measure.time_interleaved

    def timed(fns, **kwargs):
        timing.append(stage)
        try:
            return real(fns, **kwargs)
        finally:
            timing.remove(stage)

    monkeypatch.setattr(module, "time_interleaved", timed)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)).eval(), (torch.randn(2, 16),)


def test_the_search_rejects_a_candidate_that_raises_while_timed_and_goes_on(monkeypatch, caplog):
    """Every build is the scope's eager module; the whole model's first compile candidate raises
    once the search times it (an exhaustive search: every candidate is built)."""
    timing, victim = [], []
    real = checked_build.realize

    def realize(module, cand, *args, **kwargs):
        built = real(module, Candidate(cand.scope), *args, **kwargs)
        if not victim and cand.scope == "" and cand.backend == "compile":
            victim.append(cand.key)
            built.module = Raising(built.module, timing, "search")
        return built

    monkeypatch.setattr("cuvil_pgc.recompile.checked_build.realize", realize)
    _timed_as(search_mod, "search", timing, monkeypatch)
    model, inputs = _mlp()
    options = SearchOptions(exhaustive=True, backends=("compile",), rounds=3, deployed_race=False, use_records=False)
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc"):
        result = search_mod.search(model, inputs, None, options=options)
    (key,) = victim
    trial = result.trials[key]
    assert trial.status == "compile_error" and trial.measured_us is None
    assert trial.reason == ("raised while it was timed, after its check call passed: "
                            "RuntimeError: failed while the search timed it")
    assert any(t.status == "ok" and not t.candidate.is_baseline for t in result.trials.values())
    assert f"cuvil-pgc: {key} is left out" in caplog.text
    assert key not in result.final_medians_us


def test_the_final_race_leaves_out_a_plan_that_raises_while_raced(monkeypatch, caplog):
    """Every build is the scope's eager module; the plan the search chose raises once the final race
    times it: the race goes on without it."""
    timing, real = [], checked_build.realize
    monkeypatch.setattr("cuvil_pgc.recompile.checked_build.realize",
                        lambda module, cand, *a, **kw: real(module, Candidate(cand.scope), *a, **kw))

    def rebuild(module, cand, *args, **kwargs):
        built = real(module, Candidate(cand.scope), *args, **kwargs)
        built.module = Raising(built.module, timing, "race")
        return built

    monkeypatch.setattr(plan, "realize", rebuild)
    _timed_as(plan, "race", timing, monkeypatch)
    # the search times every build at half eager's time (its builds are eager's: real timings would
    # leave it to chance whether a plan beats eager and races at all)
    monkeypatch.setattr(search_mod, "time_interleaved", lambda fns, **kw: {
        key: SimpleNamespace(median_s=1e-4 if key == "eager" else 5e-5) for key in fns})
    model, inputs = _mlp()
    options = SearchOptions(exhaustive=True, backends=("compile",), rounds=3, deployed_race=False, use_records=False)
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc"):
        result = search_mod.search(model, inputs, None, options=options)
    raced = [line for line in caplog.text.splitlines() if "raised while raced" in line]
    assert raced and set(result.final_medians_us) == {"eager"} and result.choices == {} and result.module is model
    assert "it raised while raced, after its check call passed: RuntimeError: failed while the race timed it" \
        in caplog.text
