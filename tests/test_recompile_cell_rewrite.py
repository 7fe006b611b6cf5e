"""The cell rewrite's compiled form: at batch 1 over several steps on the CPU, each step's hidden
product is a multiply and row sum (fused with the gates by Inductor), not a GEMM library call; a
single step, a batch and eager keep ``addmm``. Either way the outputs equal torch's RNN."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile.rewrites.cells import CellGRU, CellLSTM


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


class PackedTagger(nn.Module):
    """An RNN fed a packed sequence (padded batch of different lengths)."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        self.rnn = rnn

    def forward(self, x: torch.Tensor, lengths: torch.Tensor):
        packed = nn.utils.rnn.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        out, state = self.rnn(packed)
        return nn.utils.rnn.pad_packed_sequence(out, batch_first=True)[0], state


@pytest.mark.parametrize("rnn", [nn.LSTM(8, 16, batch_first=True), nn.GRU(8, 16, batch_first=True, num_layers=2)])
def test_packed_and_long_sequences_run_the_original_module(rnn):
    from cuvil_pgc.recompile.rewrites import apply_rewrites
    from cuvil_pgc.recompile.rewrites.cells import MAX_UNROLLED_STEPS

    torch.manual_seed(0)
    model = PackedTagger(rnn.eval())
    rewritten, applied = apply_rewrites(model)
    assert applied == [f"{type(rnn).__name__.lower()}_cell:rnn"]
    calls = []
    rewritten.rnn.original.register_forward_hook(lambda *_: calls.append(1))
    x, lengths = torch.randn(3, 7, 8), torch.tensor([7, 4, 2])
    long = torch.randn(1, MAX_UNROLLED_STEPS + 1, 8)
    with torch.no_grad():
        for got, expected in ((rewritten(x, lengths), model(x, lengths)), (rewritten.rnn(long), rnn(long))):
            for a, b in zip(torch.utils._pytree.tree_leaves(got), torch.utils._pytree.tree_leaves(expected), strict=True):
                assert torch.equal(a, b)
        assert len(calls) == 2
        rewritten.rnn(x)                                     # a padded batch of 7 steps: cell math
        torch.compile(rewritten.rnn, fullgraph=True)(x)      # dynamo never meets the original RNN there
    assert len(calls) == 2
    assert rewritten.rnn.to(torch.float64).original.weight_hh_l0.dtype == torch.float64   # moves follow
    assert not any(k.startswith("original") for k in rewritten.state_dict())
