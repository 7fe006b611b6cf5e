"""A native fault of a runtime ends the searching process without an exception to catch (OpenVINO's
CPU plugin died with SIGFPE compiling a Gemma 2 at bf16; an AOTInductor package at sizes its export
did not hold). The candidate being built is recorded as started first, so the next search of the
model rejects it with the reason and goes on, instead of dying on it again."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile import search as search_mod
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.records import STARTED, UNFINISHED, RecordDB
from cuvil_pgc.recompile.search_records import ENDED_PROCESS, ENDED_RACE, ENDED_TIMING, SearchRecords
from cuvil_pgc.recompile.trials import SearchOptions

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="needs onnxruntime")

# a search whose builds are faked at realize(): the Nth build dies of SIGSEGV, as a runtime's native
# fault ends the process; those before it build (as eager, timed at half eager's time, so that the
# search's best is never eager itself), those after fail with a Python exception
SEARCH = """
import json, os, signal, sys, time
import torch
from torch import nn
from cuvil_pgc.cli._terminate import terminated_as_exit
from cuvil_pgc.recompile import checked_build, plan
from cuvil_pgc.recompile import search as search_mod
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.records import RecordDB
from cuvil_pgc.recompile.trials import SearchOptions

dies, records, how = int(sys.argv[1]), sys.argv[2], getattr(signal, sys.argv[3])
# the candidate whose timing ends the process; "again": any program's second timing (the incumbent's)
dies_timed = sys.argv[4] if len(sys.argv) > 4 and sys.argv[4] != "-" else None
# the plan whose timing in the final race ends the process (the final race rebuilds every plan as eager)
dies_raced = sys.argv[5] if len(sys.argv) > 5 else None
built, timings, raced, real, real_time = [], [], [], checked_build.realize, search_mod.time_interleaved
QUICK = {"settle_s": 0.0, "rounds": 5}     # timings only order the fakes here: no settling, few rounds

def realize(module, cand, *args, **kwargs):
    built.append(cand.key)
    if len(built) == dies:
        print(json.dumps({"dying": cand.key, "built": built[:-1]}), flush=True)
        os.kill(os.getpid(), how)
        time.sleep(60)
    if len(built) < dies:
        return real(module, Candidate(cand.scope), *args, **kwargs)
    raise RuntimeError("not built in this test")

def time_interleaved(contenders, **kwargs):
    again = [k for k in contenders if k != "eager" and any(k in t for t in timings)]
    timings.append(sorted(contenders))
    dying = again[0] if dies_timed == "again" and again else dies_timed
    if dying in contenders:
        print(json.dumps({"dying": dying, "timed": sorted(contenders), "built": built}), flush=True)
        os.kill(os.getpid(), how)
        time.sleep(60)
    samples = real_time(contenders, **{**kwargs, **QUICK})
    for key, timed in samples.items():     # every build is eager's: at half its time, each beats eager
        if key != "eager":
            timed.seconds = [t / 2 for t in timed.seconds]
    return samples

def race(contenders, **kwargs):
    raced.append(sorted(contenders))
    if dies_raced in contenders:
        print(json.dumps({"dying": dies_raced, "raced": raced}), flush=True)
        os.kill(os.getpid(), how)
        time.sleep(60)
    return real_time(contenders, **{**kwargs, **QUICK})

checked_build.realize, search_mod.time_interleaved, plan.time_interleaved = realize, time_interleaved, race
plan.realize = lambda module, cand, *args, **kwargs: real(module, Candidate(cand.scope), *args, **kwargs)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
options = SearchOptions(budget=4, backends=("ort", "openvino"), rounds=3, deployed_race=False)
with terminated_as_exit():          # as `cuvil-pgc recompile` runs the search
    result = search_mod.search(model, (torch.randn(2, 16),), None, options=options, records=RecordDB(records),
                               machine_key="m")
print(json.dumps({"built": built, "timings": timings, "raced": raced, "final": sorted(result.final_medians_us),
                  "trials": {k: [t.status, t.reason, t.reused] for k, t in result.trials.items()}}))
