"""Indices outside what they index (:mod:`cuvil_pgc.recompile.index_bounds`): eager raises
IndexError; ONNX Runtime reads a negative id from a table's end, OpenVINO answers any index with
numbers, and an AOTInductor package aborts the process. So a region hands such a call to the
original module: ids outside an embedding table, and node ids outside a graph's nodes."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import recompile, runtimes
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.index_bounds import IndexBounds, index_bounds, out_of_range
from cuvil_pgc.recompile.plan_doc import SIZE_BOUNDS_FORMAT
from cuvil_pgc.recompile.program_index_bounds import program_index_bounds
from tests._service import run_service


def _graph(tmp_path, nodes, inputs, tables):
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(name, kind, None) for name, kind in inputs],
        [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, None) for n in nodes if n.op_type == "Gather"],
        initializer=[numpy_helper.from_array(np.zeros(shape, np.float32), name) for name, shape in tables.items()])
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_inputs_that_reach_a_table_through_ops_that_only_move_values_are_bounded_by_its_rows(tmp_path):
    from onnx import TensorProto, helper

    shape = helper.make_node("Constant", [], ["shape"], value=helper.make_tensor("s", TensorProto.INT64, [2], [1, -1]))
    nodes = [
        shape,
        helper.make_node("Reshape", ["ids", "shape"], ["flat"]),
        helper.make_node("Cast", ["flat"], ["flat32"], to=TensorProto.INT32),
        helper.make_node("Gather", ["words", "flat32"], ["w"]),
        helper.make_node("Gather", ["small", "ids"], ["w2"]),           # the same ids into a smaller table
        helper.make_node("Gather", ["types", "kinds"], ["t"]),
        helper.make_node("Add", ["shifted", "one"], ["plus"]),           # values changed on the way: unchecked
        helper.make_node("Gather", ["words", "plus"], ["p"]),
        helper.make_node("Cast", ["mask"], ["maskf"], to=TensorProto.FLOAT),   # a float cast: not an index
        helper.make_node("Gather", ["cols", "pos"], ["c"], axis=1),       # rows of axis 1
    ]
    inputs = [("ids", TensorProto.INT64), ("kinds", TensorProto.INT64), ("shifted", TensorProto.INT64),
              ("mask", TensorProto.INT64), ("pos", TensorProto.INT32), ("one", TensorProto.INT64)]
    path = _graph(tmp_path, nodes, inputs, {"words": (100, 4), "small": (30, 4), "types": (2, 4), "cols": (4, 7)})
    assert index_bounds(path) == IndexBounds({0: 30, 1: 2, 4: 7}, frozenset())     # tables of the model's own


def test_indices_into_a_tensor_of_the_inputs_are_bounded_by_its_size_for_the_captured_sizes(tmp_path):
    """A graph network's ``x[src]`` and ``index_add_(0, dst, ...)`` export as GatherND and ScatterND
    on ``x`` and on a buffer of its rows, their indices a row of the edge list picked with a
    constant index: bounded by the rows, and *sized* (no bound at other sizes)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    const = [helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(v, np.int64), name))
             for name, v in (("zero", 0), ("one", 1), ("axis", [1]))]
    nodes = [*const,
             helper.make_node("Gather", ["edges", "zero"], ["src"]),            # edge_index[0]
             helper.make_node("Gather", ["edges", "one"], ["dst"]),
             helper.make_node("Unsqueeze", ["src", "axis"], ["src1"]),
             helper.make_node("Unsqueeze", ["dst", "axis"], ["dst1"]),
             helper.make_node("GatherND", ["x", "src1"], ["msg"]),
             helper.make_node("ScatterND", ["x", "dst1", "msg"], ["agg"], reduction="add"),
             helper.make_node("GatherND", ["grid", "cells"], ["g"])]             # two axes: the smaller bounds both
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [50, 8]),
                                           helper.make_tensor_value_info("edges", TensorProto.INT64, [2, 200]),
                                           helper.make_tensor_value_info("cells", TensorProto.INT64, [6, 2])],
                              [helper.make_tensor_value_info("agg", TensorProto.FLOAT, [50, 8]),
                               helper.make_tensor_value_info("g", TensorProto.FLOAT, [6])],
                              initializer=[numpy_helper.from_array(np.zeros((9, 4), np.float32), "grid")])
    path = tmp_path / "gnn.onnx"
    onnx.save(helper.make_model(graph), str(path))
    assert index_bounds(path) == IndexBounds({1: 50, 2: 4}, frozenset({1}))


