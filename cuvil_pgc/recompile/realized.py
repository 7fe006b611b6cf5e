"""What realizing a candidate gives: a :class:`Realized` region, its :class:`CompiledRegion`
module (:class:`~.export_error.ExportError` says why an exporter cannot capture one).

Shared by :mod:`.apply` (torch.compile, AOTInductor, CUDA graphs) and :mod:`.runtime_build`
(ONNX Runtime, OpenVINO, TensorRT), which builds regions for ``apply`` and so sits below it.
"""

from __future__ import annotations

import copy
import logging
import sys
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from cuvil_pgc._example_inputs import forward_parameters
from cuvil_pgc.recompile.aoti_loader import FastAOTI
from cuvil_pgc.recompile.call_binding import (
    bind_call,
    in_captured_layout,
    keyword_count,
    matches,
    spec_misfit,
)
from cuvil_pgc.recompile.index_bounds import IndexBounds, Limit, describe, out_of_range
from cuvil_pgc.recompile.lean_call import (
    MISFIT,
    autocast_enabled,
    flat_leaves,
    ids_fit,
    is_tracing,
    lean_call,
)
from cuvil_pgc.recompile.lean_setup import GLOBAL_HOOKS, LeanSetup
from cuvil_pgc.recompile.matching import input_signature
from cuvil_pgc.recompile.onnx_index_checks import IndexCheckFailed
from cuvil_pgc.recompile.other_size_calls import OtherSizeCalls
from cuvil_pgc.recompile.recorded_calls import call_leaves, compiling, recorded
from cuvil_pgc.recompile.region_hooks import COLLECTING, collecting, hf_collector, hook_reason, hooked_inside
from cuvil_pgc.recompile.region_state import load_into_original, state_dict_as_original

log = logging.getLogger("cuvil_pgc.recompile.apply")      # the name these warnings always had

#: the version of a built region's call (what it checks, how it hands the program its inputs): a
#: measurement recorded through another version is not reused (:func:`~.apply.measurement_key`).
#: 2: nested inputs (dicts, lists of tensors) take the lean call; its checks run in C
#: 3: the whole lean call runs in C; an AOTInductor package fed nested inputs takes the direct call;
#: outputs of nested plain containers and ModelOutputs holding tuples (hidden_states) built without the pytree
#: 4: objects rebuilt attribute by attribute (Dynamo lost a decoding step's cache rebuilt by __dict__.update,
#: and the torch.compile candidates of every step failed: their recorded failures are not reused)
CALL_VERSION = 4


@dataclass
class Realized:
    module: nn.Module
    artifact: str | None = None        # AOTInductor package path, when the backend made one
    rewrites: list[str] = field(default_factory=list)


