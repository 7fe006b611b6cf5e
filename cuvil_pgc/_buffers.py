"""Putting a module's buffers back as they were before a call: the one mechanism behind the model
factory's check call (:func:`buffers_kept`) and recompile's stateful-model checks and calls
(:mod:`cuvil_pgc.recompile.stateless`)."""

from __future__ import annotations

from typing import Any


def restore_buffer(owner: Any, name: str, t: Any, value: Any) -> None:
    """Give ``owner``'s buffer ``name`` the values ``value`` in the tensor ``t`` it had before the
    call, reattached where the call assigned another tensor; where the call resized ``t`` in place
    (a cache grown by its first call), a copy of ``value`` takes its place."""
    import torch

    if t.shape != value.shape or t.dtype != value.dtype or t.layout != value.layout:
        t = value.clone()
    else:
        with torch.no_grad(), torch.inference_mode(t.is_inference()):
            t.copy_(value)
    buffers = owner._buffers        # a TorchScript module's is a wrapper without ``get``
    if name not in buffers or buffers[name] is not t:
        buffers[name] = t


def buffers_kept(model: Any) -> Any:
    """A function that gives each buffer of ``model`` (an ``nn.Module``; nothing otherwise) its value
    from now (:func:`restore_buffer`). A check call must leave the model as the factory made it: in
    training mode it moved batch norm's running statistics (a model whose factory forgot
    ``.eval()``), and a streaming model's forward moves its counters, so the searching process's
    eager model computed otherwise than the same factory's model in the race's worker process, and
    eager's race there was refused."""
    import torch

    if not isinstance(model, torch.nn.Module):
        return lambda: None
    saved = [(owner, name, t, t.detach().clone()) for owner in model.modules()
             for name, t in owner._buffers.items() if t is not None]

    def put_back() -> None:
        for owner, name, t, value in saved:
            restore_buffer(owner, name, t, value)
    return put_back
