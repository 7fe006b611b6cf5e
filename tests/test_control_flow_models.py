"""Models with control flow torch captures (``torch.cond``, ``while_loop``): profiled, counted and
recompiled, with the indices inside a branch or a loop body checked as those outside are.

Before: profiling a model with a ``while_loop`` failed the user's call (Dynamo, which compiles the
loop's body even in eager, cannot enter a region), the op census crashed every recompile of a model
with a ``torch.cond`` (a dispatch mode without ``supports_higher_order_operators``), and the
indices inside a branch went unchecked: for an id past the table OpenVINO answered with numbers,
ONNX Runtime read id -1 from the table's end, and the AOTInductor package aborted the process.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch._higher_order_ops.while_loop import while_loop

from cuvil_pgc.recompile import recompile, runtimes
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.features import op_census
from cuvil_pgc.recompile.index_bounds import IndexBounds, index_bounds, onnx_index_bounds, with_shapes
from cuvil_pgc.recompile.onnx_index_checks import UncheckableIndex, add_index_checks
from cuvil_pgc.recompile.program_index_bounds import program_index_bounds


class CondEmbed(nn.Module):
    """Two tables, one chosen by a flag through ``torch.cond``."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.emb2, self.head = nn.Embedding(20, 8), nn.Embedding(20, 8), nn.Linear(8, 3)

    def forward(self, ids: torch.Tensor, flag: torch.Tensor) -> torch.Tensor:
        x = torch.cond(flag.sum() > 0, lambda i: self.emb(i), lambda i: self.emb2(i) * 2, (ids,))
        return self.head(x).sum(1)