class Graph(nn.Module):
    """Message passing over an edge list, as a fraud or recommendation service's graph network."""

    def __init__(self) -> None:
        super().__init__()
        self.lin, self.out = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        src, dst = edge_index[0], edge_index[1]
        h = torch.relu(self.lin(x))
        return self.out(torch.zeros_like(h).index_add_(0, dst, h[src]) + h)


def test_a_torch_export_program_gives_the_same_bounds():
    torch.manual_seed(0)
    exported = torch.export.export(Graph().eval(), (torch.randn(20, 8), torch.randint(0, 20, (2, 40))))
    assert program_index_bounds(exported) == IndexBounds({1: 20}, frozenset({1}))
    lookup = torch.export.export(Lookup().eval(), (torch.randint(0, 10, (2, 5)), torch.ones(2, 5, dtype=torch.long)))
    assert program_index_bounds(lookup) == IndexBounds({0: 10}, frozenset())


GRAPH_SERVICE = """
import json, sys
import torch
from cuvil_pgc import load_build
from tests.test_index_bounds import Graph

model = Graph().eval()
model.load_state_dict(torch.load(sys.argv[1]))
fast = load_build(sys.argv[2], model, pubkey=sys.argv[3])
x, edges = torch.load(sys.argv[4])
bigger, more_edges = torch.randn(2 * x.shape[0], x.shape[1]), torch.randint(0, 2 * x.shape[0], (2, 60))
good, errors = [], []
with torch.no_grad():
    for nodes, edge_list in ((x, edges), (bigger, more_edges)):      # the captured sizes, and a larger graph
        good.append(float((fast(nodes, edge_list) - model(nodes, edge_list)).abs().max()))
        bad = edge_list.clone()
        bad[1, 7] = nodes.shape[0]                 # a node id one past the graph's nodes
        for run in (model, fast):
            try:
                run(nodes, bad)
                errors.append(None)
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
print(json.dumps({"good": good, "errors": errors, "fallback_calls": fast.fallback_calls,
                  "other_shape_calls": fast.other_shape_calls, "applied": fast.cuvil_load_report.applied,
                  "direct_ids": [[i, rows] for i, _, rows, _ in fast._direct_ids]}))
"""


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
@pytest.mark.parametrize("backend", ["aoti", "openvino", "compile"])
def test_a_node_id_past_the_graph_raises_eagers_error_in_a_service_instead_of_aborting_it(backend, tmp_path, keys,
                                                                                           caplog):
    """Before, AOTInductor's package and torch.compile's program aborted the service process (their
    kernels' index check throws inside OpenMP's threads) and OpenVINO answered with numbers. The
    bound follows the graph's nodes: the program for other sizes checks the edge list against the
    call's own nodes (torch.compile builds no such program)."""
    if backend in runtimes.RUNTIMES and not runtimes.check(backend).ok:
        pytest.skip(f"{backend} not installed")
    torch.manual_seed(0)
    model = Graph().eval()
    x, edges = torch.randn(20, 8), torch.randint(0, 20, (2, 40))
    with caplog.at_level(logging.WARNING):
        build = recompile(model, (x, edges), plan={"": Candidate("", backend)}, records=False, deployed_race=False,
                          rounds=3, dynamic=True)
    assert build.plan.choices[0].runtime["index_bounds"] == {"1": 20}
    assert build.plan.choices[0].runtime["sized_index_inputs"] == [1]
    other = build.module.other_shapes
    if backend == "compile":
        assert other is None
    else:                         # the edge list checked against the rows of x, whatever they are
        assert other.index_bounds == {1: (other.inputs[0][1][0],)} and isinstance(other.inputs[0][1][0], str)
        assert build.plan.choices[0].other_shapes["index_bounds"] == {"1": [other.inputs[0][1][0]]}
        assert build.plan.to_json()["format"] == SIZE_BOUNDS_FORMAT
    path = build.save(tmp_path / "graph.cuvilpkg", signing_key=str(keys[0]))
    torch.save(model.state_dict(), tmp_path / "weights.pt")
    torch.save((x, edges), tmp_path / "inputs.pt")
    report = run_service(GRAPH_SERVICE, tmp_path / "weights.pt", path, keys[1], tmp_path / "inputs.pt", cwd=tmp_path)
    assert max(report["good"]) < 1e-4, report
    if backend == "aoti":        # the package's own call, the edge list checked before it
        assert report["direct_ids"] == [[1, 20]], report
    eager, built, eager_bigger, built_bigger = report["errors"]
    assert eager is not None and built == eager and built_bigger == eager_bigger is not None, report  # eager's own error
    if backend == "compile":     # the larger graph runs the original module
        assert report["applied"] == ["<model>: compile"] and report["fallback_calls"] == 3, report
    else:
        assert report["applied"] == [f"<model>: {backend} (and other input sizes)"], report
        assert report["fallback_calls"] == 2 and report["other_shape_calls"] == 1, report


