"""A model holding a sparse tensor as a buffer (a GCN's adjacency): recompile's first check compared
buffers with ``torch.equal``, which has no sparse kernel, and the user was told their model "raised
on its example inputs" (``Could not run 'aten::equal' with arguments from the 'SparseCPU'
backend``). Sparse buffers are compared and digested by their indices and values."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc import load_build
from cuvil_pgc._structure import strided_parts, weights_digest
from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.stateless import _same

pytestmark = pytest.mark.usefixtures("build_env")


class GCN(nn.Module):
    def __init__(self, layout=torch.sparse_coo):
        super().__init__()
        torch.manual_seed(0)
        g = torch.Generator().manual_seed(1)
        idx = torch.randint(0, 30, (2, 90), generator=g)
        adj = torch.sparse_coo_tensor(idx, torch.rand(90, generator=g), (30, 30)).coalesce()
        self.register_buffer("adj", adj if layout is torch.sparse_coo else adj.to_sparse_csr())
        self.lin = nn.Linear(8, 4)

    def forward(self, x):
        return torch.relu(torch.sparse.mm(self.adj, self.lin(x)) if self.adj.layout is torch.sparse_coo
                          else self.adj @ self.lin(x))


@pytest.mark.parametrize("layout", [torch.sparse_coo, torch.sparse_csr])
def test_sparse_buffers_compare_and_digest_by_their_values(layout):
    a, b = GCN(layout), GCN(layout)
    assert _same(a.adj, b.adj) and weights_digest(a) == weights_digest(b)
    assert all(p.layout is torch.strided for p in strided_parts(a.adj))
    with torch.no_grad():
        b.adj.values().mul_(2)
    assert not _same(a.adj, b.adj) and weights_digest(a) != weights_digest(b)
    assert not _same(a.adj, a.adj.to_dense())               # another layout is another tensor


def test_a_model_with_a_sparse_buffer_recompiles_and_loads(tmp_path, keys):
    model, x = GCN().eval(), torch.randn(30, 8)
    build = recompile(model, (x,), plan={"": Candidate("", "eager")}, records=False, deployed_race=False, rounds=3)
    path = build.save(tmp_path / "g.cuvilpkg", signing_key=str(keys[0]))
    served = load_build(path, GCN().eval(), pubkey=str(keys[1]))
    with torch.no_grad():
        torch.testing.assert_close(served(x), model(x))