class LoopEmbed(nn.Module):
    """Ids shifted by the iteration inside a ``while_loop``'s body: no bound before the call follows them."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(50, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        i, acc = torch.zeros((), dtype=torch.int64), torch.zeros(ids.shape[0], 8)
        _, acc = while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, acc + self.emb(ids + i).sum(1)), (i, acc))
        return acc


def _cond_inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randint(0, 20, (2, 5)), torch.ones(2)


def test_the_op_census_counts_the_branch_eager_takes_and_leaves_eager_working() -> None:
    torch.manual_seed(0)
    model, (ids, flag) = CondEmbed().eval(), _cond_inputs()
    census = op_census(model, (ids, flag), {})
    assert census["gemms"] == 1 and census["flops"] > 0        # the head's GEMM after the branch
    assert census["ops"] > 5                                    # the branch's embedding among them
    with torch.no_grad():                                       # torch.cond compiled under a mode broke this
        model(ids, flag), model(ids, -flag)
    loop = LoopEmbed().eval()
    op_census(loop, (torch.randint(0, 40, (2, 5)),), {})       # a while_loop runs uncounted, without failing
    loop(torch.randint(0, 40, (2, 5)))


def test_profiling_a_model_with_a_while_loop_does_not_fail_the_call(tmp_path) -> None:
    from cuvil_pgc import profile
    from cuvil_pgc.instrument.module import instrument_module
    from cuvil_pgc.trace.reader import load_trace

    torch.manual_seed(0)
    model, ids = LoopEmbed().eval(), torch.randint(0, 40, (2, 5))
    expected = model(ids)
    handle = instrument_module(model)
    path = tmp_path / "loop.trace.json"
    with profile(path, ops=False, compile=False, sample_hz=0, gpu="off"):
        got = model(ids)                         # the body's embedding is traced by Dynamo: no region there
    handle.remove()
    assert torch.equal(got, expected)
    names = {e for e in load_trace(str(path)).strings.strings}
    assert "model" in names and "model.emb" not in names


def test_a_torch_export_program_bounds_the_ids_a_cond_branch_indexes_and_refuses_a_loop_bodys() -> None:
    torch.manual_seed(0)
    ids, flag = _cond_inputs()
    assert program_index_bounds(torch.export.export(CondEmbed().eval(), (ids, flag))) == IndexBounds({0: 20})
    loop = program_index_bounds(torch.export.export(LoopEmbed().eval(), (torch.randint(0, 40, (2, 5)),)))
    assert loop.unchecked == frozenset({0}) and not loop.rows


def _onnx(nodes: list, inputs: list, outputs: list, tables: dict) -> object:
    from onnx import helper, numpy_helper

    graph = helper.make_graph(nodes, "g", inputs, outputs,
                              initializer=[numpy_helper.from_array(np.zeros(s, np.float32), n) for n, s in tables.items()])
    return with_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))


def test_an_onnx_if_branch_gathering_an_input_is_bounded_and_a_loop_body_computing_one_is_refused(tmp_path) -> None:
    import onnx
    from onnx import TensorProto, helper

    def branch(name: str, table: str) -> object:
        return helper.make_graph([helper.make_node("Gather", [table, "ids"], [f"{name}_out"])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)])

    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])
    flag = helper.make_tensor_value_info("flag", TensorProto.BOOL, [])
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    cond = _onnx([helper.make_node("If", ["flag"], ["y"], then_branch=branch("then", "emb"),
                                   else_branch=branch("else", "small"))], [ids, flag], [out],
                 {"emb": (20, 8), "small": (12, 8)})
    path = tmp_path / "cond.onnx"
    onnx.save(cond, str(path))
    assert index_bounds(path) == IndexBounds({0: 12})       # both branches' tables: the smaller bounds the ids

    body = helper.make_graph(
        [helper.make_node("Add", ["ids", "i"], ["shifted"]), helper.make_node("Gather", ["emb", "shifted"], ["row"]),
         helper.make_node("Identity", ["c"], ["c_out"]), helper.make_node("Identity", ["row"], ["row_out"])],
        "body", [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                 helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("row_out", TensorProto.FLOAT, None)])
    loop = _onnx([helper.make_node("Constant", [], ["n"], value=helper.make_tensor("n", TensorProto.INT64, [], [3])),
                  helper.make_node("Loop", ["n", "flag"], ["rows"], body=body)], [ids, flag], [out], {"emb": (20, 8)})
    loop.graph.output[0].name = "rows"
    bounds, unbounded = onnx_index_bounds(loop)
    assert not bounds.rows and [n.op_type for n in unbounded] == ["Gather"]
    with pytest.raises(UncheckableIndex, match="inside a control-flow branch or loop body"):
        add_index_checks(loop, unbounded)


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
@pytest.mark.parametrize("backend", ["openvino", "aoti"])
def test_a_build_of_a_cond_model_raises_eagers_error_for_ids_past_the_branchs_table(backend) -> None:
    if backend != "aoti" and not runtimes.check(backend).ok:
        pytest.skip(f"{backend} not installed")
    torch.manual_seed(0)
    model, (ids, flag) = CondEmbed().eval(), _cond_inputs()
    build = recompile(model, (ids, flag), plan={"": Candidate("", backend)}, records=False, deployed_race=False,
                      rounds=3)
    fast = build.module
    with torch.no_grad():
        assert torch.allclose(fast(ids, flag), model(ids, flag), atol=1e-5)
        for bad in (20, -1):                  # OpenVINO answered with numbers; AOTInductor aborted the process
            wrong = ids.clone()
            wrong[1, 2] = bad
            with pytest.raises(IndexError):
                fast(wrong, flag)
    assert fast.fallback_calls == 2


COMPILED_FACTORY = '''
import torch
from torch import nn

COMPILES = []


def count(gm, example_inputs):
    from cuvil_pgc.instrument.region import recording

    COMPILES.append("while recording" if recording() else "before")
    return gm.forward


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class WithCompiled(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre, self.block = nn.Linear(8, 16), torch.compile(Block(), backend=count)

    def forward(self, x):
        return self.block(self.pre(x))


def model():
    return WithCompiled().eval(), (torch.randn(4, 8),)
'''


def test_profiling_a_model_that_compiles_a_block_compiles_it_before_recording_only(tmp_path, monkeypatch) -> None:
    """Instrumented after the warm-up, the regions' new forwards failed Dynamo's guards and the first
    recorded call compiled again: 136 ms in a 2 ms call, ranked the hottest region."""
    import importlib
    import sys

    from cuvil_pgc.instrument import runner
    from cuvil_pgc.instrument.factory import profile as make_session
    from cuvil_pgc.trace.reader import load_trace

    (tmp_path / "compiled_factory.py").write_text(COMPILED_FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    factory = importlib.import_module("compiled_factory")
    session = make_session(str(tmp_path / "c.trace.json"), ops=False, gpu="off", sample_hz=0)
    try:
        runner.run_model(session, "compiled_factory:model", iters=3, warmup=2, depth=None)
    finally:
        sys.modules.pop("compiled_factory", None)
    assert factory.COMPILES and "while recording" not in factory.COMPILES     # loading and warming up only
    names = set(load_trace(session.path).strings.strings)
    assert {"model", "model.block", "model.pre"} <= names and "model.block._orig_mod.a" not in names
