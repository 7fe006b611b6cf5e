"""ProfileRegion: forms of use, nesting, attributes, threads, asyncio and hostile names."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading

import pytest

from cuvil_pgc import ProfileRegion, profile
from cuvil_pgc.errors import RegionError
from cuvil_pgc.instrument.region import current_path
from tests._regionlines import region_events


def _regions(path) -> list[dict]:
    return region_events(path)


def _session(tmp_path, **kw):
    return profile(tmp_path / "t.trace.json", ops=False, compile=False, sample_hz=0, gpu="off", **kw)


def test_with_decorator_and_start_end_forms(tmp_path):
    @ProfileRegion("decorated")
    def work():
        return current_path()

    with _session(tmp_path) as s:
        with ProfileRegion("outer", step=3):
            inner_path = work()
        r = ProfileRegion("manual").start()
        r.end()
    assert inner_path == "outer/decorated"
    events = {e["args"]["path"]: e for e in _regions(s.path)}
    assert set(events) == {"outer", "outer/decorated", "manual"}
    assert events["outer"]["args"]["step"] == 3
    assert events["outer/decorated"]["args"]["parent"] == events["outer"]["args"]["id"]
    assert events["manual"]["args"]["parent"] is None
    outer, inner = events["outer"], events["outer/decorated"]
    assert outer["ts"] <= inner["ts"] and inner["ts"] + inner["dur"] <= outer["ts"] + outer["dur"] + 1e-3


def test_async_decorator_keeps_task_parents(tmp_path):
    @ProfileRegion("step")
    async def step(i):
        await asyncio.sleep(0)
        with ProfileRegion("inner", task=i):
            await asyncio.sleep(0)
            return current_path()

    async def task(i):
        with ProfileRegion(f"task{i}"):
            return await step(i)

    async def main():
        return await asyncio.gather(*(task(i) for i in range(200)))

    with _session(tmp_path) as s:
        paths = asyncio.run(main())
    assert paths == [f"task{i}/step/inner" for i in range(200)]
    events = _regions(s.path)
    by_id = {e["args"]["id"]: e for e in events}
    inner = [e for e in events if e["name"] == "inner"]
    assert len(inner) == 200 and len(events) == 600
    for e in inner:
        step_ev = by_id[e["args"]["parent"]]
        task_ev = by_id[step_ev["args"]["parent"]]
        assert step_ev["name"] == "step"
        assert task_ev["name"] == f"task{e['args']['task']}"


def test_eight_threads_nested_no_loss_parents_correct(tmp_path):
    n = 20_000

    def worker(k):
        for i in range(n // 2):
            with ProfileRegion(f"t{k}"):
                with ProfileRegion("leaf", i=i):
                    pass

    with _session(tmp_path) as s:
        threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    events = _regions(s.path)
    assert len(events) == 8 * n
    doc = json.loads((tmp_path / "t.trace.json").read_text())
    assert doc["cuvil"]["dropped"].get("regions", 0) == 0
    by_id = {e["args"]["id"]: e for e in events}
    assert len(by_id) == len(events)
    for e in events:
        if e["name"] == "leaf":
            parent = by_id[e["args"]["parent"]]
            assert parent["tid"] == e["tid"] and parent["name"].startswith("t")
            assert e["args"]["path"] == f"{parent['name']}/leaf"
        else:
            assert e["args"]["parent"] is None


def test_full_buffer_drops_and_counts(tmp_path):
    with _session(tmp_path, buffer_events=10, flush_interval_s=1.0) as s:
        for _ in range(1000):
            with ProfileRegion("r"):
                pass
    doc = json.loads((tmp_path / "t.trace.json").read_text())
    kept = len(_regions(s.path))
    assert doc["cuvil"]["dropped"]["regions"] == 1000 - kept
    assert kept >= 10


@pytest.mark.parametrize("name", [
    'quote " and \' and \\ backslash',
    "new\nline\ttab\r",
    "</script><script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "x" * 10_240,
    "emoji 🚀🔥 ünïcødé 中文",
    "\x00\x01 control",
])
def test_hostile_names_round_trip(tmp_path, name):
    with _session(tmp_path) as s:
        with ProfileRegion(name, note=name):
            pass
    (event,) = _regions(s.path)
    assert event["name"] == name and event["args"]["path"] == name and event["args"]["note"] == name


@pytest.mark.parametrize("bad", ["lone \ud800 surrogate", "", 42, None, "y" * 70_000])
def test_unusable_names_rejected_at_creation(bad):
    with pytest.raises(RegionError) as info:
        ProfileRegion(bad)
    assert "region name" in str(info.value)


def test_bad_attributes_rejected():
    with pytest.raises(RegionError, match="reserved"):
        ProfileRegion("a", path="x")
    with pytest.raises(RegionError, match="type list"):
        ProfileRegion("a", shape=[1, 2])


def test_no_session_is_inert_and_imports_nothing_heavy():
    code = (
        "import sys\n"
        "from cuvil_pgc import ProfileRegion\n"
        "with ProfileRegion('a'):\n"
        "    pass\n"
        "heavy = [m for m in ('torch', 'numpy', 'cupti', 'pynvml') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_region_exception_still_closes(tmp_path):
    with _session(tmp_path) as s:
        with pytest.raises(KeyError):
            with ProfileRegion("boom"):
                raise KeyError("x")
        assert current_path() is None
    assert [e["name"] for e in _regions(s.path)] == ["boom"]


def test_one_session_at_a_time(tmp_path):
    from cuvil_pgc.errors import SessionError

    with _session(tmp_path):
        with pytest.raises(SessionError, match="already recording"):
            profile(tmp_path / "other.trace.json", ops=False).start()