def test_out_of_range_reads_negative_ids_as_out_of_range():
    ids = torch.tensor([[0, 9, 3]])
    assert not out_of_range(ids, 10) and out_of_range(ids, 9)
    assert out_of_range(torch.tensor([1, -1]), 10) and out_of_range(torch.tensor([1, -1], dtype=torch.int32), 10)
    assert out_of_range(ids.t(), 9) and not out_of_range(ids.t(), 10)            # not contiguous
    assert not out_of_range(torch.zeros(0, dtype=torch.long), 1)
    assert not out_of_range(torch.tensor([50.0]), 10)                            # not ids


class Lookup(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(10, 8), nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids.view(-1, ids.shape[-1]))) * mask.unsqueeze(-1)


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_a_runtime_region_hands_ids_outside_the_table_to_the_original_module(backend, caplog):
    if not runtimes.check(backend).ok:
        pytest.skip(f"{backend} not installed")
    torch.manual_seed(0)
    model = Lookup().eval()
    ids, mask = torch.randint(0, 10, (2, 5)), torch.ones(2, 5, dtype=torch.long)
    build = recompile(model, (ids, mask), plan={"": Candidate("", backend)}, records=False, deployed_race=False,
                      rounds=3)
    fast = build.module
    assert fast.index_bounds == {0: 10}             # the ids index 10 rows; the mask indexes nothing
    with torch.no_grad():
        assert torch.allclose(fast(ids, mask), model(ids, mask), atol=1e-5)
        for bad in (10, -1):
            wrong = ids.clone()
            wrong[1, 2] = bad
            with caplog.at_level(logging.WARNING), pytest.raises(IndexError):
                fast(wrong, mask)
        fast(ids, mask * 7)                         # any mask value: the mask indexes no table
    assert fast.fallback_calls == 2
    assert "input 0 holds an index outside 0-9" in caplog.text