"""


def _search_process(tmp_path, dies: int, how: str = "SIGSEGV", dies_timed: str | None = None,
                    dies_raced: str | None = None) -> subprocess.CompletedProcess:
    script = tmp_path / "search.py"
    script.write_text(SEARCH)
    env = {**os.environ, "CUVIL_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run([sys.executable, str(script), str(dies), str(tmp_path / "records"), how,
                           dies_timed or "-", *([dies_raced] if dies_raced else [])],
                          capture_output=True, text=True, timeout=300, env=env, check=False)


@needs_ort
@pytest.mark.skipif(not runtimes.check("openvino").ok, reason="needs openvino")
@pytest.mark.slow
def test_a_candidate_that_ended_the_search_s_process_is_rejected_by_the_next_search(tmp_path):
    """The whole model on each runtime at its defaults is the first batch: the second dies, and the
    first, built and checked before it, is not blamed."""
    first = _search_process(tmp_path, 2)
    assert first.returncode == -signal.SIGSEGV, first.stderr[-2000:]
    crash = json.loads(first.stdout.splitlines()[-1])
    dead, (innocent,) = crash["dying"], crash["built"]

    second = _search_process(tmp_path, 0)
    assert second.returncode == 0, second.stderr[-2000:]
    report = json.loads(second.stdout.splitlines()[-1])
    assert dead not in report["built"] and report["built"][0] == innocent, report
    assert report["trials"][dead] == ["compile_error", ENDED_PROCESS, True]
    assert f"cuvil-pgc: {dead} is left out: {ENDED_PROCESS}" in second.stderr
    others = [v for k, v in report["trials"].items() if k in report["built"]]
    assert others and all(v[:2] == ["compile_error", "RuntimeError: not built in this test"] for v in others)

    third = _search_process(tmp_path, 0)        # left out again, and said once, not at every search
    report = json.loads(third.stdout.splitlines()[-1])
    assert report["trials"][dead] == ["compile_error", ENDED_PROCESS, True] and "is left out" not in third.stderr


@needs_ort
@pytest.mark.skipif(not runtimes.check("openvino").ok, reason="needs openvino")
@pytest.mark.slow
def test_a_candidate_that_ended_the_process_while_timed_is_found_by_timing_each_alone(tmp_path):
    """The runtimes' defaults are built (as eager here) and timed side by side; OpenVINO's timing
    ends the process. Which one did is not known: the next search times each alone, and the one
    that ends it again is left out by the search after, which reuses the others' times."""
    dying = "<model>::openvino"
    first = _search_process(tmp_path, 99, dies_timed=dying)
    assert first.returncode == -signal.SIGSEGV, first.stderr[-2000:]
    batch = json.loads(first.stdout.splitlines()[-1])["timed"]
    assert dying in batch and "<model>::ort" in batch

    second = _search_process(tmp_path, 99, dies_timed=dying)     # each alone: ort's time is recorded first
    assert second.returncode == -signal.SIGSEGV, second.stderr[-2000:]
    # the suspect alone: beside eager, not beside the incumbent (ort, timed alone before it)
    assert json.loads(second.stdout.splitlines()[-1])["timed"] == [dying, "eager"]

    third = _search_process(tmp_path, 99, dies_timed=dying)
    assert third.returncode == 0, third.stderr[-2000:]
    report = json.loads(third.stdout.splitlines()[-1])
    assert report["trials"][dying] == ["compile_error", ENDED_TIMING, True]
    assert report["trials"]["<model>::ort"][0] == "ok" and report["trials"]["<model>::ort"][2] is True
    assert f"cuvil-pgc: {dying} is left out: {ENDED_TIMING}" in third.stderr


@needs_ort
@pytest.mark.skipif(not runtimes.check("openvino").ok, reason="needs openvino")
@pytest.mark.slow
def test_a_fault_while_the_incumbent_is_timed_beside_a_batch_is_not_blamed_on_the_batch(tmp_path):
    """The incumbent (the faster runtime default) was timed once without a fault; the process ends
    while it is timed again beside the next batch. It may be the incumbent's fault: the next search
    measures it again, alone, and each of the batch's candidates alone, instead of reusing the
    incumbent's time and leaving out the batch's."""
    first = _search_process(tmp_path, 99, dies_timed="again")
    assert first.returncode == -signal.SIGSEGV, first.stderr[-2000:]
    crash = json.loads(first.stdout.splitlines()[-1])
    incumbent, batch = crash["dying"], [k for k in crash["timed"] if k not in (crash["dying"], "eager")]
    assert incumbent.startswith("<model>::") and batch, crash

    second = _search_process(tmp_path, 99)
    assert second.returncode == 0, second.stderr[-2000:]
    report = json.loads(second.stdout.splitlines()[-1])
    assert report["trials"][incumbent] == ["ok", "", False], report           # measured again, not reused
    assert sorted([incumbent, "eager"]) in report["timings"], report["timings"]    # alone
    for key in batch:      # not blamed; measured alone if the budget reached it
        status, _, reused = report["trials"][key]
        assert status in ("ok", "not_measured") and not reused, (key, report)
        assert status != "ok" or sorted([key, "eager"]) in report["timings"], (key, report["timings"])
    assert "is left out" not in second.stderr


