"""Reading schema-2 region events: paths rebuilt from ids, declarations, and files that lie."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil_pgc.errors import TraceError
from cuvil_pgc.trace import load_trace
from cuvil_pgc.trace._region_tree import TreeProblems, paths_by_id
from cuvil_pgc.trace.schema import Kind


def _x(name, rid, parent, ts=0.0, dur=1.0):
    return {"ph": "X", "cat": "region", "pid": 1, "tid": 1, "name": name, "ts": ts, "dur": dur,
            "args": {"id": rid, "parent": parent}}


def _decl(name, rid, parent):
    return {"ph": "M", "name": "cuvil_region", "pid": 1, "tid": 1, "args": {"name": name, "id": rid, "parent": parent}}


def _paths(tmp_path, events):
    head = {"ph": "M", "name": "cuvil_session", "pid": 1, "tid": 0, "args": {"schema_version": 2, "pid": 1}}
    path = tmp_path / "t.trace.json"
    path.write_text(json.dumps({"traceEvents": [head, *events], "cuvil": {"schema_version": 2}}))
    trace = load_trace(path)
    rows = trace.of_kind(Kind.REGION).tolist()
    return {trace.strings[trace.name[r]]: trace.strings[trace.region[r]] for r in rows}, trace.sources[0].notes


def test_paths_come_from_ids_and_declarations(tmp_path):
    paths, notes = _paths(tmp_path, [_decl("serve", 7, None), _decl("step", 5, 7), _x("leaf", 3, 5, 1.0, 0.5),
                                     _x("step", 5, 7, 0.5, 2.0)])
    assert paths == {"leaf": "serve/step/leaf", "step": "serve/step"} and notes == []


def test_unknown_parents_and_cycles_start_paths_at_the_region(tmp_path):
    paths, notes = _paths(tmp_path, [_x("orphan", 1, 99), _x("a", 2, 3), _x("b", 3, 2)])
    assert paths["orphan"] == "orphan"
    assert paths["b"] == "b" and paths["a"] == "b/a"          # the cycle is cut where it closes
    assert any("parent the file does not hold" in n for n in notes)
    assert any("their own ancestors" in n for n in notes)


def test_a_chain_deeper_than_the_recursion_limit_resolves():
    n = 5_000
    table = {i: ("r", i - 1 if i > 1 else None) for i in range(1, n + 1)}
    paths = paths_by_id(table)
    assert paths[1] == "r" and paths[n].count("/") == n - 1


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.integers(0, 30), st.tuples(st.sampled_from(["a", "b"]), st.none() | st.integers(0, 40))))
def test_any_table_resolves_every_id(table):
    problems = TreeProblems()
    paths = paths_by_id(table, problems)
    assert set(paths) == set(table)
    for i, (name, parent) in table.items():
        assert paths[i].endswith(name)
        if parent in paths and paths[i] != name:
            assert paths[i] == f"{paths[parent]}/{name}" or problems.cycles


def _op(name, region_id, ts, **args):
    return {"ph": "X", "cat": "cpu_op", "pid": 1, "tid": 1, "name": name, "ts": ts, "dur": 0.1,
            "args": {"region_id": region_id, **args}}


def _ops(tmp_path, events):
    _, notes = _paths(tmp_path, events)
    trace = load_trace(tmp_path / "t.trace.json")
    rows = trace.of_kind(Kind.CPU_OP).tolist()
    return {trace.strings[trace.name[r]]: trace.string(int(trace.region[r])) for r in rows}, trace, notes


def test_ops_name_their_region_by_id(tmp_path):
    # "serve" is only declared (open when the ops were written); "later" ends after "step" and
    # holds "late" in time, but "late" names "step": the id wins over time nesting, as a path did.
    events = [_decl("serve", 7, None), _x("step", 5, 7, 0.0, 1.0), _op("mm", 5, 0.5, flops=8, shapes=[[2]]),
              _op("add", 7, 2.0), _x("later", 6, 7, 3.0, 2.0), _op("late", 5, 3.5), _op("free", None, 4.0)]
    ops, trace, notes = _ops(tmp_path, events)
    assert ops == {"mm": "serve/step", "add": "serve", "late": "serve/step", "free": "serve/later"}
    assert notes == []
    mm = trace.of_kind(Kind.CPU_OP).tolist()[0]
    assert trace.args[mm] == {"shapes": [[2]]} and trace.flops[mm] == 8    # region_id is no user arg


def test_an_op_naming_an_unknown_region_id_falls_back_to_time_nesting(tmp_path):
    ops, _, notes = _ops(tmp_path, [_x("step", 1, None, 0.0, 1.0), _op("mm", 99, 0.5), _op("out", 99, 5.0)])
    assert ops == {"mm": "step", "out": None}
    assert any("2 event(s) name a region id the file does not hold" in n for n in notes)


def test_a_region_id_that_is_no_integer_is_a_clear_error(tmp_path):
    with pytest.raises(TraceError, match="args.region_id must be an integer or null, got str"):
        _ops(tmp_path, [_x("step", 1, None), _op("mm", "step", 0.5)])
