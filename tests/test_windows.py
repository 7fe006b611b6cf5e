"""Schedules, capture windows, retention, sampling and record filters."""

from __future__ import annotations

import json
import os
import time

import pytest

import cuvil_pgc
from cuvil_pgc import ProfileRegion, profile
from cuvil_pgc.errors import ConfigError
from cuvil_pgc.instrument.schedule import Action, schedule
from tests._regionlines import with_paths

_QUIET = dict(ops=False, compile=False, sample_hz=0, gpu="off")


def _region_events(path):
    doc = json.loads(open(path, encoding="utf-8").read())
    return with_paths(doc["traceEvents"]), doc["cuvil"]


def test_schedule_matches_torch_profiler():
    torch_profiler = pytest.importorskip("torch.profiler")
    for kw in (dict(wait=1, warmup=1, active=2, repeat=2, skip_first=1), dict(wait=0, warmup=0, active=1),
               dict(wait=3, warmup=2, active=3, repeat=0, skip_first=2)):
        ours, theirs = schedule(**kw), torch_profiler.schedule(**kw)
        assert [ours(i).name for i in range(30)] == [theirs(i).name for i in range(30)]


def test_schedule_rejects_bad_values():
    with pytest.raises(ConfigError):
        schedule(active=0)
    with pytest.raises(ConfigError):
        schedule(wait=-1)


def test_windows_write_one_file_each_with_the_right_steps(tmp_path):
    ready = []
    with profile(tmp_path / "run.trace.json", schedule=cuvil_pgc.schedule(wait=1, warmup=1, active=2, repeat=2),
                 on_trace_ready=ready.append, **_QUIET) as session:
        for step in range(10):
            with ProfileRegion("step", n=step):
                pass
            session.step()
    assert ready == [str(tmp_path / "run.0.trace.json"), str(tmp_path / "run.1.trace.json")]
    assert not os.path.exists(tmp_path / "run.2.trace.json")
    steps = [sorted(e["args"]["n"] for e in _region_events(p)[0]) for p in ready]
    # cycle of 4: wait (0), warmup (1), record (2, 3) ; wait (4), warmup (5), record (6, 7)
    assert steps == [[2, 3], [6, 7]]


def test_retention_removes_oldest_never_the_newest(tmp_path):
    with profile(tmp_path / "r.trace.json", schedule=schedule(active=1), max_files=2, **_QUIET) as session:
        for step in range(5):
            with ProfileRegion("s", n=step):
                pass
            session.step()
    # active=1: every step is a window; the window opened by the last step() is finished by stop().
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["r.4.trace.json", "r.5.trace.json"]
    assert [os.path.basename(p) for p in session.removed] == [f"r.{i}.trace.json" for i in range(4)]


def test_retention_by_bytes_keeps_the_file_being_written(tmp_path):
    with profile(tmp_path / "b.trace.json", schedule=schedule(active=1), max_bytes=1, **_QUIET) as session:
        for _ in range(3):
            with ProfileRegion("s"):
                pass
            session.step()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.3.trace.json"]


def test_window_options_need_a_schedule(tmp_path):
    with pytest.raises(ConfigError, match="schedule"):
        profile(tmp_path / "x.trace.json", max_files=3)


def test_failing_callback_does_not_stop_the_loop(tmp_path):
    def boom(path):
        raise RuntimeError("user callback bug")

    with profile(tmp_path / "c.trace.json", schedule=schedule(active=1), on_trace_ready=boom, **_QUIET) as session:
        for _ in range(2):
            session.step()
    assert len(session.paths) == 3   # two steps, plus the window the last step opened


def _steady_work(n):
    for _ in range(n):
        with ProfileRegion("request"):
            with ProfileRegion("inner"):
                pass


@pytest.fixture
def steady_clock(monkeypatch):
    """A fake region clock: every reading is 1 µs after the previous one, so every call of a region
    takes exactly as long as every other (a perfectly steady workload)."""
    from cuvil_pgc.instrument import region

    state = {"t": time.perf_counter_ns() + 60_000_000_000}   # after any session start

    def tick():
        state["t"] += 1000
        return state["t"]

    monkeypatch.setattr(region, "_now", tick)


@pytest.mark.parametrize("option", [{"sample_every": 10}, {"sample_rate": 0.2}])
def test_sampled_totals_match_the_full_run(tmp_path, option, steady_clock):
    import random

    from cuvil_pgc.analyze import analyze
    from cuvil_pgc.trace import load_trace

    random.seed(1234)
    n = 20_000
    with profile(tmp_path / "full.trace.json", **_QUIET):
        _steady_work(n)
    with profile(tmp_path / "sampled.trace.json", **option, **_QUIET):
        _steady_work(n)
    events, meta = _region_events(tmp_path / "sampled.trace.json")
    assert meta["sampling"]["scale"] == pytest.approx(option.get("sample_every") or 1 / option["sample_rate"])
    assert len(events) < 2 * n * 0.25                       # most calls were not recorded
    ids = {e["args"]["id"] for e in events}
    assert all(e["args"]["parent"] in ids for e in events if e["name"] == "inner")   # whole subtrees
    full = {r.path: r for r in analyze(load_trace(tmp_path / "full.trace.json")).regions}
    sampled = {r.path: r for r in analyze(load_trace(tmp_path / "sampled.trace.json")).regions}
    for path in ("request", "request/inner"):
        assert full[path].calls == n
        assert sampled[path].calls == pytest.approx(n, rel=0.05)
        assert sampled[path].total_us == pytest.approx(full[path].total_us, rel=0.05)
        assert sampled[path].mean_us == pytest.approx(full[path].mean_us, rel=0.01)


def test_filter_keeps_matching_regions_only(tmp_path):
    with profile(tmp_path / "f.trace.json", filter=r"^serve/decode", **_QUIET):
        with ProfileRegion("serve"):
            with ProfileRegion("decode"):
                with ProfileRegion("attention"):
                    pass
            with ProfileRegion("encode"):
                pass
    events, meta = _region_events(tmp_path / "f.trace.json")
    assert sorted(e["args"]["path"] for e in events) == ["serve/decode", "serve/decode/attention"]
    assert meta["config"]["filter"] == r"^serve/decode"


def test_bad_filter_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="regular expression"):
        profile(tmp_path / "x.trace.json", filter="(", **_QUIET)


def test_action_enum_values():
    assert {a.value for a in Action} == {"none", "warmup", "record", "record_and_save"}