@needs_ort
@pytest.mark.slow
def test_a_search_without_a_fault_leaves_every_measurement_to_the_next(tmp_path):
    """The incumbent's record, journaled while it is timed beside later batches, is its
    measurement again once they are timed: the next search builds none of what the first measured."""
    first = _search_process(tmp_path, 99)
    assert first.returncode == 0, first.stderr[-2000:]
    report = json.loads(first.stdout.splitlines()[-1])
    assert any(len(t) > 2 for t in report["timings"][2:]), report["timings"]    # a later batch, beside the incumbent
    second = _search_process(tmp_path, 99)
    assert second.returncode == 0, second.stderr[-2000:]
    assert not set(json.loads(second.stdout.splitlines()[-1])["built"]) & set(report["built"])


@needs_ort
@pytest.mark.skipif(not runtimes.check("openvino").ok, reason="needs openvino")
@pytest.mark.slow
def test_a_plan_that_ended_the_process_in_the_final_race_is_found_by_racing_each_apart(tmp_path):
    """The final race rebuilds the plans (every runtime's default among them) and times them side
    by side; OpenVINO's plan ends the process there. Which plan did is not known: the next search
    rebuilds and times each apart, beside eager only, and the search after leaves OpenVINO's out
    and ships one of the others, as the searches after it do."""
    dying = "<model>::openvino"
    first = _search_process(tmp_path, 99, dies_raced=dying)
    assert first.returncode == -signal.SIGSEGV, first.stderr[-2000:]
    together = json.loads(first.stdout.splitlines()[-1])["raced"][-1]
    assert dying in together and "<model>::ort" in together, together

    second = _search_process(tmp_path, 99, dies_raced=dying)      # nothing measured again: the race, apart
    assert second.returncode == -signal.SIGSEGV, second.stderr[-2000:]
    crash = json.loads(second.stdout.splitlines()[-1])
    assert crash["raced"][-1] == [dying, "eager"] and all(len(r) == 2 for r in crash["raced"]), crash

    for _ in range(2):        # left out, and said; the others raced apart
        third = _search_process(tmp_path, 99, dies_raced=dying)
        assert third.returncode == 0, third.stderr[-2000:]
        report = json.loads(third.stdout.splitlines()[-1])
        assert report["raced"] and all(len(r) == 2 and dying not in r for r in report["raced"]), report["raced"]
        assert ["<model>::ort", "eager"] in report["raced"], report["raced"]
        assert report["final"] and dying not in report["final"], report
        assert f"cuvil-pgc: plan {dying} is left out: {ENDED_RACE}" in third.stderr
        assert not report["built"], report       # every measurement was reused


@needs_ort
@pytest.mark.slow
def test_a_search_ended_by_sigterm_leaves_its_candidate_to_the_next_search(tmp_path):
    """SIGTERM (a `timeout`, a CI job's cancel) is no fault of the candidate being built: under
    `cuvil-pgc recompile` it ends the search through Python, as Ctrl-C does."""
    first = _search_process(tmp_path, 1, "SIGTERM")
    assert first.returncode == 128 + signal.SIGTERM, first.stderr[-2000:]
    stopped = json.loads(first.stdout.splitlines()[-1])["dying"]
    second = _search_process(tmp_path, 0)
    report = json.loads(second.stdout.splitlines()[-1])
    assert report["built"][0] == stopped and report["trials"][stopped][1] != ENDED_PROCESS, report


@pytest.fixture
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


def _search(tmp_path, realize):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    options = SearchOptions(budget=4, backends=("ort",), rounds=3, deployed_race=False)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("cuvil_pgc.recompile.checked_build.realize", realize)
        return search_mod.search(model, (torch.randn(2, 16),), None, options=options,
                                 records=RecordDB(tmp_path / "records"), machine_key="m")


@needs_ort
@pytest.mark.usefixtures("_cache")
def test_an_interrupted_search_leaves_its_candidates_to_the_next_one(tmp_path):
    """An interrupt (or the search's own error) is no fault of the candidate being built: the next
    search builds it."""
    built: list[str] = []

    def interrupted(module, cand, *args, **kwargs):
        built.append(cand.key)
        raise KeyboardInterrupt

    def failing(module, cand, *args, **kwargs):
        built.append(cand.key)
        raise RuntimeError("not built in this test")

    with pytest.raises(KeyboardInterrupt):
        _search(tmp_path, interrupted)
    (first,) = built
    # left unfinished, not started: a search in a later process (this one's ended) would take it for a crash
    assert [r.status for r in RecordDB(tmp_path / "records")] == [UNFINISHED]
    result = _search(tmp_path, failing)
    assert built[1] == first and result.trials[first].status == "compile_error" and not result.trials[first].reused


