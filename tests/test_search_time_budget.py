"""``recompile --time-budget``: once the time is spent no candidate's build begins; the plan is
chosen from what was measured, the rest of the space says why it was not, and the runtimes'
baselines are measured whatever the budget. The clock is faked at its seam (search_policy.clock)
and advances as candidates are built, so nothing here depends on how fast this machine is."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cuvil_pgc.cli import main
from cuvil_pgc.recompile import checked_build, runtimes, search_policy
from cuvil_pgc.recompile import search as search_mod
from cuvil_pgc.recompile.candidates import Candidate, is_runtime_default
from cuvil_pgc.recompile.search_policy import TimeBudget
from cuvil_pgc.recompile.trials import SearchOptions

BUILD_S = 100.0     # what each candidate's build takes on the fake clock


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)).eval(), (torch.randn(2, 16),)


def _unmeasured(result):
    """The trials left unmeasured by the search's stop (not those it could tell would fail)."""
    return [t for t in result.trials.values()
            if t.status == "not_measured" and not t.candidate.is_baseline and not t.reason.startswith("not built")]


@pytest.fixture
def builds(monkeypatch):
    """Each build advances the fake clock by BUILD_S and builds the scope's eager module (fast);
    the search's timings are faked too: every build runs in half eager's time."""
    now, built, real = [0.0], [], checked_build.realize
    monkeypatch.setattr(search_policy, "clock", lambda: now[0])
    monkeypatch.setattr(search_mod, "time_interleaved", lambda contenders, **kw: {
        key: SimpleNamespace(median_s=1e-4 if key == "eager" else 5e-5) for key in contenders})

    def realize(module, cand, *args, **kwargs):
        built.append(cand)
        now[0] += BUILD_S
        return real(module, Candidate(cand.scope), *args, **kwargs)

    monkeypatch.setattr("cuvil_pgc.recompile.checked_build.realize", realize)
    return built


def _search(seconds: float, **options):
    model, inputs = mlp()
    opt = SearchOptions(rounds=3, deployed_race=False, use_records=False, time_budget=TimeBudget(seconds), **options)
    return search_mod.search(model, inputs, None, options=opt)


def test_no_build_begins_once_the_time_is_spent(builds, caplog):
    """An exhaustive search: at 100 s a build, a budget of 150 s builds two (at 0 and 100 s, the
    first batch) and leaves the rest with the reason; one of 50 s builds one, not the second
    candidate of its batch."""
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc"):
        result = _search(150, exhaustive=True, backends=("compile",))
    assert len(builds) == 2 and len(_unmeasured(result)) >= 2
    assert {t.reason for t in _unmeasured(result)} == {"not measured: the search's time budget (150 s) was spent"}
    assert {c.key for c in builds} == {t.candidate.key for t in result.trials.values()
                                      if t.status == "ok" and not t.candidate.is_baseline}
    spent = [r for r in caplog.records if "time budget (150 s) is spent" in r.getMessage()]
    assert len(spent) == 1       # said once
    assert result.stopped == "the search's time budget (150 s) is spent after 3 measurement(s)"    # eager's too
    # the plan measured is raced and built; its near ties (both builds are eager's here) are not
    # rebuilt to race again, as they are when the budget is not spent
    assert result.module is not None and len([k for k in result.final_medians_us if k.startswith("<model>::")]) == 1
    builds.clear()
    result = _search(50, exhaustive=True, backends=("compile",))
    assert len(builds) == 1 and {t.reason for t in _unmeasured(result)} == {
        "not measured: the search's time budget (50 s) was spent"}


def test_a_budget_not_spent_changes_nothing(builds):
    """With time to spare the candidate count stops the search, and says so."""
    result = _search(10**6, budget=3, backends=("compile",))
    assert builds and {t.reason for t in _unmeasured(result)} == {"ranked below the measured candidates (budget)"}
    assert result.stopped == ""
    assert len([k for k in result.final_medians_us if k.startswith("<model>::")]) > 1     # the tie raced again


@pytest.mark.skipif(not (runtimes.check("ort").ok and runtimes.check("openvino").ok),
                    reason="needs onnxruntime and openvino")
def test_the_runtimes_baselines_are_measured_whatever_the_budget(builds):
    """Spent by the first build, the budget still lets ONNX Runtime and OpenVINO at their defaults
    be built (OpenVINO's bf16 too, on a CPU where that is its default): they are what the build is
    raced against. Nothing else is."""
    result = _search(1, backends=("ort", "openvino"))
    assert len(builds) >= 2 and all(is_runtime_default(c) for c in builds)
    assert {t.candidate.key for t in result.runtime_defaults} == {c.key for c in builds}
    assert {t.reason for t in _unmeasured(result)} == {"not measured: the search's time budget (1 s) was spent"}


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("20m", 1200), ("1.5h", 5400), (" 2M ", 120)])
def test_durations(text, seconds):
    from cuvil_pgc.cli import recompile as cli_recompile

    assert cli_recompile._duration(text, "--time-budget") == seconds


@pytest.mark.parametrize(("seconds", "text"), [(150, "150 s"), (1200, "20 min"), (5400, "90 min"), (7200, "2 h"),
                                               (0.5, "0.5 s")])
def test_duration_text(seconds, text):
    assert search_policy.duration_text(seconds) == text


@pytest.mark.parametrize("text", ["0", "-5m", "soon", "5 minutes", "1e3"])
def test_a_duration_that_is_not_one_is_refused_before_anything_runs(text, capsys):
    with pytest.raises(SystemExit) as done:
        main(["recompile", "nope.trace.json", "--model", "cuvil_pgc.zoo:mlp", "--time-budget", text])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 1 and len(err) == 1 and "--time-budget" in err[0] and "not a positive duration" in err[0]


def test_recompile_refuses_a_budget_that_is_not_positive():
    from cuvil_pgc.errors import RecompileError
    from cuvil_pgc.recompile.build import recompile

    model, inputs = mlp()
    with pytest.raises(RecompileError, match="time_budget=0"):
        recompile(model, inputs, time_budget=0)
