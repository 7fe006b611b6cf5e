"""Indices a region computes from its inputs (:mod:`cuvil_pgc.recompile.onnx_index_checks`): no
check before the call bounds a box's width or ``ids - 1``, so the ONNX program checks them itself,
and a region whose program finds one out of range runs the original module, which raises eager's
error. ONNX Runtime and OpenVINO would answer with numbers (OpenVINO for any index, ONNX Runtime for
a negative one)."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import recompile, runtimes
from cuvil_pgc.recompile.apply import ScopeInputs
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.onnx_index_checks import CHECK_OUTPUT
from cuvil_pgc.recompile.runtime_build import export_onnx

needs_openvino = pytest.mark.skipif(not runtimes.check("openvino").ok, reason="openvino not installed")


class Boxes(nn.Module):
    """LayoutLM's box embeddings: each corner's coordinate indexes a table as it is (bounded before
    the call), the box's width is computed (checked in the program); the positions come from the
    input's length only (never out of range: not checked)."""

    def __init__(self) -> None:
        super().__init__()
        self.x, self.w, self.pos = nn.Embedding(100, 8), nn.Embedding(40, 8), nn.Embedding(16, 8)

    def forward(self, box: torch.Tensor) -> torch.Tensor:
        width = box[..., 2] - box[..., 0]
        positions = torch.arange(box.shape[1], device=box.device)
        return self.x(box[..., 0]) + self.x(box[..., 2]) + self.w(width) + self.pos(positions)


