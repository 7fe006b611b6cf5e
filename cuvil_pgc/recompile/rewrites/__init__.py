"""Module rewrites for overhead-bound regions, numerically equivalent to the originals.

- ``nn.LSTM`` / ``nn.GRU`` (any layers, batch_first, bidirectional; no proj_size) become
  :class:`CellLSTM` / :class:`CellGRU`: the input projection of every step in one GEMM, then per
  step one ``addmm`` with the hidden weights plus pointwise gates. For single-step and
  short sequences this removes most of cuDNN/oneDNN RNN's fixed per-call cost; compiled, the
  pointwise gates fuse. Each step unrolls into the graph, so the cost models charge the rewrite
  per step (see :mod:`~cuvil_pgc.recompile.cost_components`). Calls the cell math does not cover run the original module
  (:func:`cell_rewrite_applies`): packed sequences (whose batch shrinks step by step, and which
  torch.export cannot capture either) and sequences longer than :data:`MAX_UNROLLED_STEPS`.
  Compiled on the CPU at batch 1 over more than one step, each step's hidden product is written as
  a multiply and row sum (:func:`_hidden_gates`): Inductor fuses it with the gates into one kernel
  per step instead of calling a GEMM library for a 1-row product. AOTInductor packages of 16-step
  LSTMs and GRUs (hidden 64-256, max-autotune) ran 10-35 % faster; one step alone (weights read
  once) ran 10 % slower, so a single step keeps the ``addmm``.
- ``nn.MultiheadAttention`` self-attention becomes :class:`MathMultiheadAttention`: matmul, softmax,
  matmul instead of the fused attention kernel, whose fixed cost dominates short sequences (the
  zoo transformer's AOTInductor package: 8.7-10% faster at 16 tokens; a 32-token causal model: 1-4%
  slower, so the search measures it). Eager is unchanged where the encoder fast path runs.
- Small ``nn.ConvTranspose{1,2}d`` become :class:`GemmConvTranspose1d` / ``2d``: in a compiled graph,
  one GEMM of the weight with the input's pixels, then ``col2im`` (``F.fold``) adds the overlapping
  patches, which Inductor fuses with the bias. oneDNN's CPU deconvolution has a large fixed cost at
  one thread (AOTInductor packages of one 16->1-channel 14x14->28x28 upsampling: 139 µs frozen, 32 µs
  as GEMM + col2im; of a 32->16-channel 7x7->14x14 one: 77 vs 65 µs; never slower on six shapes).
  Past :data:`MAX_GEMM_DECONV_OUTPUT` outputs per sample the column buffer outgrows the saving (a
  64->32-channel 16x16->32x32 one: 0.63 vs 0.34 ms), and eager keeps the original forward everywhere:
  eager's own GEMM + col2im was slower at half of the shapes measured.
- ``nn.TransformerEncoder`` built with ``enable_nested_tensor`` becomes
  :class:`ZeroPaddedTransformerEncoder`: its exported program returns zeros at the padded
  positions where eager's nested-tensor path does (else no build of it passes the guard).
- Conv + BatchNorm folding (eval mode): a ``Conv{1,2,3}d`` whose only user is a ``BatchNorm``
  (found by tracing each parent with ``torch.fx``) gets the BN's scale and shift folded into its
  weight and bias, and the BN becomes ``nn.Identity``. Inductor freezing does this too; the
  rewrite serves eager and non-frozen candidates.

:func:`apply_rewrites` works on a deep copy and returns it with the names of what it rewrote. Each
family lives in a module of its own (:mod:`.cells`, :mod:`.attention`, :mod:`.deconv`,
:mod:`.conv_bn`); this module decides where each applies.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from cuvil_pgc._eval_mode import eval_mode
from cuvil_pgc.recompile.rewrites.attention import (
    MathMultiheadAttention,
    ZeroPaddedTransformerEncoder,
    padded_encoder_rewritable,
)
from cuvil_pgc.recompile.rewrites.cells import CellGRU, CellLSTM
from cuvil_pgc.recompile.rewrites.conv_bn import conv_bn_pairs, fold_conv_bn
from cuvil_pgc.recompile.rewrites.deconv import GEMM_DECONVS, gemm_deconv_rewritable

#: bump when a rewrite's generated program changes: cached AOTInductor packages of rewritten
#: modules and the records of their measurements are keyed by it
REWRITES_VERSION = 8


# ----------------------------------------------------------------------------- driver

def rewrite_opportunities(module: nn.Module) -> list[str]:
    """Names of the rewrites :func:`apply_rewrites` would make (without changing anything)."""
    found = []
    for name, sub in module.named_modules():
        if isinstance(sub, nn.LSTM) and not sub.proj_size:
            found.append(f"lstm_cell:{name}")
        elif isinstance(sub, nn.GRU):
            found.append(f"gru_cell:{name}")
        elif type(sub) is nn.MultiheadAttention:
            found.append(f"attention_math:{name}")
        elif padded_encoder_rewritable(sub):
            found.append(f"padded_encoder:{name}")
        elif gemm_deconv_rewritable(sub):
            found.append(f"deconv_gemm:{name}")
        found.extend(f"fold_conv_bn:{_join(name, c)}+{b}" for c, b in conv_bn_pairs(sub))
    return found


def apply_rewrites(module: nn.Module, example_inputs: tuple[Any, ...] | None = None) -> tuple[nn.Module, list[str]]:
    """Return a rewritten deep copy of ``module`` (eval mode) and the list of rewrites applied."""
    out = eval_mode(copy.deepcopy(module))
    applied: list[str] = []
    for name, sub in list(out.named_modules()):
        for cname, child in list(sub.named_children()):
            if isinstance(child, nn.LSTM) and not child.proj_size:
                setattr(sub, cname, CellLSTM(child))
                applied.append(f"lstm_cell:{_join(name, cname)}")
            elif isinstance(child, nn.GRU):
                setattr(sub, cname, CellGRU(child))
                applied.append(f"gru_cell:{_join(name, cname)}")
            elif type(child) is nn.MultiheadAttention:
                child.__class__ = MathMultiheadAttention
                applied.append(f"attention_math:{_join(name, cname)}")
            elif padded_encoder_rewritable(child):
                child.__class__ = ZeroPaddedTransformerEncoder
                applied.append(f"padded_encoder:{_join(name, cname)}")
            elif gemm_deconv_rewritable(child):
                child.__class__ = GEMM_DECONVS[type(child)]
                applied.append(f"deconv_gemm:{_join(name, cname)}")
        for conv_name, bn_name in conv_bn_pairs(sub):
            fold_conv_bn(getattr(sub, conv_name), getattr(sub, bn_name))
            setattr(sub, bn_name, nn.Identity())
            applied.append(f"fold_conv_bn:{_join(name, conv_name)}+{bn_name}")
    if isinstance(out, nn.LSTM) and not out.proj_size:
        out, applied = CellLSTM(out), ["lstm_cell:"]
    elif isinstance(out, nn.GRU):
        out, applied = CellGRU(out), ["gru_cell:"]
    elif type(out) is nn.MultiheadAttention:
        out.__class__ = MathMultiheadAttention
        applied = ["attention_math:"]
    elif padded_encoder_rewritable(out):
        out.__class__ = ZeroPaddedTransformerEncoder
        applied = [*applied, "padded_encoder:"]
    elif gemm_deconv_rewritable(out):
        out.__class__ = GEMM_DECONVS[type(out)]
        applied = ["deconv_gemm:"]
    return out, applied


def _join(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent else child
