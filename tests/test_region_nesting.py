"""Nesting that user code cannot corrupt, at any depth, in the C and the pure-Python regions.

Generators and async generators interleave regions (``zip(g1, g2)``), a region may end on
another thread than the one that started it, and a region may be left open when a session
stops: none of these may leave a thread's stack pointing at a region that has ended, or at one
from an earlier session. And nesting depth must cost nothing per event: no recursion (the pure
regions used to drop everything below ~1000 levels) and no path per event (the C regions wrote
403 MB at depth 20,000). Each scenario runs in a fresh process per implementation, because the
implementation is chosen when cuvil_pgc is imported.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from cuvil_pgc.instrument import region
from cuvil_pgc.trace import load_trace
from cuvil_pgc.trace.schema import Kind
from tests._regionlines import region_events

IMPLEMENTATIONS = [pytest.param(False, id="c", marks=pytest.mark.skipif(
    not region.ACCELERATED, reason="the C accelerator is not built")), pytest.param(True, id="python")]

PRELUDE = textwrap.dedent("""
    import asyncio, json, os, sys, threading
    from cuvil_pgc import ProfileRegion, profile
    from cuvil_pgc.instrument.region import current_path

    def session(name):
        return profile(os.path.join(sys.argv[1], name), ops=False, gpu="off", sample_hz=0, compile=False)

    seen = {}
""")


def _run(tmp_path, pure: bool, body: str) -> dict:
    script = tmp_path / "scenario.py"
    script.write_text(PRELUDE + textwrap.dedent(body) + "\nprint(json.dumps(seen))\n")
    env = {k: v for k, v in os.environ.items() if k != "CUVIL_PGC_PURE_PYTHON"}
    if pure:
        env["CUVIL_PGC_PURE_PYTHON"] = "1"
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def _paths(path) -> list[str]:
    return [e["args"]["path"] for e in region_events(path)]


def _assert_nested(path) -> None:
    """Every region lies inside its parent: none outlives the region it is recorded under."""
    events = region_events(path)
    by_id = {e["args"]["id"]: e for e in events}
    for e in events:
        parent = by_id.get(e["args"]["parent"])
        if parent is not None:
            assert parent["ts"] <= e["ts"] and e["ts"] + e["dur"] <= parent["ts"] + parent["dur"] + 1e-3, (e, parent)


@pytest.mark.parametrize("pure", IMPLEMENTATIONS)
def test_interleaved_generators_leave_the_stack_whole(tmp_path, pure):
    seen = _run(tmp_path, pure, """
        def gen(n):
            for i in range(n):
                with ProfileRegion("g"):
                    yield i

        with session("zip.trace.json"):
            with ProfileRegion("zipper"):
                for _ in zip(gen(5), gen(5)):
                    pass
                with ProfileRegion("later"):
                    seen["later"] = current_path()
            with ProfileRegion("after"):
                seen["after"] = current_path()
    """)
    assert seen == {"later": "zipper/later", "after": "after"}
    paths = _paths(tmp_path / "zip.trace.json")
    assert sorted(set(paths)) == ["after", "zipper", "zipper/g", "zipper/later"]
    assert paths.count("zipper/g") == 10
    _assert_nested(tmp_path / "zip.trace.json")


@pytest.mark.parametrize("pure", IMPLEMENTATIONS)
def test_interleaved_async_generators_leave_the_stack_whole(tmp_path, pure):
    seen = _run(tmp_path, pure, """
        async def agen(n):
            for i in range(n):
                with ProfileRegion("ag"):
                    await asyncio.sleep(0)
                    yield i

        async def main():
            a, b = agen(4), agen(4)
            for _ in range(4):
                await a.__anext__()
                await b.__anext__()
            for g in (a, b):
                async for _ in g:
                    pass
            with ProfileRegion("later"):
                return current_path()

        with session("async.trace.json"):
            with ProfileRegion("loop"):
                seen["later"] = asyncio.run(main())
    """)
    assert seen == {"later": "loop/later"}
    paths = _paths(tmp_path / "async.trace.json")
    assert sorted(set(paths)) == ["loop", "loop/ag", "loop/later"] and paths.count("loop/ag") == 8
    _assert_nested(tmp_path / "async.trace.json")


@pytest.mark.parametrize("pure", IMPLEMENTATIONS)
def test_a_region_ended_on_another_thread_is_no_parent(tmp_path, pure):
    seen = _run(tmp_path, pure, """
        with session("threads.trace.json"):
            with ProfileRegion("main"):
                crossing = ProfileRegion("crossing").start()
                t = threading.Thread(target=crossing.end)
                t.start(); t.join()
                with ProfileRegion("next"):
                    seen["next"] = current_path()
    """)
    assert seen == {"next": "main/next"}
    assert sorted(_paths(tmp_path / "threads.trace.json")) == ["main", "main/crossing", "main/next"]


@pytest.mark.parametrize("pure", IMPLEMENTATIONS)
def test_a_session_starts_with_a_clean_stack(tmp_path, pure):
    seen = _run(tmp_path, pure, """
        def gen():
            with ProfileRegion("g"):
                yield 1
                yield 2

        with session("first.trace.json"):
            ProfileRegion("left_open").start()          # never ended
            g1, g2 = gen(), gen()
            next(g1); next(g2); next(g1)                # g2's region is on top, g1's below it
        with session("second.trace.json"):
            with ProfileRegion("fresh"):
                seen["fresh"] = current_path()
    """)
    assert seen == {"fresh": "fresh"}
    assert _paths(tmp_path / "second.trace.json") == ["fresh"]


DEEP = """
    depth = int(sys.argv[2]) if len(sys.argv) > 2 else {depth}
    with session("deep.trace.json") as s:
        regions = [ProfileRegion("r").start() for _ in range(depth)]
        seen["inside"] = len(current_path())
        for r in reversed(regions):
            r.end()
    seen["dropped"] = s.dropped
