"""The C accelerator of regions (_fastregion.c) against the pure-Python regions it replaces.

The same scenario runs in two processes, one with ``CUVIL_PGC_PURE_PYTHON=1``, on a deterministic
clock; their traces' region events must be identical byte for byte in every field.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from cuvil_pgc import ProfileRegion, profile
from cuvil_pgc.instrument import region
from tests._regionlines import with_paths

needs_accel = pytest.mark.skipif(not region.ACCELERATED, reason="the C accelerator is not built")

SCENARIO = textwrap.dedent("""
    import asyncio, contextvars, sys, threading
    from cuvil_pgc import ProfileRegion, profile
    from cuvil_pgc.instrument import region

    # durations that exercise every way of writing microseconds: whole, one to three decimals
    steps = iter([1, 10, 100, 999, 1000, 1500, 1230, 123_456_789, 7, 1_000_001, 50] * 10_000)
    state = {"t": 0}
    def tick():
        state["t"] += next(steps)
        return state["t"]

    @ProfileRegion("decorated", kind="fn")
    def work(i):
        with ProfileRegion("inner", i=i, ok=True, ratio=0.5, note="\\u00e9\\"q", none=None):
            pass

    async def task(k):
        with ProfileRegion(f"task{k}"):
            with ProfileRegion("leaf"):
                await asyncio.sleep(0)

    async def tasks():
        await asyncio.gather(*(task(k) for k in range(3)))

    with profile(sys.argv[1], sample_hz=0, gpu="off", ops=False, compile=False, **eval(sys.argv[2])) as s:
        state["t"] = s.clock.start_mono_ns + 1_000_000        # every ts known to the ns
        region._now = tick
        region._configure_accel()                             # C regions read the clock here
        for i in range(30):
            with ProfileRegion("outer", step=i):
                work(i)
                r = ProfileRegion("manual").start()
                with ProfileRegion("nested"):
                    pass
                r.end()
        asyncio.run(tasks())
        with ProfileRegion("host"):                 # copied contexts and a region ended elsewhere
            contextvars.copy_context().run(work, 7)
            crossing = ProfileRegion("crossing").start()

            async def ender():
                with ProfileRegion("in_task"):
                    crossing.end()
            asyncio.run(ender())
        with ProfileRegion("after"):
            pass
        t = threading.Thread(target=work, args=(99,), name="side")
        t.start(); t.join()
""")


def _run(tmp_path, pure: bool, options: str) -> tuple[list[dict], list[str]]:
    script = tmp_path / "scenario.py"
    script.write_text(SCENARIO)
    out = tmp_path / f"{'pure' if pure else 'accel'}.trace.json"
    env = {k: v for k, v in os.environ.items() if k != "CUVIL_PGC_PURE_PYTHON"}
    if pure:
        env["CUVIL_PGC_PURE_PYTHON"] = "1"
    subprocess.run([sys.executable, str(script), str(out), options], check=True, env=env, timeout=120)
    text = out.read_text()
    events = json.loads(text)["traceEvents"]
    # pids and tids differ between processes; everything else must not, down to the bytes
    lines = [re.sub(r'"pid":\d+,"tid":\d+', "", line) for line in text.splitlines()
             if '"cat":"region"' in line or '"name":"cuvil_region"' in line]
    return [{k: v for k, v in e.items() if k not in ("pid", "tid")} for e in with_paths(events)], lines


@needs_accel
@pytest.mark.parametrize("options", ["{}", "{'sample_every': 3}", "{'filter': r'outer/decorated'}"])
def test_c_regions_write_what_python_regions_write(tmp_path, options):
    (accel, accel_lines), (pure, pure_lines) = _run(tmp_path, False, options), _run(tmp_path, True, options)
    assert accel and len(accel) == len(pure)
    assert accel == pure
    assert accel_lines == pure_lines
    if options == "{}":
        durations = {e["dur"] for e in accel}
        assert {0.001, 0.01, 0.1, 0.999, 1.0, 1.5, 1.23, 123456.789} <= durations   # every decimal form
        paths = {e["args"]["path"] for e in accel}
        # in_task outlives crossing (ended inside it, from the task): it is handed to host
        assert {"outer/decorated/inner", "outer/manual/nested", "task1/leaf", "decorated/inner",
                "host/decorated/inner", "host/in_task", "after"} <= paths


def test_accelerator_is_built_where_a_compiler_is():
    """The install builds the extension when it can; losing it silently would cost 10x per region."""
    if not (shutil.which("cc") or shutil.which("gcc")) or os.environ.get("CUVIL_PGC_PURE_PYTHON"):
        pytest.skip("no C compiler here, or pure Python forced")
    assert region.ACCELERATED, "pip install -e . did not build cuvil_pgc/instrument/_fastregion.c"


@needs_accel
def test_frames_index_like_the_python_frames(tmp_path):
    seen = []

    class Sink:
        def record(self, frame, end_ns):
            seen.append((frame, end_ns))

    sink = Sink()
    region.attach(sink)
    try:
        with ProfileRegion("a") as outer:
            with ProfileRegion("b"):
                inner = region.current_frame()
                assert inner[0].name == "b" and inner[1][0] is outer and inner[5] is None
    finally:
        region.detach(sink)
    frame, end = seen[0]
    assert len(frame) == 6 and frame[5] == end and frame[2] <= end and frame[3] is None
    assert region.frame_path(frame) == "a/b"
    assert frame[4] == "a/b" and frame[1][4] == "a"        # cached on the frame and its ancestors
    frame[3] = 7
    assert frame[3] == 7
    frame[4] = "x"
    assert frame[4] == "x"
    with pytest.raises(TypeError):
        frame[2] = 5
    with pytest.raises(IndexError):
        frame[6]


@needs_accel
def test_plain_regions_cost_the_garbage_collector_nothing():
    assert not gc.is_tracked(ProfileRegion("a"))
    assert not gc.is_tracked(ProfileRegion("a", k=1))

    class Tagged(ProfileRegion):        # adds a __dict__: could hold a cycle, so it is tracked
        pass

    assert gc.is_tracked(Tagged("b"))


def test_a_failing_sampling_policy_keeps_the_region(tmp_path):
    kept = []

    class Sink:
        def record(self, frame, end_ns):
            kept.append(frame[0].name)

    def policy(_region):
        raise RuntimeError("broken policy")

    region.set_sampling(policy)
    region.attach(sink := Sink())
    try:
        with ProfileRegion("root"):
            with ProfileRegion("child"):
                pass
    finally:
        region.detach(sink)
        region.set_sampling(None)
    assert kept == ["child", "root"]


def test_bad_region_arguments_raise_in_both_implementations(tmp_path):
    from cuvil_pgc.errors import RegionError

    for args, kwargs in ((("",), {}), ((3,), {}), (("a",), {"path": "x"}), (("a",), {"v": [1]}), ((), {})):
        with pytest.raises((RegionError, TypeError)):
            ProfileRegion(*args, **kwargs)


def test_a_full_buffer_drops_and_counts_in_c(tmp_path):
    path = tmp_path / "d.trace.json"
    with profile(path, sample_hz=0, gpu="off", ops=False, compile=False, buffer_events=10,
                 flush_interval_s=1.0):
        for _ in range(100):
            with ProfileRegion("r"):
                pass
    doc = json.loads(path.read_text())
    written = sum(1 for e in doc["traceEvents"] if e.get("cat") == "region")
    assert written == 10 and doc["cuvil"]["dropped"]["regions"] == 90


def test_a_region_that_cannot_be_written_is_counted_not_raised(tmp_path):
    class Broken(ProfileRegion):
        __slots__ = ()

    path = tmp_path / "b.trace.json"
    with profile(path, sample_hz=0, gpu="off", ops=False, compile=False):
        bad = Broken.__new__(Broken)      # never initialised: no name
        with bad:
            pass
        with ProfileRegion("good"):
            pass
    doc = json.loads(path.read_text())
    names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "region"]
    dropped = doc["cuvil"]["dropped"]["regions"]
    assert dropped >= 1 and dropped + len(names) == 2      # counted, not raised, not silently lost


@needs_accel
def test_cursors_of_finished_tasks_are_freed(tmp_path):
    import asyncio

    cursor_type = region._accel.Cursor

    async def one():
        with ProfileRegion("task"):
            await asyncio.sleep(0)

    async def many():
        await asyncio.gather(*(one() for _ in range(2000)))

    with profile(tmp_path / "c.trace.json", sample_hz=0, gpu="off", ops=False, compile=False):
        asyncio.run(many())
    gc.collect()
    alive = sum(1 for o in gc.get_objects() if type(o) is cursor_type)
    assert alive < 10          # one per live context, not one per finished task
