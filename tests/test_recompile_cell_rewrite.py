"""The cell rewrite's compiled form: at batch 1 over several steps on the CPU, each step's hidden
product is a multiply and row sum (fused with the gates by Inductor), not a GEMM library call; a
single step, a batch and eager keep ``addmm``. Either way the outputs equal torch's RNN."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile.rewrites import CellGRU, CellLSTM


def exported_addmms(module: nn.Module, x: torch.Tensor) -> tuple[int, torch.export.ExportedProgram]:
    with torch.no_grad():
        exported = torch.export.export(module, (x,))
    return sum("addmm" in str(n.target) for n in exported.graph.nodes if n.op == "call_function"), exported


@pytest.mark.parametrize("rnn", [nn.LSTM(24, 32, num_layers=2, batch_first=True),
                                 nn.GRU(24, 32, batch_first=True, bidirectional=True)])
def test_a_compiled_batch_1_sequence_multiplies_and_sums_each_hidden_product(rnn):
    torch.manual_seed(0)
    rnn.eval()
    cell = (CellLSTM if isinstance(rnn, nn.LSTM) else CellGRU)(rnn)
    x = torch.randn(1, 6, 24)
    addmms, exported = exported_addmms(cell, x)
    projections = rnn.num_layers * (2 if rnn.bidirectional else 1)
    assert addmms == projections              # the input projections only: no addmm per step
    with torch.no_grad():
        got, expected = exported.module()(x), rnn(x)
    for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected), strict=True):
        assert a.shape == b.shape and (a - b).abs().max() < 1e-5


@pytest.mark.parametrize("shape", [(1, 1, 24), (3, 6, 24)], ids=["one step", "batch 3"])
def test_one_step_and_batches_keep_one_addmm_per_step(shape):
    torch.manual_seed(0)
    lstm = nn.LSTM(24, 32, batch_first=True).eval()
    x = torch.randn(shape)
    addmms, exported = exported_addmms(CellLSTM(lstm), x)
    assert addmms == 1 + shape[1]
    with torch.no_grad():
        assert (exported.module()(x)[0] - lstm(x)[0]).abs().max() < 1e-5


def test_eager_keeps_addmm_per_step():
    from torch.utils._python_dispatch import TorchDispatchMode

    class CountAddmm(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            CountAddmm.calls += func.overloadpacket.__name__ == "addmm"
            return func(*args, **(kwargs or {}))

    cell = CellGRU(nn.GRU(24, 32, batch_first=True).eval())
    with torch.no_grad(), CountAddmm():
        cell(torch.randn(1, 6, 24))
    assert CountAddmm.calls == 7      # eager materializes no weight-sized product: 1 projection + 6 steps