class Shifted(nn.Module):
    """``x[:, i - 1]``, which eager reads from the end for a negative index (``i`` 0 is the last
    column), and a gather of ``j * 2``, which eager refuses for one."""

    def forward(self, x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x[:, i - 1], x.gather(1, (j * 2).expand(x.shape[0], -1))


class Took(nn.Module):
    """``x.take(i - 1)``: eager reads a negative index of the flattened ``x`` from the end."""

    def forward(self, x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return x.take(i - 1)


def _boxes(n: int = 5) -> torch.Tensor:
    x0 = torch.randint(40, 50, (2, n), generator=torch.Generator().manual_seed(0))
    return torch.stack([x0, x0 * 0, x0 + 3, x0 * 0 + 1], -1)


def _count(module: nn.Module, args: tuple, outputs: int, tmp_path):
    """The region's ONNX export and a call counting its indices out of range on OpenVINO, which
    answers a Gather's index out of range with numbers (it refuses some of GatherElements' and
    GatherND's, as ONNX Runtime does some of Gather's)."""
    import openvino as ov

    path = tmp_path / "m.onnx"
    export_onnx(module, ScopeInputs(args), path, outputs)
    compiled = ov.Core().compile_model(str(path), "CPU")
    names = [n for port in compiled.outputs for n in port.get_names()]

    def count(*a: torch.Tensor) -> int | str:
        try:
            return int(list(compiled.create_infer_request().infer([t.numpy() for t in a]).values())[-1])
        except RuntimeError:        # OpenVINO refused it itself (the region runs the original all the same)
            return "refused"
    return names, count


@needs_openvino
def test_the_program_counts_computed_indices_out_of_range_as_eager_tests_them(tmp_path):
    torch.manual_seed(0)
    names, count = _count(Boxes().eval(), (_boxes(),), 1, tmp_path)
    assert CHECK_OUTPUT in names
    box = _boxes()
    assert count(box) == 0
    # each corner in its table (100 rows), the width (x1 - x0) in the width's (40) or not
    for x0, x1, wrong in ((50, 49, 1), (60, 21, 1), (10, 50, 1), (10, 99, 1), (10, 49, 0), (99, 99, 0)):
        corners = box.clone()
        corners[1, 3, 0], corners[1, 3, 2] = x0, x1
        assert count(corners) == wrong
    x, fine = torch.randn(3, 6), torch.tensor([[0, 2]])
    _, count = _count(Shifted().eval(), (x, fine, fine.clone()), 2, tmp_path)
    assert count(x, fine, fine) == 0
    for i in ([[-5, 0]], [[6, 1]]):                  # x[:, -6] and x[:, 5]: eager reads them
        assert count(x, torch.tensor(i), fine) == 0
    for i in ([[-6, 0]], [[7, 1]]):                  # x[:, -7] and x[:, 6]: eager raises
        assert count(x, torch.tensor(i), fine) in (1, "refused")
    names, took = _count(Took().eval(), (x, fine), 1, tmp_path)     # torch.export makes it x.view(-1)[i - 1]
    assert CHECK_OUTPUT in names
    assert took(x, fine) == 0 and took(x, torch.tensor([[-17, 0]])) == 0          # x.take(-1), x.take(-18)
    assert took(x, torch.tensor([[-18, 0]])) in (1, "refused")
    # gathers of column -2 (OpenVINO reads it from the end; eager raises) and 6, in each of 3 rows
    assert count(x, fine, torch.tensor([[-1, 0]])) == 3
    assert count(x, fine, torch.tensor([[3, 0]])) in (3, "refused")


class Bag(nn.Module):
    """A recommender's bag of ids per example, the bags' starts in ``offsets`` (one flat list of ids)."""

    def __init__(self) -> None:
        super().__init__()
        self.bag, self.head = nn.EmbeddingBag(40, 4, mode="sum"), nn.Linear(4, 2)

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.head(self.bag(ids, offsets))


BAD_OFFSETS = ([0, 3, 12], [0, 7, 3], [1, 3, 7], [0, 3, -2])    # past the 10 ids' end, going down, not from 0


@needs_openvino
def test_an_embedding_bag_s_offsets_are_checked_as_eager_checks_them(tmp_path):
    ids = torch.randint(0, 40, (10,))
    _, count = _count(Bag().eval(), (ids, torch.tensor([0, 3, 7])), 1, tmp_path)
    for offsets in ([0, 3, 7], [0, 3, 10], [0, 0, 10]):       # an empty bag, at either end, is a bag
        assert count(ids, torch.tensor(offsets)) == 0
    for offsets in BAD_OFFSETS:
        assert count(ids, torch.tensor(offsets)) == 1


@needs_openvino
def test_a_program_whose_indices_are_all_checked_before_the_call_gets_no_check(tmp_path):
    """Ids into a table as they are (the region's pre-call check) and positions from a size."""

    class Plain(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb, self.pos = nn.Embedding(30, 4), nn.Embedding(8, 4)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.emb(ids) + self.pos(torch.arange(ids.shape[1]))

    names, _ = _count(Plain().eval(), (torch.randint(0, 30, (2, 8)),), 1, tmp_path)
    assert CHECK_OUTPUT not in names


class Positions(nn.Module):
    """Positions as RoBERTa counts them, ``cumsum(ids != pad) * (ids != pad) + pad``: at a fixed
    length always within its table, at another length not; hashed ids, ``(ids + 1) * 31 % 50``,
    always within theirs; positions counted from a mask the caller passes, in range only for a mask
    of zeros and ones."""

    def __init__(self, length: int) -> None:
        super().__init__()
        self.pos, self.hashed, self.tok = nn.Embedding(length + 2, 4), nn.Embedding(50, 4), nn.Embedding(30, 4)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        real = (ids != 1).int()
        positions = torch.cumsum(real, dim=1) * real + 1
        return self.pos(positions) + self.hashed((ids + 1) * 31 % 50) + self.tok(ids) + self.pos(mask.cumsum(1))


@needs_openvino
def test_indices_the_programs_constants_and_sizes_keep_in_range_get_no_check(tmp_path):
    from cuvil_pgc.recompile.onnx_index_checks import value_ranges

    ids, mask = torch.randint(0, 30, (2, 8)), torch.ones(2, 8, dtype=torch.long)
    fixed, free = tmp_path / "fixed.onnx", tmp_path / "free.onnx"
    export_onnx(Positions(8).eval(), ScopeInputs((ids, mask)), fixed, 1)
    export_onnx(Positions(8).eval(), ScopeInputs((ids, mask)), free, 1, free_sizes=True)

    def checked(path):
        import onnx

        graph = onnx.load(str(path)).graph
        looked_at = {n.input[0] for n in graph.node if n.op_type == "Less" and n.output[0].startswith("cuvil_")}
        return sorted(n.name for n in graph.node if n.op_type == "Gather" and n.input[1] in looked_at)

    # fixed: only the mask's positions (their values are the caller's); free: the ids' positions too
    assert len(checked(fixed)) == 1 and len(checked(free)) == 2
    import onnx
    from onnx import helper

    graph = helper.make_graph(
        [helper.make_node("Shape", ["x"], ["n"]), helper.make_node("Cast", ["b"], ["i"], to=7),
         helper.make_node("CumSum", ["i", "axis"], ["c"]), helper.make_node("Mul", ["c", "i"], ["m"]),
         helper.make_node("Add", ["m", "one"], ["p"]), helper.make_node("Sub", ["one", "c"], ["q"]),
         helper.make_node("Mod", ["ids", "seven"], ["h"]), helper.make_node("Cast", ["p"], ["pb"], to=9)],
        "g", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [3, 5]),
              helper.make_tensor_value_info("b", onnx.TensorProto.BOOL, [3, 5]),
              helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [3, 5])], [],
        initializer=[helper.make_tensor("axis", onnx.TensorProto.INT64, [], [1]),
                     helper.make_tensor("one", onnx.TensorProto.INT64, [], [1]),
                     helper.make_tensor("seven", onnx.TensorProto.INT64, [], [7])])
    dims = {"x": [3, 5], "b": [3, 5], "i": [3, 5], "ids": [3, 5]}
    ranges = value_ranges(graph, dims)
    assert ranges["n"] == (0, 5) and ranges["c"] == (0, 5) and ranges["m"] == (0, 5) and ranges["p"] == (1, 6)
    assert ranges["q"] == (-4, 1) and ranges["h"] == (0, 6) and ranges["pb"] == (0, 1)
    assert "ids" not in ranges                       # an input's values are the caller's


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_a_runtime_region_hands_a_computed_index_out_of_range_to_the_original_module(backend, caplog, capfd):
    if not runtimes.check(backend).ok:
        pytest.skip(f"{backend} not installed")
    torch.manual_seed(0)
    model, box = Boxes().eval(), _boxes()
    build = recompile(model, (box,), plan={"": Candidate("", backend)}, records=False, deployed_race=False,
                      rounds=3, dynamic=True)
    fast = build.module
    assert fast.index_bounds == {0: 100}        # the corners' table, checked before the call
    choice = build.plan.choices[0]              # an older cuvil-pgc refuses the plan (see plan_doc)
    assert choice.runtime["index_checks"] == choice.other_shapes["index_checks"] == "in-program"
    assert build.plan.to_json()["format"] == 5
    bad = box.clone()
    bad[0, 1, 2] = bad[0, 1, 0] - 1             # x1 < x0: each corner in range, the width -1
    longer = torch.cat([box, box], 1)[:, :9]    # another length (9 of the 16 positions)
    wrong_longer = longer.clone()
    wrong_longer[1, 7, 2] = wrong_longer[1, 7, 0] - 2
    with torch.no_grad():
        for _ in range(2):                          # the first call learns the lean path; the second takes it
            torch.testing.assert_close(fast(box), model(box))
            with caplog.at_level(logging.WARNING), pytest.raises(IndexError, match="index out of range"):
                fast(bad)
        torch.testing.assert_close(fast(longer), model(longer))
        with pytest.raises(IndexError, match="index out of range"):
            fast(wrong_longer)
        too_wide = box.clone()
        too_wide[1, 2, 0], too_wide[1, 2, 2] = 10, 99     # the width 89, past its table (ONNX Runtime refuses it)
        capfd.readouterr()
        with pytest.raises(IndexError, match="index out of range"):
            fast(too_wide)
        assert "onnxruntime" not in capfd.readouterr().err      # the runtime's own error line stays quiet
    assert fast.fallback_calls == 4 and fast.other_shape_calls == 1 and fast.other_sizes_failures == 0
    assert "an index it computes from its inputs" in fast.first_fallback
    assert "an index it computes from its inputs" in caplog.text


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_an_onnx_runtime_region_hands_bad_offsets_to_the_original_module():
    if not runtimes.check("ort").ok:
        pytest.skip("onnxruntime not installed")
    torch.manual_seed(0)
    model, ids, offsets = Bag().eval(), torch.randint(0, 40, (10,)), torch.tensor([0, 3, 7])
    fast = recompile(model, (ids, offsets), plan={"": Candidate("", "ort")}, records=False, deployed_race=False,
                     rounds=3).module
    with torch.no_grad():
        torch.testing.assert_close(fast(ids, offsets), model(ids, offsets))
        for bad in BAD_OFFSETS:
            with pytest.raises(RuntimeError, match="offsets|index|Index"):     # eager's own errors
                fast(ids, torch.tensor(bad))
    assert fast.fallback_calls == len(BAD_OFFSETS)


@needs_openvino
def test_plain_exports_are_what_a_user_exports_and_are_cached_apart(tmp_path):
    """The benchmarks' runtime baselines: the export a user makes, without the build's checks."""
    from cuvil_pgc.recompile.runtime_build import artifact_path, plain_exports

    with plain_exports():
        names, _ = _count(Boxes().eval(), (_boxes(),), 1, tmp_path)
        plain_path = artifact_path("key", "onnx", None, ".onnx")
    assert CHECK_OUTPUT not in names
    assert artifact_path("key", "onnx", None, ".onnx") != plain_path