def test_a_started_record_of_a_running_process_is_not_taken_for_a_crash(tmp_path):
    """Two searches of one model at once: the candidate the other is building now is measured here
    too, not rejected; once its process has ended without its record, it is rejected."""
    cand = Candidate("", "ort")
    scope_inputs = {"": SimpleNamespace(signature="2x16")}

    def view(db):
        return SearchRecords(db, "m", {"": "s"}, {"": "t"}, {"": "w"}, scope_inputs)

    view(RecordDB(tmp_path)).started(cand)         # by this process, which runs
    assert view(RecordDB(tmp_path)).reusable(cand) is None
    _started_by_an_ended_process(RecordDB(tmp_path))
    again = view(RecordDB(tmp_path)).reusable(cand)
    assert again is not None and (again.status, again.reason) == ("compile_error", ENDED_PROCESS)


def test_a_final_race_is_raced_apart_once_one_ended_its_process_and_not_before(tmp_path):
    """The final race's mark: a race this running process started, or one that ended, is no crash;
    one that an ended process left started makes this and every later race of the model on this
    machine race apart; a plan is left out only if its own part of such a race ended a process."""
    plan = {"": Candidate("", "ort")}

    def view():
        return SearchRecords(RecordDB(tmp_path), "m", {"": "s"}, {"": "t"}, {"": "w"}, {"": SimpleNamespace(signature="2x16")})

    view().race_started()
    assert not view().races_apart()            # this process, still running
    view().race_done(apart=False)
    assert not view().races_apart()
    view().race_started()
    _started_by_an_ended_process(RecordDB(tmp_path))
    assert view().races_apart()
    view().plan_started(plan)
    assert not view().plan_ended(plan)
    _started_by_an_ended_process(RecordDB(tmp_path), candidate="final-race:")
    assert view().plan_ended(plan) and not view().plan_ended({"": Candidate("", "openvino")})
    view().race_done(apart=True)
    assert view().races_apart()                # and at every later search


def _started_by_an_ended_process(db: RecordDB, *, status: str = STARTED, candidate: str = "") -> None:
    """Make the database's records of ``status`` (and a ``candidate`` key starting so) started ones,
    by a process that has ended."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    for rec in [r for r in db if r.status == status and r.candidate.startswith(candidate)]:
        db.add(replace(rec, status=STARTED, features={**rec.features, "pid": int(ended.stdout)}))


def test_a_calibration_probe_that_ended_its_process_is_not_measured_again(tmp_path, monkeypatch, caplog):
    """The calibration runs before every search until each backend's probe is recorded: a probe that
    ended the process would end every recompile on the machine."""
    from cuvil_pgc.recompile import calibrate

    monkeypatch.setattr(calibrate, "PROBE_CONFIGS", (Candidate(""), Candidate("", "aoti")))
    monkeypatch.setattr(calibrate.runtimes, "available", lambda device="cpu": ())
    real, built, fate = calibrate.realize, [], {"aoti": KeyboardInterrupt}

    def realize(module, cand, *args, **kwargs):
        built.append(cand.backend)
        if cand.backend in fate:
            raise fate[cand.backend]
        return real(module, cand, *args, **kwargs)

    monkeypatch.setattr(calibrate, "realize", realize)
    with pytest.raises(KeyboardInterrupt):
        calibrate.calibrate_backends(RecordDB(tmp_path), "m", rounds=3)
    assert [r.status for r in RecordDB(tmp_path)] == [UNFINISHED, UNFINISHED]    # no fault of the probes
    # as a native fault of AOTInductor's build would have left them: started, by a process now ended
    _started_by_an_ended_process(RecordDB(tmp_path), status=UNFINISHED, candidate="aoti")
    built.clear()
    fate["aoti"] = AssertionError("built again")
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.calibrate"):
        assert calibrate.calibrate_backends(RecordDB(tmp_path), "m", rounds=3) == 1 and built == ["eager"]
        assert calibrate.calibrate_backends(RecordDB(tmp_path), "m", rounds=3) == 0 and built == ["eager"]
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith("cuvil-pgc: the aoti backend is not calibrated on this machine: its "
                                                 "probe ended the process of an earlier calibration"), said