class CompiledRegion(LeanSetup, OtherSizeCalls, nn.Module):
    """Runs ``compiled`` for inputs matching the captured ones; the original module otherwise
    (counted in ``fallback_calls``, warned once).

    ``spec`` ([shape, dtype, device, strides] per positional tensor) makes the per-call check a
    few attribute comparisons; without it the slower hashed ``signature`` is compared. A
    torch.compile program is held to the captured inputs too, and to calls without autograd
    recording: for any other call Dynamo would compile again, with the build's autotuning, which
    stalled a service for 23 s on a new batch size and 63 s on a call outside ``no_grad``.
    """

    def __init__(self, original: nn.Module, compiled: Any, signature: str | None, config: str,
                 spec: list[list[Any]] | None = None, index_bounds: IndexBounds | None = None) -> None:
        super().__init__()
        self.original = original
        self.training = False            # a build computes in eval mode; .train() makes it run the original module
        self._compiled = compiled          # not a submodule: an AOTI runner or an OptimizedModule
        self.signature = signature
        #: the candidate's configuration (``ort+opt=extended``); not ``config``, which a Hugging Face
        #: model's own config answers (see :meth:`__getattr__`)
        self.plan_config = config
        self._spec = None if spec is None else [(torch.Size(shape), getattr(torch, dtype), torch.device(dev),
                                                 tuple(strides)) for shape, dtype, dev, strides in spec]
        #: input position -> rows of the tensor it indexes (:mod:`.index_bounds`): a call with an
        #: index outside them runs the original module, which raises as eager does
        self.index_bounds = dict(index_bounds.rows) if index_bounds else {}
        #: the positions whose bound holds for the captured sizes only (no program for other sizes)
        self.sized_bounds = index_bounds.sized if index_bounds else frozenset()
        self._fast = None            # exactly the captured positional tensors: skip the generic call
        self._lean = None            # a runtime's own array call, taken before nn.Module's dispatch
        self._direct = None          # the program's call on the captured tensors, taken before nn.Module's dispatch
        self._learned = False        # the lean call was looked for on a matching call (see _learn_lean)
        #: a torch.compile program, which recompiles (with autotuning, for seconds to minutes) for a
        #: call its guards did not see: calls with autograd recording run the original module
        self._inference_only = _is_dynamo_module(compiled)
        if self._spec is not None and not self._inference_only:
            self._fast = FastAOTI(compiled) if hasattr(compiled, "loader") else getattr(compiled, "call_positional", None)
            self._lean = self._lean_call(self._spec)
        #: the index inputs the direct call checks (:func:`~.index_bounds.array_checks`): on CPU tensors only
        self._direct_ids: tuple[tuple[int, Any, int, Any], ...] = ()
        #: the tensors the direct call takes, and how the call nests them (None: they are its
        #: positional arguments; see :meth:`_take_direct`)
        self._direct_spec, self._direct_layout = self._spec, None
        # a runtime's runner that learns its output's structure on the first call gets its lean
        # call then (:meth:`_learn_lean`, in :meth:`forward`): no direct call, which would skip it
        learns_lean = hasattr(compiled, "lean_parts") and getattr(compiled, "template", None) is None
        if self._spec is not None and self._lean is None and not learns_lean:
            self._take_direct(self._fast or (lambda args: compiled(*args)), self._spec)
        self.fallback_calls = 0
        #: why the first call that ran the original module did (None: none has)
        self.first_fallback: str | None = None
        #: torch's hook-handle counter when no module inside the region had a hook (-1: look again)
        self._hooks_seen = -1
        #: transformers' collector, where Hugging Face hooks inside the region collect for a model
        #: outside it (:func:`~.region_hooks.hf_collector`; None: none do), as of the last look
        self._collector: Any = None
        #: torch's hook-handle counter when, besides, no hook was on the region itself or global
        #: (-1: look again; see :meth:`_quiet`)
        self._quiet_at = -1
        #: the program for other input sizes (:class:`~.other_shapes.OtherShapes`; None: the original
        #: module runs them), and how many calls it ran
        self.other_shapes: Any = None
        self.other_shape_calls = 0
        #: why a build made for other sizes (``--dynamic``) has no program for them here (None: it
        #: was not made for them, or it has one)
        self.other_sizes_refused: str | None = None
        #: its lean call (None: not made yet; ``()``: it has none; see :meth:`_learn_free_lean`)
        self._free_lean: tuple[Any, ...] | None = None
        self.other_sizes_failures = 0
        #: the original forward's (name, default) per parameter, which keyword calls are bound by
        self._params = forward_parameters(original) if signature is not None else None
        #: the lean call's keyword binding (see :meth:`_keyword_call`; None: not made yet), and the
        #: keywords past the captured positions seen to bind, at their values (``return_dict=True``)
        self._keywords: tuple[tuple[str, ...], tuple[Any, ...]] | None = None
        self._extras: dict[str, Any] = {}
        self.weights_changed = False    # weights loaded since the build differ from the ones it was built with
        #: the first setting inside the region set, since the build was loaded, to another value than
        #: it had then (``temperature``; see :mod:`.setting_watch`): it runs the original module
        self.settings_stale: str | None = None
        self._watch: Any = None         # its :class:`~.setting_watch.Watch`, once watched
        self._paused: tuple[Any, Any] = (None, None)     # the fast paths while settings_stale
        self.register_state_dict_post_hook(state_dict_as_original)
        self.register_load_state_dict_pre_hook(load_into_original)
        self._quiet()                   # the first call may take the lean path
        self.__dict__["_forwarding"] = True

    def __setattr__(self, name: str, value: Any) -> None:
        """An attribute the region does not have, and its original module does, is set there: the
        caller's code sets a region as the module it replaced (``model.temperature = 2.5``), as it
        reads it (:meth:`__getattr__`), and the setting watch then runs the original module."""
        original = self.__dict__.get("_modules", {}).get("original")
        if self.__dict__.get("_forwarding") and name not in self.__dict__ and name != "training" \
                and original is not None and not hasattr(type(self), name) and hasattr(original, name):
            setattr(original, name, value)
        else:
            super().__setattr__(name, value)

    def watch_settings(self, skip: Any = ()) -> None:
        """Run the original module while a setting inside the region differs from the one it had
        now (:mod:`.setting_watch`); ``skip``: the attributes its forward writes."""
        from cuvil_pgc.recompile.setting_watch import watch_region

        self.__dict__["_watch"] = watch_region(self, self.original, skip)

    def settings_changed(self, path: str | None) -> None:
        """The setting watch's report: ``path`` set to another value (the region runs the original
        module until it is set back), or None: every setting is as it was at load."""
        if path is not None and self.settings_stale is None:
            self.__dict__["_paused"], self.__dict__["_lean"], self.__dict__["_direct"] = \
                (self._lean, self._direct), None, None
            log.warning("cuvil-pgc: %s: %s was set to another value than the build was made with (its program holds "
                        "that one): the original module runs until it is set back; recompile for the new value",
                        self.plan_config, path)
        elif path is None and self.settings_stale is not None:
            if not self.weights_changed:          # (weights loaded meanwhile: the original module from now on)
                self.__dict__["_lean"], self.__dict__["_direct"] = self._paused
            self.__dict__["_paused"] = (None, None)
        self.__dict__["settings_stale"] = path

    def _original(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The original module's call; what it writes into its modules is not a setting changed."""
        watch = self._watch
        if watch is None:
            return self.original(*args, **kwargs)
        watch.running += 1
        try:
            return self.original(*args, **kwargs)
        finally:
            watch.running -= 1

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """For exactly the captured tensors, when nothing hooks into this module or traces it: the
        runtime's array call (:meth:`~.runtime_region.RuntimeRunner.lean_parts`, CPU tensors), or
        the program's own call (an AOTInductor package's runner, a torch.compile program, a
        runtime's tensor call) where its inputs need no autograd and no autocast. ``nn.Module``'s
        dispatch and :meth:`forward`, which check the same and more, otherwise.

        Checked here, inline, not in calls of their own: where a build is deployed, the runtime's
        work leaves the caches cold between calls, and each further Python call on this path cost
        about 1-1.5% of the zoo transformer's 80 µs OpenVINO call (measured in processes of their
        own against the runtime called plainly). Right after its package's run, the zoo MLP's
        AOTInductor region took 9.4 µs through the dispatch and 5.1 through this path (medians of
        three runs in one process, a trivial program timed after each run of the package). A
        runtime's lean call is one call, in C where it was built (:func:`~.lean_call.lean_call`:
        the hooks, the mode, autocast, the inputs, the runtime and the output's rebuild), which
        also tells a call torch.jit traces by its sizes. Dynamo's test stays here: Dynamo, tracing
        a parent, reads it as it evaluates this code."""
        lean = self._lean
        if lean is not None:
            if not compiling() and (positional := self._keyword_call(args, kwargs) if kwargs else args) is not None:
                try:
                    out = lean_call(self, lean, positional)
                except IndexCheckFailed as exc:      # an index the program computes is out of range
                    return self._fall_back(args, kwargs, str(exc))
                if out is not MISFIT:
                    return out
                other = self.other_shapes            # nothing hooks in: skip the dispatch here too
                # other sizes: the lean call of the size's own program (.size_programs), or of the free-size one
                sized = other.size_programs if other is not None else None
                own = sized.lean(tuple([a.shape for a in positional if type(a) is _Tensor])) \
                    if sized is not None and sized.leans else None
                free = own is None and other is not None and self._free_lean
                if own is not None or free:
                    try:
                        out = lean_call(self, own or free, positional)
                    except IndexCheckFailed as exc:
                        return self._fall_back(args, kwargs, str(exc))
                    except Exception:                # a size its checks did not reach: as the checked path does
                        return self._other_sizes(positional)
                    if out is not MISFIT:
                        self.__dict__["other_shape_calls"] += 1
                        # counted toward the size's own program; its lean call taken once it has one
                        if free and sized is not None and sized.runner(
                                tuple([a for a in positional if type(a) is _Tensor]), positional) is not None:
                            self._learn_sized_lean(sized, positional)
                        return out
                if other is not None and len(positional) == lean[0] and not is_tracing() \
                        and (RemovableHandle.next_id == self._quiet_at or self._quiet()) \
                        and other.fits(positional) and not self._matches(positional, {}) \
                        and not self._eager_only(positional, {}, other_sizes=True):
                    return self._other_sizes(positional)
        elif (direct := self._direct) is not None and (RemovableHandle.next_id == self._quiet_at or self._quiet()) \
                and not (self.training or compiling() or autocast_enabled()):
            spec, layout = self._direct_spec, self._direct_layout
            tensors = args if layout is None else flat_leaves(args, layout) if len(args) == len(layout) else None
            if not kwargs and tensors is not None and len(tensors) == len(spec) and not is_tracing() \
                    and not (self._inference_only and torch.is_grad_enabled()):
                for a, (shape, dtype, device, strides) in zip(tensors, spec, strict=True):
                    if type(a) is not _Tensor or a.requires_grad or a.shape != shape or a.dtype is not dtype \
                            or a.device != device or a.stride() != strides:
                        break
                else:                                   # an index out of range: forward raises eager's error
                    if not (ids := self._direct_ids) or ids_fit(tensors, ids):
                        try:
                            return direct(tensors)
                        except IndexCheckFailed as exc:
                            return self._fall_back(args, kwargs, str(exc))
        return super().__call__(*args, **kwargs)

    def __deepcopy__(self, memo: dict[int, Any]) -> CompiledRegion:
        """A copy with its own original module (weights, buffers, counters) that shares the compiled
        program: a runtime session, an AOTInductor runner or a compiled module is read-only once
        built, holds native state that cannot be copied, and rebuilding it would take the build's
        compile time again. Services copy a model to serve replicas or keep a reference copy."""
        for shared in (self._compiled, self._fast, self._lean, self._direct, *self._paused, self.other_shapes,
                       self._keywords, self._free_lean, self._collector,    # (transformers' collector: a ContextVar)
                       self._watch):                   # (replaced below: the copy's modules watched for the copy)
            memo[id(shared)] = shared
        clone = object.__new__(type(self))
        memo[id(self)] = clone
        for key, value in self.__dict__.items():
            clone.__dict__[key] = copy.deepcopy(value, memo)
        if self._watch is not None:
            clone.watch_settings(self._watch.skip)
        return clone

    def __copy__(self) -> CompiledRegion:
        clone = object.__new__(type(self))
        clone.__dict__.update({k: (dict(v) if isinstance(v, dict) else v) for k, v in self.__dict__.items()})
        return clone

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(f"cuvil-pgc: a loaded build cannot be pickled ({self.plan_config} runs a compiled program that "
                        "lives in this process): pickle or torch.save the model's state_dict instead, and in the "
                        "other process call load_build on the .cuvilpkg (copy.deepcopy works within a process)")

    def __getattr__(self, name: str) -> Any:
        """An attribute the region does not have is the original module's: the caller's code reads
        a region as the module it replaced (a parent's ``self.proj.weight`` or
        ``self.conv.out_channels``, a service's ``model.config`` or ``model.generate(...)``, which
        then runs the original module). nn.Module's own lookup (parameters, buffers, submodules)
        comes first; special names are never forwarded (copying and pickling stay the region's)."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            original = self.__dict__.get("_modules", {}).get("original")
            if original is None or name.startswith("__"):
                raise
            value = getattr(original, name)
            if name in BYPASSING and callable(value) and not self.__dict__.get("_told_bypass"):
                self.__dict__["_told_bypass"] = True
                log.warning("cuvil-pgc: %s() runs the original module: it calls the model's own forward (with a "
                            "cache and positions the build was not captured with), not the build's program, which "
                            "serves calls of the loaded model itself", name)
            return value

    @property
    def compiled(self) -> Any:
        """What runs for the captured inputs (an AOTInductor runner, a compiled module, a runtime session)."""
        return self._compiled

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.weights_changed or self.settings_stale is not None:
            return self._original(args, kwargs)
        if self.signature is None:
            why = recorded(args, kwargs) or (TRAINING if self.training else None)
            if self._held_by_hooks() is None and why is None:
                return self._compiled(*args, **kwargs)
            return self._fall_back(args, kwargs, why)
        if kwargs and (self._spec is not None or not self._matches(args, kwargs)) \
                and (positional := self._positional(args, kwargs)) is not None:
            args, kwargs = positional, {}       # (a call captured with keywords matches as it is)
        matched = self._matches(args, kwargs)
        if not matched and (laid := in_captured_layout(self._spec, args, kwargs)) is not None:
            args, matched = laid, True           # other strides of the captured sizes: copied into the captured ones
        if matched:
            if self._eager_only(args, kwargs) is not None:
                return self._fall_back(args, kwargs)
            try:
                if self._fast is not None and not kwargs:
                    out = self._fast(args)
                    if not self._learned:        # the runner may have learned its output's structure just now
                        self._learn_lean(args)
                    return out
                if not self._learned and not kwargs:
                    self._learn_lean(args)
                return self._compiled(*args, **kwargs)
            except IndexCheckFailed as exc:      # an index the program computes is out of range
                return self._fall_back(args, kwargs, str(exc))
        if self.other_shapes is not None and not kwargs and self.other_shapes.fits(args) \
                and self._eager_only(args, kwargs, other_sizes=True) is None:
            return self._other_sizes(args)
        return self._fall_back(args, kwargs)

    def _eager_only(self, args: tuple[Any, ...], kwargs: dict[str, Any], other_sizes: bool = False) -> str | None:
        """Why a call that fits the build's inputs must still run the original module: autocast
        (eager's outputs would be bf16 or fp16), autograd recorded through an input (the programs
        record none), and for a torch.compile program anything its guards would compile again for;
        a user's hook on a module inside the region, which no compiled program calls; a call
        torch.jit traces or torch.export exports, which record what runs (:func:`~.recorded_calls.recorded`); the
        region in training mode (:data:`TRAINING`); and an index
        out of range (for a call of ``other_sizes``, the indices into tensors sized by the inputs
        are the program for other sizes' to check, against the call's own sizes)."""
        held = self._held_by_hooks()
        if held is not None:
            return held
        # positional plain tensors (the usual call) are their own leaves: the pytree walk was about a
        # third of this wrapper's cost per call over a torch.compile program's (2-vCPU machine)
        leaves = call_leaves(args, kwargs)
        why = recorded(args, kwargs, leaves)
        if why is not None:
            return why
        if self.training:
            return TRAINING
        if self.index_bounds:
            bad = self._id_out_of_range([t for t in leaves if isinstance(t, torch.Tensor)], other_sizes)
            if bad is not None:
                return (f"input {bad[0]} holds an index outside {describe(bad[1])}, the rows of what it indexes: the "
                        "build's programs do not check indices as eager does, and the original module raises "
                        "eager's error")
        if autocast_enabled():
            return "it was called under autocast, which the build's programs do not follow (they compute in " \
                   "the precision they were built with)"
        grad = torch.is_grad_enabled()
        if grad and self._inference_only:
            return ("it was called with autograd recording, where torch.compile would compile it again, for "
                    "autograd; call the model under torch.inference_mode() or torch.no_grad()")
        if grad or self._inference_only:
            if any(isinstance(t, torch.Tensor) and t.requires_grad for t in leaves):
                return ("an input requires grad: the build's programs record no autograd; detach it, or call the "
                        "model under torch.inference_mode()")
        return None

    def _hooked(self) -> str | None:
        """The first module inside the region (the original itself included) with a forward or
        forward-pre hook of the user's, or None. Such a hook (to log or capture a layer's output,
        or to change it) would otherwise never run: the region's program does not call its
        modules. torch's own hooks (the old ``weight_norm`` and ``spectral_norm`` recompute a
        weight in a pre-hook) are part of the model the program was exported from. Looked for again
        only when torch has handed out a hook handle since the last look found none
        (``RemovableHandle.next_id``): one comparison per call, also on the lean path."""
        if RemovableHandle.next_id == self._hooks_seen:
            return None
        hooked = hooked_inside(self.original)
        if hooked is None:
            self.__dict__["_hooks_seen"] = RemovableHandle.next_id       # a plain int, as fallback_calls
            self.__dict__["_collector"] = hf_collector(self.original)
        return hooked

    def _held_by_hooks(self) -> str | None:
        """Why hooks inside the region keep this call from its program (None: they do not): a
        user's hook (:meth:`_hooked`), or Hugging Face's, collecting now for their model's forward."""
        hooked = self._hooked()
        if hooked is not None:
            return hook_reason(hooked)
        collector = self._collector
        return COLLECTING if collector is not None and collecting(collector) else None

    def _quiet(self) -> bool:
        """Whether nothing hooks into this region's call: no hook of the user's inside it (see
        :meth:`_hooked`), none on the region itself and no global module hook, which nn.Module's
        dispatch would run and :meth:`__call__`'s lean and direct calls skip. Every registration
        of a hook, global ones included, hands out a handle, so the answer holds until torch's
        handle counter (``RemovableHandle.next_id``) moves: the lean path compares that one
        integer. Reading the nine hook registries on each call instead cost 2.5-3 µs of a
        0.27 ms OpenVINO call (the zoo's tiny BERT, in one process, interleaved: between a
        runtime's inferences every line of Python runs on cold caches). A region whose Hugging Face
        hooks collect for a model outside it is never quiet: whether they collect is each call's."""
        if self._hooked() is not None or self._forward_hooks or self._forward_pre_hooks or self._backward_hooks \
                or self._backward_pre_hooks or _forward or _forward_pre or _backward or _backward_pre or _always \
                or self._collector is not None:     # whether they collect is the call's: forward asks each time
            return False
        self.__dict__["_quiet_at"] = RemovableHandle.next_id        # a plain int, as fallback_calls
        return True

    def _id_out_of_range(self, leaves: Any, other_sizes: bool = False) -> tuple[int, Limit] | None:
        """The first (input, rows) whose input holds an id outside the table it indexes, or None
        (``leaves``: the call's tensors in the order the export flattened them; ``other_sizes``:
        the bounds that hold for the captured sizes only are not checked)."""
        for i, rows in self.index_bounds.items():
            if other_sizes and i in self.sized_bounds:
                continue
            if i < len(leaves) and out_of_range(leaves[i], rows):
                return i, rows
        return None

    def _fall_back(self, args: tuple[Any, ...], kwargs: dict[str, Any], why: str | None = None) -> Any:
        """The original module's answer to a call the build's program does not take (``why``: the
        reason, where the call's arguments do not tell it)."""
        self.__dict__["fallback_calls"] += 1         # a plain int: not nn.Module.__setattr__'s checks
        if self.fallback_calls == 1:
            self.__dict__["first_fallback"] = why or self._misfit(args, kwargs)
            log.warning("cuvil-pgc: %s runs the original module: %s (further calls that do not fit are counted "
                        "in fallback_calls)", self.plan_config, self.first_fallback)
        return self._original(args, kwargs)

    def _positional(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        """A keyword call as the positional call the build was captured with (``model(input_ids=ids,
        attention_mask=mask)`` for one captured as ``model(ids, mask)``), by the original forward's
        parameter names; keywords past the captured ones may only repeat their defaults, or what the
        model's Hugging Face config sets (:func:`~.call_binding.bind_call`). None when the call does not map
        onto the captured positions."""
        params = self._params            # None where there is no captured signature to bind to
        if params is None:
            return None
        if self._spec is not None:
            return self._bound(args, kwargs, len(self._spec), fill=False)   # tensors only: none skipped
        if self._lean is not None:       # learned with its Nones (see _learn_lean): the lean call checks them
            return self._bound(args, kwargs, self._lean[0])
        # captured with nested or non-tensor arguments (a mapping of inputs that skipped parameters
        # was captured with their defaults in their places): the binding whose signature is the captured one
        count = keyword_count(params, args, kwargs)
        other = self.other_shapes        # or a call its program for other sizes fits
        for n in range(count, len(args) - 1, -1):
            positional = self._bound(args, kwargs, n)
            if positional is not None and (input_signature((positional, {})) == self.signature
                                           or other is not None and other.fits(positional)):
                return positional
        return None

    def _bound(self, args: tuple[Any, ...], kwargs: dict[str, Any], count: int,
               fill: bool = True) -> tuple[Any, ...] | None:
        """The call with its first ``count`` parameters positional (see :meth:`_positional`)."""
        return bind_call(self._params, self.original, args, kwargs, count, fill)

    def _misfit(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """Why a call does not fit the build (for its one warning)."""
        why = self._eager_only(args, kwargs)
        if why is not None:
            return why
        if self.other_shapes is not None and not kwargs:
            return self.other_shapes.misfit(args) or "the inputs differ from the captured ones"
        return spec_misfit(self._spec, args, kwargs, self._params, self.other_sizes_refused)

    def _matches(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        return matches(self._spec, self.signature, args, kwargs)


def _is_dynamo_module(program: Any) -> bool:
    """Whether ``program`` is what ``torch.compile`` returns for a module (its OptimizedModule);
    without importing Dynamo, which a build running only runtimes never needs."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return eval_frame is not None and isinstance(program, eval_frame.OptimizedModule)


# module globals, one cached lookup each in CompiledRegion.__call__
_forward, _forward_pre, _backward, _backward_pre, _always = GLOBAL_HOOKS or ({},) * 5
_Tensor = torch.Tensor
#: methods of a model that call its forward themselves, so never the region wrapping it (Hugging
#: Face's ``generate``): the first lookup through a region says so
BYPASSING = ("generate",)

#: why a region in training mode (``model.train()`` after ``load_build``) runs the original module:
#: its programs were built in eval mode, and answered without dropout and with batch norm's running
#: statistics, where the model in training mode drops and normalizes by the batch
TRAINING = ("it is in training mode (model.train()), and the build's programs compute in eval mode (no dropout, "
            "batch norm's running statistics): call model.eval() to run them")


def first_fallback(module: nn.Module) -> str | None:
    """Why a build region in ``module`` (or ``module`` itself) ran its original module, for the
    first such region; None where every region ran its program."""
    return next((m.first_fallback for m in module.modules() if isinstance(m, CompiledRegion) and m.fallback_calls),
                None)
