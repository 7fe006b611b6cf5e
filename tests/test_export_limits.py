"""The probes of a program for other sizes stay inside the sizes it was exported for: an
AOTInductor package does not check them, and run outside them its kernels index past their buffers
or divide by zero, which ends the process (a MobileViT's program, exported for images of 57-144
pixels, ended `cuvil-pgc recompile` with "Floating point exception" at a smaller probe)."""

from __future__ import annotations

import torch

from cuvil_pgc.recompile.free_size_programs import export_limits
from cuvil_pgc.recompile.size_probes import checked_sizes, within_limits


class Branching(torch.nn.Module):
    """Eager takes any width; its export at 16 holds the branch of widths past 8 only."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if x.shape[-1] > 8 else x + 1


def _exported(module: torch.nn.Module, x: torch.Tensor):
    auto = torch.export.Dim.AUTO
    exported = torch.export.export(module, (x,), dynamic_shapes=({0: auto, 1: auto},))
    [placeholder] = [n for n in exported.graph.nodes if n.op == "placeholder"]
    return exported, [str(d) for d in placeholder.meta["val"].shape]


def test_the_sizes_an_export_holds_are_its_limits_beside_torch_exports_own_lower_bound_of_two():
    exported, (batch, width) = _exported(Branching(), torch.randn(2, 16))
    assert export_limits(exported) == {width: (9, None)}          # the batch's [2, oo) is export's own, not a limit
    conv = torch.nn.Sequential(torch.nn.Conv1d(3, 4, 5)).eval()
    auto = torch.export.Dim.AUTO
    exported = torch.export.export(conv, (torch.randn(2, 3, 16),), dynamic_shapes=({0: auto, 2: auto},))
    [placeholder] = [n for n in exported.graph.nodes if n.op == "placeholder" and n.name.startswith("input")]
    length = str(placeholder.meta["val"].shape[2])
    assert export_limits(exported)[length] == (5, None)


def test_the_probes_never_run_a_program_at_a_size_outside_its_limits():
    module = Branching().eval()
    exported, free = _exported(module, torch.randn(2, 16))
    limits = export_limits(exported)
    ran: list[tuple[int, ...]] = []

    def program(x: torch.Tensor) -> torch.Tensor:        # the package: the branch it was exported with, at any size
        ran.append(tuple(x.shape))
        return x * 2
    args = (torch.randn(2, 16),)
    names, ranges, _ = checked_sizes(within_limits(program, [free], limits), module, args, [free], None, None)
    assert min(width for _, width in ran) == 9 and ran          # probed down to the limit, never past it
    assert ranges[names[0][1]][0] == 9                          # so a call at width 8 runs the original module
    assert within_limits(program, [free], {}) is program        # a runtime's program checks its sizes itself
