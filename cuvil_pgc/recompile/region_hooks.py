"""Which hooks keep a compiled region from running its program.

A build's programs (an AOTInductor package, an ONNX Runtime or OpenVINO graph) do not call the
forward hooks and forward-pre hooks registered on the modules inside a region: a region holding a
user's hook runs its original module, so the hook runs (the search lists it as ``runs_original``,
:class:`~.realized.CompiledRegion` checks again at run time). Torch's own hooks, and Hugging Face's
output-capturing hooks do not count: those whose model is inside the region collect into the
program's outputs; those of a model outside it collect only while that model's forward asks for
hidden states or attentions (:func:`hf_collector`), and the region runs its original module for
those calls alone (:func:`collecting`).
"""

from __future__ import annotations

import sys
from typing import Any

from torch import nn


def hooked_inside(module: nn.Module) -> str | None:
    """The first module inside ``module`` (itself included, as ``the original module``) with a
    forward or forward-pre hook that is neither torch's own nor a Hugging Face output-capturing
    hook, or None."""
    for name, inner in module.named_modules():
        for hooks in (inner._forward_pre_hooks, inner._forward_hooks):
            if any(not _torch_own(hook) and not _hf_capturing(hook) for hook in hooks.values()):
                return repr(name) if name else ORIGINAL
    return None


#: what :func:`hooked_inside` answers for a hook on the module itself
ORIGINAL = "the original module"
#: the hint for such a hook: a service keeps it by registering it after loading
ONE_OF_ITS_OWN = (", and so does one registered, after load_build, on the module load_build returns in its place: "
                  "a service's monitoring hook runs around the program there")


def hf_collector(module: nn.Module) -> Any:
    """Where Hugging Face output-capturing hooks inside ``module`` whose model is outside it find
    what to collect into (transformers' ``_active_collector``), or None where there are none. Such
    a hook does nothing unless its model's forward asked for hidden states or attentions; then the
    region must run its original module, whose layers it hooks (:func:`collecting`)."""
    for name, inner in module.named_modules():
        for hooks in (inner._forward_pre_hooks, inner._forward_hooks):
            if any(_hf_capturing(hook) and not _captured_by_the_program(hook, module, name) for hook in hooks.values()):
                found = getattr(sys.modules.get(HF_OUTPUT_CAPTURING), "_active_collector", None)
                return found if callable(getattr(found, "get", None)) else _Unreadable()
    return None


class _Unreadable:
    """The collector of a transformers that keeps it where this version does not look: every call
    is taken to collect (:func:`collecting`), so the region runs its original module, as before."""

    def get(self) -> Any:
        raise LookupError("transformers' output collector is not where cuvil-pgc looks for it")


def collecting(collector: Any) -> bool:
    """Whether the forward being run asks the hooks of ``collector`` for something (transformers
    sets it to an empty dict for every call of a model that asks for nothing)."""
    try:
        return bool(collector.get())
    except Exception:        # a transformers whose collector reads otherwise: as if it collected
        return True


#: why a region ran its original module for a call whose model collects its layers' outputs
COLLECTING = ("the model's forward asked for hidden states or attentions, which Hugging Face hooks on the layers "
              "inside the region collect: the original module runs them for such calls")


def _hf_capturing(hook: Any) -> bool:
    return getattr(hook, "__module__", None) == HF_OUTPUT_CAPTURING


#: where transformers (5 and later) defines the hooks it installs on a model's layers the first time
#: a call asks for ``output_hidden_states`` or ``output_attentions``
HF_OUTPUT_CAPTURING = "transformers.utils.output_capturing"


def _captured_by_the_program(hook: Any, region: nn.Module, name: str) -> bool:
    """Whether ``hook`` (on the module at ``name`` inside ``region``) is a Hugging Face
    output-capturing hook of a model that is itself inside the region. Such a hook does nothing
    unless its model's forward has a collector active, and whatever it collects goes into that
    forward's output: a program exported from the region traced it into its outputs. (Inside a
    region below the model, the collector belongs to a forward outside it, and the hook must run.)"""
    if not _hf_capturing(hook):
        return False
    parts = name.split(".") if name else []
    for depth in range(len(parts) + 1):
        owner = region.get_submodule(".".join(parts[:depth]))
        if any(c.__name__ == "PreTrainedModel" and c.__module__.startswith("transformers.") for c in type(owner).__mro__):
            return True
    return False


def hook_reason(hooked: str) -> str:
    return (f"a hook is registered on {hooked}, which the build's programs do not call (the original module "
            "does, as long as the hook stays)")


def _torch_own(hook: Any) -> bool:
    """Whether a hook is torch's own (defined in a ``torch`` module), not the user's."""
    owner = getattr(hook, "__module__", None) or type(hook).__module__
    return owner == "torch" or owner.startswith("torch.")
