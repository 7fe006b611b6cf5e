"""Attention rewrites: :class:`MathMultiheadAttention` (self-attention as matmul + softmax +
matmul) and :class:`ZeroPaddedTransformerEncoder` (zeros at the padded positions, as eager's
nested-tensor path returns); see :mod:`cuvil_pgc.recompile.rewrites` for when and why."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class MathMultiheadAttention(nn.MultiheadAttention):
    """Self-attention as explicit matmul + softmax + matmul (same parameters, same results to
    rounding); every case :func:`math_attention_applies` rejects runs the original forward.

    :func:`apply_rewrites` swaps the class of the copied module: the subclass adds no state, so the
    weights, flags and what ``nn.TransformerEncoderLayer`` checks on its ``self_attn`` stay as they are.
    """

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                key_padding_mask: torch.Tensor | None = None, need_weights: bool = True,
                attn_mask: torch.Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not math_attention_applies(self, query, key, value, key_padding_mask, need_weights, attn_mask, is_causal):
            return super().forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                   average_attn_weights, is_causal)
        x = query if self.batch_first else query.transpose(0, 1)
        batch, length, embed = x.shape
        heads, dim = self.num_heads, embed // self.num_heads
        qkv = nn.functional.linear(x, self.in_proj_weight, self.in_proj_bias)
        q, k, v = qkv.view(batch, length, 3, heads, dim).permute(2, 0, 3, 1, 4)
        scores = (q * dim ** -0.5) @ k.transpose(-2, -1)
        if attn_mask is not None:
            mask = attn_mask.view(batch, heads, length, length) if attn_mask.dim() == 3 else attn_mask
            scores = scores.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, embed)
        out = self.out_proj(out)
        return (out if self.batch_first else out.transpose(0, 1)), None


def math_attention_applies(mha: nn.MultiheadAttention, query: Any, key: Any, value: Any, key_padding_mask: Any,
                           need_weights: bool, attn_mask: Any, is_causal: bool = False) -> bool:
    """Whether :class:`MathMultiheadAttention` computes this call itself: batched self-attention
    without attention weights, key padding, bias_k/zero-attention extras or dropout; an optional
    2-D or per-head 3-D mask (``is_causal`` is only a hint about it, and an error without one).
    (MHA with ``need_weights`` already runs matmul + softmax.)"""
    return (query is key and key is value and isinstance(query, torch.Tensor) and query.dim() == 3
            and not need_weights and key_padding_mask is None and mha._qkv_same_embed_dim
            and mha.in_proj_bias is not None and mha.bias_k is None and not mha.add_zero_attn
            and (mha.dropout == 0.0 or not mha.training) and not (is_causal and attn_mask is None)
            and (attn_mask is None or attn_mask.dim() == 2 or attn_mask.shape[0] == query.shape[
                0 if mha.batch_first else 1] * mha.num_heads))


# ----------------------------------------------------------------------------- padded encoder

class ZeroPaddedTransformerEncoder(nn.TransformerEncoder):
    """``nn.TransformerEncoder`` returning zeros at the padded positions wherever eager does.

    In inference with a key padding mask, eager runs the encoder on a nested tensor of the tokens
    alone and pads its output with zeros. An exported program (torch.export, ONNX) traces the
    dense path, which computes every position, so every runtime or AOTInductor build of such an
    encoder failed the accuracy guard at the padded positions (a 2-layer encoder: 384 of 2048
    values off by up to 3.3) and the model stayed eager. This subclass zeroes the padded positions
    of the output where eager takes the nested path: :func:`nested_padding_applies`, and (in the
    graph, as it depends on the mask's values) eager's check that each row's padding is at its
    end. The other positions are the dense path's, which match the nested path's to rounding
    (1e-6 on that encoder). Run eagerly it takes the nested path itself; the zeroing changes nothing.
    """

    def forward(self, src: torch.Tensor, mask: torch.Tensor | None = None,
                src_key_padding_mask: torch.Tensor | None = None, is_causal: bool | None = None) -> torch.Tensor:
        out = super().forward(src, mask, src_key_padding_mask, is_causal)
        if not nested_padding_applies(self, src, mask, src_key_padding_mask):
            return out
        m = src_key_padding_mask
        pad = m if m.dtype == torch.bool else m != 0
        if getattr(self, "mask_check", True):       # eager pads with zeros only where padding ends each row
            pad = pad & ~(pad[:, :-1] & ~pad[:, 1:]).any()
        return out.masked_fill((pad if self.layers[0].self_attn.batch_first else pad.t()).unsqueeze(-1), 0.0)


def padded_encoder_rewritable(module: nn.Module) -> bool:
    """Whether ``module`` is an ``nn.TransformerEncoder`` built with ``enable_nested_tensor``
    (whether a call takes the nested path, :func:`nested_padding_applies` decides per call)."""
    return type(module) is nn.TransformerEncoder and getattr(module, "use_nested_tensor", False)


def nested_padding_applies(encoder: nn.TransformerEncoder, src: Any, mask: Any, src_key_padding_mask: Any) -> bool:
    """Whether eager ``nn.TransformerEncoder`` runs this call on a nested tensor, as far as that
    does not depend on the values (torch's own conditions: the fast path enabled, the encoder
    built with ``enable_nested_tensor`` and in eval mode, a batched input with a key padding mask
    and no attention mask, no autocast, and no weight needing grad while grad is on)."""
    first = encoder.layers[0]
    weights = (first.self_attn.in_proj_weight, first.linear1.weight, first.linear2.weight)
    return (torch.backends.mha.get_fastpath_enabled() and getattr(encoder, "use_nested_tensor", False)
            and not first.training and isinstance(src, torch.Tensor) and src.dim() == 3
            and isinstance(src_key_padding_mask, torch.Tensor) and mask is None and not torch.is_autocast_enabled()
            and not (torch.is_grad_enabled() and any(w is not None and w.requires_grad for w in weights)))
