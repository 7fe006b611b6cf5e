"""Conv + BatchNorm folding in eval mode: the BN's scale and shift go into the conv's weight and
bias (:func:`fold_conv_bn`), pairs found by tracing each parent with ``torch.fx``
(:func:`conv_bn_pairs`)."""

from __future__ import annotations

import torch
from torch import nn

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_BNS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


def fold_conv_bn(conv: nn.Module, bn: nn.Module) -> None:
    """Fold eval-mode ``bn`` into ``conv`` in place (weight and bias)."""
    with torch.no_grad():
        scale = bn.weight / torch.sqrt(bn.running_var + bn.eps) if bn.affine else \
            1.0 / torch.sqrt(bn.running_var + bn.eps)
        shift = (bn.bias if bn.affine else 0.0) - bn.running_mean * scale
        conv.weight.mul_(scale.reshape(-1, *([1] * (conv.weight.dim() - 1))))
        bias = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
        conv.bias = nn.Parameter(bias * scale + shift)


def conv_bn_pairs(parent: nn.Module) -> list[tuple[str, str]]:
    """(conv_name, bn_name) children of ``parent`` where the conv's only user is the bn (via fx)."""
    import torch.fx as fx

    children = dict(parent.named_children())
    if not any(isinstance(m, _CONVS) for m in children.values()) or \
            not any(isinstance(m, _BNS) for m in children.values()):
        return []
    try:
        graph = fx.Tracer().trace(parent)
    except Exception:   # not symbolically traceable (data-dependent control flow): no folding here
        return []
    uses: dict[str, int] = {}
    for node in graph.nodes:
        if node.op == "call_module":
            uses[node.target] = uses.get(node.target, 0) + 1
    pairs = []
    for node in graph.nodes:
        if node.op != "call_module" or not isinstance(children.get(node.target), _CONVS):
            continue
        users = list(node.users)
        if len(users) == 1 and users[0].op == "call_module" and isinstance(children.get(users[0].target), _BNS) \
                and uses.get(node.target) == 1 and uses.get(users[0].target) == 1:
            pairs.append((node.target, users[0].target))
    return pairs
