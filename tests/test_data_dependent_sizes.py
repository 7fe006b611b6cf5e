"""A program whose sizes its data decides (the rows a boolean mask keeps, ``torch.nonzero``): with
torch 2.13 and 2.14, AOTInductor's max-autotune with freezing corrupted the searching process's
memory building it ("corrupted size vs. prev_size", SIGABRT: `cuvil-pgc recompile` died with no
build) or made a program returning the wrong number of rows. That candidate is rejected before it
is packaged; its siblings are built."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import apply
from cuvil_pgc.recompile.apply import ScopeInputs, data_dependent_sizes
from cuvil_pgc.recompile.candidates import Candidate


class Filter(nn.Module):
    def __init__(self):
        super().__init__()
        self.score = nn.Linear(8, 1)

    def forward(self, x):
        s = torch.sigmoid(self.score(x)).squeeze(-1)
        return s[s > 0.5]


def test_sizes_the_data_decides_are_told_from_fixed_ones():
    torch.manual_seed(0)
    model, x = Filter().eval(), torch.randn(20, 8)
    assert data_dependent_sizes(torch.export.export(model, (x,)))
    assert not data_dependent_sizes(torch.export.export(model.score, (x,)))


@pytest.mark.parametrize(("mode", "freezing", "packaged"), [
    ("max-autotune-no-cudagraphs", True, False),
    ("max-autotune-no-cudagraphs", False, True),
    ("default", True, True),
])
def test_max_autotune_with_freezing_is_not_packaged_for_such_a_program(tmp_path, monkeypatch, mode, freezing, packaged):
    torch.manual_seed(0)
    model, x = Filter().eval(), torch.randn(20, 8)
    calls = []
    monkeypatch.setattr(apply, "package_aoti", lambda exported, cand, path: calls.append(cand))
    cand = Candidate("", "aoti", mode=mode, freezing=freezing)
    if packaged:
        apply._compile_aoti(model, cand, ScopeInputs((x,)), str(tmp_path / "p.pt2"))
        assert calls == [cand]
    else:
        with pytest.raises(RuntimeError, match="corrupts memory on a program whose sizes depend on the data"):
            apply._compile_aoti(model, cand, ScopeInputs((x,)), str(tmp_path / "p.pt2"))
        assert calls == []
