"""Ids outside an embedding table (:mod:`cuvil_pgc.recompile.index_bounds`): eager raises
IndexError, ONNX Runtime reads a negative id from the table's end and OpenVINO answers any id with
numbers, so a runtime region hands such a call to the original module."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import recompile, runtimes
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.index_bounds import index_bounds, out_of_range


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
    assert index_bounds(path) == {0: 30, 1: 2, 4: 7}


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
    assert "input 0 holds an id outside 0-9" in caplog.text