"""


@pytest.mark.parametrize("pure", IMPLEMENTATIONS)
def test_deep_nesting_costs_the_same_per_event(tmp_path, pure):
    depth = 20_000
    seen = _run(tmp_path, pure, DEEP.format(depth=depth))
    assert seen == {"inside": 2 * depth - 1, "dropped": {}}
    path = tmp_path / "deep.trace.json"
    every = path.read_bytes().splitlines()
    lines = [line for line in every if b'"cat":"region"' in line]
    assert len(lines) == depth
    assert max(map(len, lines)) < 200          # each event names its parent, not its path
    # At most one cuvil_region declaration per region besides its event: a region still open when
    # the writer drains its ended children is declared, how many are depends on when drains run.
    declarations = [line for line in every if b'"name":"cuvil_region"' in line]
    assert len(declarations) <= depth and max(map(len, declarations), default=0) < 200
    assert len(every) <= 2 * depth + 16


@pytest.mark.parametrize("pure", IMPLEMENTATIONS)
def test_deep_paths_are_rebuilt_by_the_reader(tmp_path, pure):
    depth = 1500                   # beyond the interpreter's recursion limit
    _run(tmp_path, pure, DEEP.format(depth=depth))
    trace = load_trace(tmp_path / "deep.trace.json")
    rows = trace.of_kind(Kind.REGION)
    paths = {trace.strings[trace.region[r]] for r in rows.tolist()}
    assert paths == {"/".join(["r"] * k) for k in range(1, depth + 1)}


@pytest.mark.parametrize("pure", IMPLEMENTATIONS)
def test_a_region_open_across_capture_windows_is_named_in_each(tmp_path, pure):
    # Always-on aggregation keeps one recording epoch, so "serve" stays the parent of what each
    # capture window records; each window's file must name it, not rely on an earlier file.
    _run(tmp_path, pure, """
        with profile(os.path.join(sys.argv[1], "always.summary.json"), mode="aggregate"):
            with ProfileRegion("serve"):
                for w in range(2):
                    with session(f"window{w}.trace.json"):
                        with ProfileRegion("step"):
                            pass
    """)
    for w in range(2):
        assert _paths(tmp_path / f"window{w}.trace.json") == ["serve/step"]
        trace = load_trace(tmp_path / f"window{w}.trace.json")
        assert [trace.strings[trace.region[r]] for r in trace.of_kind(Kind.REGION).tolist()] == ["serve/step"]


DEEP_OPS = """
    import torch
    x = torch.randn(4, 4)
    with profile(os.path.join(sys.argv[1], "deep.trace.json"), ops=True, gpu="off", sample_hz=0, compile=False):
        regions = [ProfileRegion("r").start() for _ in range({depth} - 1)]
        with ProfileRegion("leaf"):
            torch.neg(x)
        torch.sigmoid(x)           # in the innermost "r", still open until the loop below
        for r in reversed(regions):
            r.end()
"""


@pytest.mark.parametrize("pure", IMPLEMENTATIONS)
def test_ops_deep_inside_regions_cost_the_same_per_event(tmp_path, pure):
    # Ops name their region by id (args.region_id), not by its path: each line stays small at any
    # depth, and the reader still attributes each op to its region's full path.
    depth = 5000
    _run(tmp_path, pure, DEEP_OPS.format(depth=depth))
    path = tmp_path / "deep.trace.json"
    lines = path.read_bytes().splitlines()
    events = [ln for ln in lines if ln.startswith(b'{"ph":') and b'"name":"cuvil_session"' not in ln]
    assert len(events) > depth
    assert sum(b'"cat":"cpu_op"' in ln for ln in events) == 2
    assert max(map(len, events)) < 500
    trace = load_trace(path)
    ops = {trace.strings[trace.name[r]]: trace.strings[trace.region[r]] for r in trace.of_kind(Kind.CPU_OP).tolist()}
    assert ops == {"aten::neg": "/".join(["r"] * (depth - 1) + ["leaf"]), "aten::sigmoid": "/".join(["r"] * (depth - 1))}
