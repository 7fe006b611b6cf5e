"""A :class:`~.realized.CompiledRegion`'s calls at input sizes other than the captured ones.

The checked path (:meth:`OtherSizeCalls._other_sizes`) runs the region's program for other sizes
(:mod:`.other_shapes`) and, once it answered, learns the lean calls :meth:`CompiledRegion.__call__
<.realized.CompiledRegion.__call__>` takes from then on: the free-size program's, and that of each
size's own program (:mod:`.size_programs`).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from cuvil_pgc.recompile._stderr import first_line
from cuvil_pgc.recompile.lean_call import leaf_positions
from cuvil_pgc.recompile.onnx_index_checks import IndexCheckFailed

log = logging.getLogger("cuvil_pgc.recompile.apply")      # the name these warnings always had
_Tensor = torch.Tensor


class OtherSizeCalls:
    """The methods of :class:`~.realized.CompiledRegion` for calls at other sizes (a mixin: they
    read the region's ``other_shapes``, its lean calls, ``_lean_call`` and ``_fall_back``)."""

    other_shapes: Any
    sized_bounds: frozenset[int]
    _lean: Any
    _free_lean: Any

    def _other_sizes(self, args: tuple[Any, ...]) -> Any:
        """The program for other input sizes; should it fail (a size its checks did not reach), the
        original module answers the call (counted in ``other_sizes_failures``; the program stays)."""
        try:
            out = self.other_shapes(args)
        except IndexCheckFailed as exc:          # not a failure: the call is eager's to refuse
            return self._fall_back(args, {}, str(exc))
        except Exception as exc:
            self.__dict__["other_sizes_failures"] += 1
            if self.other_sizes_failures == 1:
                log.warning("cuvil-pgc: %s's program for other input sizes failed (%s: %s); the original module "
                            "answers this call (further failures are counted in other_sizes_failures)",
                            self.plan_config, type(exc).__name__, first_line(str(exc), 200))
            return self._fall_back(args, {})
        self.__dict__["other_shape_calls"] += 1      # a plain int: not nn.Module.__setattr__'s checks (~3 µs)
        if self._lean is not None:
            if self._free_lean is None:
                self._learn_free_lean()
            if (sized := self.other_shapes.size_programs) is not None:
                self._learn_sized_lean(sized, args)
        return out

    def _learn_free_lean(self) -> None:
        """The lean call of the program for other sizes (``()`` where it has none), which
        :meth:`__call__` takes for calls at sizes without a program of their own: the checked path
        cost a 2-layer DistilBERT at 20 tokens on OpenVINO 48 µs over the program's own call (one
        process, interleaved; 7 µs of it on warm caches). Its checks are the program's sizes, the
        ids of tables of fixed rows; not where an index is bounded by a size of the inputs."""
        other, lean = self.other_shapes, ()
        positions = other.lean_positions()
        if positions is not None and not self.sized_bounds and not other.index_bounds:
            lean = self._lean_call(positions, program=other.runner) or ()
        self.__dict__["_free_lean"] = lean

    def _learn_sized_lean(self, sized: Any, args: tuple[Any, ...]) -> None:
        """The lean call of the program of its own the size of ``args`` has, once it has one (see
        :mod:`.size_programs`), which :meth:`__call__` then takes: the checks on this path (the
        program for other sizes' fit, the signature, the hooks, the indices) cost more than the
        runtime's own call, a 2-layer BERT at 16 tokens on OpenVINO 187 µs through it against 151 µs
        for the program's call (one process, interleaved). Not where an index is bounded by a size
        of the inputs (a graph's nodes): the lean call checks the bounds of the captured sizes."""
        key = tuple([a.shape for a in args if type(a) is _Tensor])     # as __call__ looks it up
        if key in sized.leans or (own := sized.program(key)) is None \
                or self.sized_bounds or self.other_shapes.index_bounds:
            return
        sized.leans[key] = self._lean_call(leaf_positions(args), program=own)