class Fields(nn.Module):
    """A DLRM-style recommender: one table for every categorical field, each field's ids shifted
    into its own rows; an item id shifted by a number; hashed ids (``%``, always in range), and
    positions counted from a mask (``cumsum``: bounded by the length, not by any id)."""

    def __init__(self) -> None:
        super().__init__()
        self.table, self.small = nn.Embedding(300, 8), nn.Embedding(50, 8)
        self.register_buffer("offsets", torch.tensor([0, 100, 200]), persistent=False)

    def forward(self, ids: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        positions = (ids > 0).long().cumsum(1)
        return (self.table(ids + self.offsets).sum(1) + self.small(item + 3) + self.small(ids % 50).sum(1)
                + self.small(positions).sum(1))


class Doubled(nn.Module):
    """Ids that reach their table through a product: no bound follows them."""

    def __init__(self) -> None:
        super().__init__()
        self.table = nn.Embedding(50, 8)

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return self.table(ids * 2) + x


def _limits(bounds: IndexBounds) -> dict[int, Any]:
    return {i: n if isinstance(n, int) else n.tolist() for i, n in bounds.rows.items()}


def test_ids_shifted_by_a_constant_are_bounded_by_the_rows_less_the_shift_element_by_element(tmp_path):
    """Each field's ids by its own rows (a DLRM's table holds every field, each shifted into its
    rows): a call with the first field's id 250 is eager's good call, the last field's 100 is not."""
    from onnx import TensorProto, helper, numpy_helper

    exported = torch.export.export(Fields().eval(), (torch.randint(0, 100, (4, 3)), torch.randint(0, 20, (4,))))
    bounds = program_index_bounds(exported)
    assert _limits(bounds) == {0: [300, 200, 100], 1: 47} and not bounds.sized and not bounds.unchecked
    assert not out_of_range(torch.tensor([[250, 150, 99]]), bounds.rows[0])
    assert out_of_range(torch.tensor([[0, 0, 100]]), bounds.rows[0])
    assert out_of_range(torch.tensor([[-1, 0, 0]]), bounds.rows[0])
    assert out_of_range(torch.tensor([[0, 0, 0, 0]]), bounds.rows[0])        # another shape: eager answers it
    assert IndexBounds.from_record(bounds.to_record()).rows[0].tolist() == [300, 200, 100]
    doubled = torch.export.export(Doubled().eval(), (torch.randint(0, 20, (4,)), torch.randn(4, 8)))
    assert program_index_bounds(doubled) == IndexBounds({}, frozenset(), frozenset({0}))
    offsets = helper.make_node("Constant", [], ["offsets"],
                               value=numpy_helper.from_array(np.array([0, 100, 200], np.int64), "o"))
    negative = helper.make_node("Constant", [], ["back"], value=numpy_helper.from_array(np.array([-1], np.int64), "b"))
    nodes = [offsets, negative,
             helper.make_node("Add", ["offsets", "ids"], ["shifted"]),
             helper.make_node("Gather", ["table", "shifted"], ["t"]),
             helper.make_node("Add", ["other", "back"], ["down"]),          # a negative shift: not followed
             helper.make_node("Gather", ["table", "down"], ["d"])]
    path = _graph(tmp_path, nodes, [("ids", TensorProto.INT64), ("other", TensorProto.INT64)], {"table": (300, 4)})
    assert _limits(index_bounds(path)) == {0: [300, 200, 100]}
    reshaped = [offsets, helper.make_node("Flatten", ["ids"], ["flat"]),        # elements moved before the shift:
                helper.make_node("Add", ["flat", "offsets"], ["shifted"]),      # the largest shift bounds all
                helper.make_node("Gather", ["table", "shifted"], ["t"])]
    path = _graph(tmp_path, reshaped, [("ids", TensorProto.INT64)], {"table": (300, 4)})
    assert _limits(index_bounds(path)) == {0: 100}


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_a_torch_compile_region_hands_ids_outside_the_table_to_the_original_module(caplog):
    """Inductor's kernels check indices inside OpenMP's threads, as AOTInductor's do: an id past the
    table aborted a process that called torch.compile's program."""
    torch.manual_seed(0)
    model = Fields().eval()
    ids, item = torch.randint(0, 100, (4, 3)), torch.randint(0, 20, (4,))
    build = recompile(model, (ids, item), plan={"": Candidate("", "compile")}, records=False, deployed_race=False,
                      rounds=3)
    fast = build.module
    assert build.plan.choices[0].runtime["index_bounds"] == {"0": [300, 200, 100], "1": 47}
    # the direct call checks both, the fields' limits at the ids' own shape
    assert [(i, rows, None if limit is None else limit.tolist()[1]) for i, _, rows, limit in fast._direct_ids] == \
        [(0, 0, [300, 200, 100]), (1, 47, None)]
    with torch.no_grad():
        assert torch.allclose(fast(ids, item), model(ids, item), atol=1e-5)
        past = ids.clone()
        past[1, 2] = 100                  # the last field's rows end at 300
        with caplog.at_level(logging.WARNING), pytest.raises(IndexError):
            fast(past, item)
        spilled = ids.clone()
        spilled[1, 0] = 250               # the first field's id into the last field's rows: eager answers
        assert torch.allclose(fast(spilled, item), model(spilled, item), atol=1e-5)
    assert fast.fallback_calls == 1
    assert "input 0 holds an index outside 0 and one less than [300, 200, 100]" in caplog.text


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_no_inductor_program_is_built_for_ids_that_reach_a_table_through_arithmetic():
    """No check before the call can follow ``ids * 2``: AOTInductor and torch.compile, whose kernels
    would abort the process on a value out of range, are rejected with the reason (the runtimes,
    which raise their own error or answer with numbers there, are not)."""
    torch.manual_seed(0)
    model = Doubled().eval()
    build = recompile(model, (torch.randint(0, 20, (4,)), torch.randn(4, 8)), budget=6, records=False,
                      deployed_race=False, rounds=3, backends=("eager", "compile", "aoti"))
    rejected = {t.candidate.backend: t.reason for t in build.result.trials.values() if t.status == "compile_error"}
    assert set(rejected) == {"compile", "aoti"}, rejected
    assert all("input 0 reaches an index through arithmetic" in why for why in rejected.values()), rejected
    assert all(c.candidate.backend == "eager" for c in build.plan.choices)


def test_bounds_round_trip_through_their_record_and_a_bad_record_is_refused():
    """One record, in plan.json and beside a cached AOTInductor package."""
    bounds = IndexBounds({0: 30, 2: 50}, frozenset({2}))
    assert bounds.to_record() == {"index_bounds": {"0": 30, "2": 50}, "sized_index_inputs": [2]}
    assert IndexBounds.from_record(bounds.to_record()) == bounds
    assert IndexBounds({}).to_record() == {} and IndexBounds.from_record({}) is None
    for bad in ({"index_bounds": {"0": 0}}, {"index_bounds": {"x": 3}}, {"index_bounds": []},
                {"index_bounds": {"0": 3}, "sized_index_inputs": [1]}, {"index_bounds": {"0": [3, 0]}},
                {"index_bounds": {"0": []}}, {"index_bounds": {"0": [1.5]}}, {"index_bounds": {"0": True}}):
        with pytest.raises(ValueError, match="is not a map of input positions"):
            IndexBounds.from_record(bad)
