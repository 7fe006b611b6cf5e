"""A forward that decides on a tensor's value in Python (``if h.mean() > 0.25:``) has no one
program: torch.export refuses it with "Could not guard on data-dependent expression Eq(u0, 1)",
which names neither the line nor the fix, and torch.jit.trace (which exports a region calling
TorchScript) kept the branch the captured inputs took: the ONNX Runtime build passed the accuracy
guard on them and answered inputs taking the other branch 2.3 off. The rejection names the line;
the trace is refused."""

from __future__ import annotations

import inspect

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile.apply import ScopeInputs, export_program
from cuvil_pgc.recompile.export_error import ExportError, TracedDecision, data_dependent_note


class Branching(nn.Module):
    def __init__(self, scripted: bool = False, rnn: bool = False, sizes: bool = False):
        super().__init__()
        inner = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
        self.inner = torch.jit.script(inner) if scripted else inner
        self.rnn = nn.GRU(8, 8, batch_first=True) if rnn else None
        self.sizes = sizes
        self.b = nn.Linear(8, 2)

    def forward(self, x):
        h = self.inner(x)
        if self.rnn is not None:
            return self.b(self.rnn(h)[0])          # torch's GRU checks its sizes in Python
        if self.sizes:                             # the tracer hands these out as tensors and warns
            if h.shape[1] > 3:
                h = h[:, : int(h.shape[1] / 2)].repeat(1, 2, 1)
            return self.b(h)
        if h.mean() > 0.25:
            return self.b(h)
        return self.b(-h)


BRANCH_LINE = next(i for i, line in enumerate(inspect.getsource(Branching).splitlines())
                   if "if h.mean() > 0.25:" in line) + inspect.getsourcelines(Branching)[1]


def model(**kw):
    torch.manual_seed(0)
    return Branching(**kw).eval(), torch.randn(2, 4, 8)


def test_torch_export_s_failure_names_the_line_that_decides():
    net, x = model()
    with pytest.raises(ExportError) as info:
        export_program(net, ScopeInputs((x,)))
    message = str(info.value)
    assert message.startswith(f"torch.export failed (the code at {__file__}:{BRANCH_LINE} (`if h.mean() > 0.25:`) "
                              "decides on a tensor's value in Python"), message
    assert "torch.where, torch.cond" in message and "Could not guard on data-dependent" in message


def test_a_trace_that_would_keep_one_branch_is_refused(tmp_path):
    pytest.importorskip("onnx")
    from cuvil_pgc.recompile.runtime_build import export_onnx

    net, x = model(scripted=True)
    with pytest.raises(ExportError) as info:
        export_onnx(net, ScopeInputs((x,)), tmp_path / "m.onnx", 1)
    message = str(info.value)
    assert f"the code at {__file__}:{BRANCH_LINE} (`if h.mean() > 0.25:`)" in message, message
    assert isinstance(info.value.__cause__, TracedDecision) and not (tmp_path / "m.onnx").exists()


@pytest.mark.parametrize("kind", ["rnn", "sizes"])
def test_decisions_on_sizes_do_not_refuse_a_trace(tmp_path, kind):
    """torch's GRU checks its sizes in Python, and so may the user's code: the tracer warns for
    both as for a value, but a trace at the captured sizes keeps them rightly."""
    pytest.importorskip("onnx")
    from cuvil_pgc.recompile.runtime_build import export_onnx

    net, x = model(scripted=True, **{kind: True})
    export_onnx(net, ScopeInputs((x,)), tmp_path / "m.onnx", 1)
    assert (tmp_path / "m.onnx").exists()


def test_the_note_is_empty_for_other_failures():
    assert data_dependent_note(RuntimeError("Unsupported operator aten::foo")) == ""
    wrapped = RuntimeError("Failed to export the model with torch.export")
    wrapped.__cause__ = RuntimeError("Could not guard on data-dependent expression Eq(u0, 1)")
    assert data_dependent_note(wrapped).startswith(" (the code decides on a tensor's value in Python")


def test_a_decision_inside_torch_s_own_code_names_no_line_of_ours():
    """An LSTM called with a packed sequence decides on its batch sizes inside torch: torch.export
    reports the outermost frame outside torch, the region's output wrapper of cuvil-pgc's own."""
    import cuvil_pgc.recompile.aoti_outputs as ours

    error = RuntimeError("Could not guard on data-dependent expression Eq(u32, 1)\n\nThe following call raised "
                         f'this error:\n  File "{ours.__file__}", line 44, in forward\n    return tuple(...)\n')
    assert data_dependent_note(error).startswith(" (the code decides on a tensor's value in Python")


class KeptRows(nn.Module):
    def forward(self, x):
        kept = x[x.sum(-1) > 0]
        return torch.cat([kept, kept.roll(1, 0)], -1)


def test_a_guard_on_a_size_the_data_decides_gets_torch_export_s_suggested_check():
    """torch.roll of the rows a mask keeps asks whether there are any: no branch of the user's,
    a fact torch.export can be told (its message suggests the torch._check calls, past its first line)."""
    with pytest.raises(ExportError) as info:
        export_program(KeptRows(), ScopeInputs((torch.randn(6, 4),)))
    message = str(info.value)
    assert "(`return torch.cat([kept, kept.roll(1, 0)], -1)`) needs a fact about a size its data decides" in message
    assert "`torch._check((4*kept.shape[0]) != 0)`" in message, message

