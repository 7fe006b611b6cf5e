"""How a built region (:class:`~.realized.CompiledRegion`) sets up its lean call: the array call
of its program with the checks of the captured inputs, learned from the first call that matched
(:meth:`LeanSetup._learn_lean`), the direct call of an AOTInductor package fed nested inputs, and
the binding of keyword calls to the captured positions. A mixin: the methods read the region's
captured ``_spec``, ``_params``, ``index_bounds`` and program (``_compiled``); the call itself is
:meth:`~.realized.CompiledRegion.__call__` (and, in C, :mod:`._leancall`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from cuvil_pgc.recompile.aoti_loader import FastAOTI
from cuvil_pgc.recompile.call_binding import CAPTURED_VALUES
from cuvil_pgc.recompile.index_bounds import IndexBounds, array_checks
from cuvil_pgc.recompile.lean_call import (
    MISFIT,
    VALUE,
    flat_leaves,
    keyword_positions,
    leaf_positions,
    nested_layout,
)


def _global_hooks() -> tuple[dict[Any, Any], ...] | None:
    """The global hook registries (dicts, never replaced) that :meth:`~.realized.CompiledRegion.__call__`
    checks with the module's own hook dicts before its lean path; None on a torch without them
    (then every call takes ``nn.Module``'s dispatch). Bound here once, as the tracing and
    compiling tests (:mod:`.lean_call`, :mod:`.recorded_calls`), not looked up per call: called where the build is deployed, after the
    runtime's work has left the caches cold, the lookups (``torch.nn.modules.module._global_*``,
    ``torch.compiler.is_compiling``) cost 2-3% of a 0.25 ms ONNX Runtime CNN call over the runtime
    called plainly."""
    registries = tuple(getattr(torch.nn.modules.module, name, None) for name in (
        "_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
        "_global_backward_pre_hooks", "_global_forward_hooks_always_called"))
    return None if any(r is None for r in registries) else registries


GLOBAL_HOOKS = _global_hooks()


class LeanSetup:
    """The lean-call set-up methods of :class:`~.realized.CompiledRegion` (see the module)."""

    index_bounds: IndexBounds | None
    _spec: Any
    _lean: Any
    _params: Any
    _keywords: Any
    _extras: Any
    _compiled: Any
    _inference_only: bool
    _positional: Callable[[tuple[Any, ...], dict[str, Any]], tuple[Any, ...] | None]

    def _learn_lean(self, args: tuple[Any, ...]) -> None:
        """The lean call (see :meth:`__call__`) from the first call that matched the region's
        signature: for a runner that learned its output's structure on that call, and for a region
        captured with None or a value (a number, string or bool) among its positional inputs, where
        the call shows its Nones, values and tensors. A tokenizer's mapping that skips parameters
        is such a call (GPT-2's forward takes its cache, ``past_key_values``, before
        ``attention_mask``), and so is a Hugging Face call with ``use_cache=False``: without a spec
        of tensors every call went through nn.Module's dispatch, the hashed signature and the
        runner's generic call, and a 2-layer GPT-2 on OpenVINO ran 0.69 ms deployed against
        0.54 ms for the same compiled model called plainly (an OPT with ``use_cache=False``, 219 µs
        against 121 µs)."""
        self.__dict__["_learned"] = True         # a plain bool, as fallback_calls
        if self._spec is not None and self._lean is None and not self._inference_only:
            # a loaded runner without its output's structure (not JSON-able: a Hugging Face cache, a
            # namedtuple) learns it on its first call; until then it had no lean call, and every call
            # took nn.Module's dispatch (a decoder returning its cache ran 0.206 ms deployed against
            # ONNX Runtime's 0.185 ms called plainly)
            lean = self._lean_call(self._spec)
            if lean is not None:
                self.__dict__["_lean"], self.__dict__["_direct"] = lean, None
            return
        if self._spec is not None or self._lean is not None or all(type(a) is torch.Tensor for a in args):
            return
        layout = nested_layout(args)
        leaves = None if layout is None else flat_leaves(args, layout)
        if leaves is None or not all(a is None or type(a) is torch.Tensor or type(a) in CAPTURED_VALUES for a in leaves):
            return
        nested = None if all(nest is None for nest in layout) else layout
        self.__dict__["_lean"] = self._lean_call(leaf_positions(leaves), nested)
        # an AOTInductor package captured with its tensors nested in dicts, lists or tuples (a
        # recommender's dict of features): its runner on the tensors in the order the export flattened
        # them. Through the package's own call, which parses its call specs and flattens the arguments
        # each time, a dict recommender's region took 66 µs, against 42 µs for eager and 11 for the runner.
        if self._lean is None and nested is not None and hasattr(self._compiled, "loader") \
                and all(type(a) is torch.Tensor for a in leaves):
            self._take_direct(FastAOTI(self._compiled), [(t.shape, t.dtype, t.device, t.stride()) for t in leaves],
                              nested)

    def _take_direct(self, direct: Callable[[Any], Any], spec: list[tuple[Any, ...]],
                     layout: tuple[Any, ...] | None = None) -> None:
        """The direct call of :meth:`__call__`: ``direct`` on tensors captured as ``spec`` ((shape,
        dtype, device, strides) each), the call's positional arguments or, nested as ``layout``
        says, the tensors :func:`~.lean_call.flat_leaves` takes out of them; where torch has the
        global hook registries, and the ids among them can be checked (on CPU tensors, against
        limits that fit their captured shapes: :func:`~.index_bounds.array_checks`)."""
        if GLOBAL_HOOKS is None or self.index_bounds and any(dev.type != "cpu" for _, _, dev, _ in spec):
            return
        ids = array_checks(spec, self.index_bounds)
        if ids is not None:                      # None: a limit that does not fit the captured inputs
            self.__dict__.update(_direct=direct, _direct_ids=ids, _direct_spec=spec, _direct_layout=layout)

    def _lean_call(self, positions: list[tuple[Any, ...] | None], layout: tuple[Any, ...] | None = None,
                   program: Any = None) -> tuple[Any, ...] | None:
        """What the lean call of :meth:`__call__` takes for positional inputs that are each a tensor,
        (shape, dtype, device, strides), None (a (None, None) check) or a value the program holds,
        (:data:`~.lean_call.VALUE`, value): the runner's array call
        (:meth:`~.runtime_region.RuntimeRunner.lean_parts`), and its id inputs, checked on the arrays
        it hands the runtime. ``positions`` are the leaves of arguments nested as ``layout`` says
        (:func:`~.lean_call.nested_layout`; None: not nested); ``program``: a runner other than the
        region's (a size's own, :meth:`_learn_sized_lean`). None where the program has no array
        call for them."""
        tensors = [p for p in positions if p is not None and p[0] is not VALUE]
        lean_parts = getattr(self._compiled if program is None else program, "lean_parts", None)
        parts = lean_parts(tensors) if lean_parts is not None and GLOBAL_HOOKS is not None and tensors else None
        if parts is None:
            return None
        ids = array_checks(tensors, self.index_bounds)
        if ids is None:                  # a limit that does not fit the captured inputs: the checked path
            return None
        _, checks, run, single, build = parts
        taken = iter(checks)
        sized = any(len(shape) for shape, *_ in tensors)      # whether a traced call shows in its sizes
        return (len(positions) if layout is None else len(layout),
                [(None, None) if p is None else p if p[0] is VALUE else next(taken) for p in positions],
                run, single, build, ids, sized, layout)

    def _keyword_call(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """A keyword call as the positional call the lean call takes (see :meth:`_positional`), bound
        by :func:`~.lean_call.keyword_positions` where it names the captured positions (and the
        extras seen before), the long way otherwise, which learns its extras."""
        keywords = self._keywords
        if keywords is None and self._params is not None and len(self._params) >= self._lean[0]:
            fill = self._spec is None                    # learned with its Nones: left-out positions take defaults
            captured = self._params[:self._lean[0]]
            keywords = self.__dict__["_keywords"] = (
                tuple(name for name, _ in captured),
                tuple(default if fill and default is not inspect.Parameter.empty else MISFIT for _, default in captured))
        positional = keyword_positions(args, kwargs, *keywords, self._extras) if keywords is not None else None
        if positional is None and (positional := self._positional(args, kwargs)) is not None and keywords is not None:
            self._extras.update((name, value) for name, value in kwargs.items()
                                if name not in keywords[0] and type(value) in (bool, int, float, str, type(None)))
        return positional
