"""Small transposed convolutions as GEMM + col2im when compiled (:class:`GemmConvTranspose1d`,
:class:`GemmConvTranspose2d`); see :mod:`cuvil_pgc.recompile.rewrites` for when and why."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

#: most output elements per sample (channels x positions) a transposed convolution runs as GEMM + col2im
MAX_GEMM_DECONV_OUTPUT = 16384


class GemmConvTranspose1d(nn.ConvTranspose1d):
    """A transposed 1-D convolution, compiled, as GEMM + col2im where :func:`gemm_deconv_applies` (else,
    and in eager, the original forward); :func:`apply_rewrites` swaps the class of the copied module,
    as for attention."""

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if not (torch.compiler.is_compiling() and gemm_deconv_applies(self, input, output_size)):
            return super().forward(input, output_size)
        return gemm_conv_transpose(self, input.unsqueeze(-2)).squeeze(-2)


class GemmConvTranspose2d(nn.ConvTranspose2d):
    """A transposed 2-D convolution as GEMM + col2im (see :class:`GemmConvTranspose1d`)."""

    def forward(self, input: torch.Tensor, output_size: list[int] | None = None) -> torch.Tensor:
        if not (torch.compiler.is_compiling() and gemm_deconv_applies(self, input, output_size)):
            return super().forward(input, output_size)
        return gemm_conv_transpose(self, input)


GEMM_DECONVS = {nn.ConvTranspose1d: GemmConvTranspose1d, nn.ConvTranspose2d: GemmConvTranspose2d}


def gemm_deconv_rewritable(conv: nn.Module) -> bool:
    """Whether ``conv`` is a transposed convolution the GEMM form covers: ungrouped, undilated,
    zero-padded, 1-D or 2-D (how large its output is, :func:`gemm_deconv_applies` decides per call)."""
    return type(conv) in GEMM_DECONVS and _gemm_form_covers(conv)


def _gemm_form_covers(conv: nn.Module) -> bool:
    return conv.groups == 1 and conv.padding_mode == "zeros" and all(d == 1 for d in conv.dilation)


def gemm_deconv_applies(conv: nn.Module, x: Any, output_size: Any = None) -> bool:
    """Whether this call, compiled, runs as GEMM + col2im: a rewritable ``conv`` (its original class
    or the rewritten one), a batched CPU input, no ``output_size``, at most
    :data:`MAX_GEMM_DECONV_OUTPUT` output elements per sample."""
    spatial = len(conv.kernel_size)
    if not (isinstance(conv, tuple(GEMM_DECONVS)) and _gemm_form_covers(conv) and output_size is None
            and isinstance(x, torch.Tensor) and x.dim() == spatial + 2 and x.device.type == "cpu"):
        return False
    return conv.out_channels * math.prod(_deconv_output_shape(conv, x.shape[2:])) <= MAX_GEMM_DECONV_OUTPUT


def _deconv_output_shape(conv: nn.Module, size: Any) -> list[int]:
    return [(n - 1) * s - 2 * p + k + op for n, s, p, k, op in
            zip(size, conv.stride, conv.padding, conv.kernel_size, conv.output_padding, strict=True)]


def gemm_conv_transpose(conv: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` for an (N, C, H, W) input: every input pixel times the weight gives its output
    patch (one GEMM), and col2im sums the overlapping patches into place. A 1-D convolution's
    parameters are given as 2-D ones with a height of 1."""
    n, c, h, w = x.shape
    if len(conv.kernel_size) == 2:
        kernel, stride, padding = conv.kernel_size, conv.stride, conv.padding
        out_size = _deconv_output_shape(conv, (h, w))
    else:
        kernel, stride, padding = (1, *conv.kernel_size), (1, *conv.stride), (0, *conv.padding)
        out_size = [1, *_deconv_output_shape(conv, (w,))]
    # one 2-D GEMM over every sample's pixels (a batched matmul would expand the weight per sample)
    cols = torch.mm(conv.weight.reshape(c, -1).t(), x.transpose(0, 1).reshape(c, n * h * w))
    cols = cols.view(-1, n, h * w).transpose(0, 1)
    y = nn.functional.fold(cols, out_size, kernel, padding=padding, stride=stride)
    return y if conv.bias is None else y + conv.bias.view(1, -1, 1, 1)
