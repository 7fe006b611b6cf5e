"""Module rewrites for overhead-bound regions, numerically equivalent to the originals.

- ``nn.LSTM`` / ``nn.GRU`` (any layers, batch_first, bidirectional; no proj_size) become
  :class:`CellLSTM` / :class:`CellGRU`: the input projection of every step in one GEMM, then per
  step one ``addmm`` with the hidden weights plus pointwise gates. For single-step and
  short sequences this removes most of cuDNN/oneDNN RNN's fixed per-call cost; compiled, the
  pointwise gates fuse. Each step unrolls into the graph, so the cost models charge the rewrite
  per step (see :mod:`.cost_models`). Calls the cell math does not cover run the original module
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

:func:`apply_rewrites` works on a deep copy and returns it with the names of what it rewrote.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from cuvil_pgc._eval_mode import eval_mode

MAX_UNROLLED_STEPS = 32
#: rewrite names (see :func:`rewrite_opportunities`) that unroll an LSTM/GRU into cell steps
CELL_REWRITES = ("lstm_cell:", "gru_cell:")
#: most output elements per sample (channels x positions) a transposed convolution runs as GEMM + col2im
MAX_GEMM_DECONV_OUTPUT = 16384
#: bump when a rewrite's generated program changes: cached AOTInductor packages of rewritten
#: modules and the records of their measurements are keyed by it
REWRITES_VERSION = 8


def cell_rewrite_applies(rnn: nn.Module, x: Any) -> bool:
    """Whether the cell rewrite of ``rnn`` (the RNN or its rewrite: this reads ``batch_first`` and
    ``proj_size``) runs a call with input ``x`` as cell math: a plain tensor (not a packed sequence)
    of at most :data:`MAX_UNROLLED_STEPS` steps, and no LSTM projections. Other calls run the
    original module."""
    if not isinstance(x, torch.Tensor) or getattr(rnn, "proj_size", 0) or x.dim() not in (2, 3):
        return False
    steps = x.shape[1] if x.dim() == 3 and rnn.batch_first else x.shape[0]
    return steps <= MAX_UNROLLED_STEPS


class _CellRNN(nn.Module):
    """What :class:`CellLSTM` and :class:`CellGRU` share: the original module, which runs the calls
    the cell math does not cover (:func:`cell_rewrite_applies`). It is held unregistered, so the
    rewrite's state and exported graph hold only the cell buffers; device and dtype moves follow."""

    def __init__(self, rnn: nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "original", rnn)

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self.original._apply(fn, recurse)
        return super()._apply(fn, recurse)


class CellLSTM(_CellRNN):
    """nn.LSTM as explicit cell math (same inputs, outputs and parameters' values)."""

    def __init__(self, lstm: nn.LSTM) -> None:
        if lstm.proj_size:
            raise ValueError("LSTM with proj_size is not rewritten")
        super().__init__(lstm)
        self.hidden_size, self.num_layers = lstm.hidden_size, lstm.num_layers
        self.batch_first, self.directions = lstm.batch_first, 2 if lstm.bidirectional else 1
        for layer in range(self.num_layers):
            for d in range(self.directions):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                w_ih, w_hh = getattr(lstm, "weight_ih" + sfx), getattr(lstm, "weight_hh" + sfx)
                b = _rnn_bias(lstm, sfx, w_ih.shape[0], w_ih)
                # separate contiguous buffers, not slices of one: Inductor's CPP GEMM template
                # miscomputes a frozen weight that is a view with a storage offset (torch 2.13)
                self.register_buffer("wi" + sfx, w_ih.t().contiguous().detach().clone())
                self.register_buffer("wh" + sfx, w_hh.t().contiguous().detach().clone())
                self.register_buffer("whr" + sfx, w_hh.contiguous().detach().clone())
                self.register_buffer("b" + sfx, (b[0] + b[1]).detach().clone())

    def forward(self, x: torch.Tensor, hx: tuple[torch.Tensor, torch.Tensor] | None = None):
        if not cell_rewrite_applies(self, x):     # dynamo must not see the original on this path
            return self.original(x, hx)
        x, unbatched = _to_time_major(x, self.batch_first)
        h0, c0 = _initial_state(x, hx, self.num_layers * self.directions, self.hidden_size, unbatched, 2)
        hs, cs, layer_in = [], [], x
        for layer in range(self.num_layers):
            outs = []
            for d in range(self.directions):
                idx = layer * self.directions + d
                out, h, c = self._run(layer_in, h0[idx], c0[idx], layer, d)
                outs.append(out)
                hs.append(h)
                cs.append(c)
            layer_in = outs[0] if self.directions == 1 else torch.cat(outs, -1)
        return (_from_time_major(layer_in, self.batch_first, unbatched),
                (_stack_state(hs, unbatched), _stack_state(cs, unbatched)))

    def _run(self, seq: torch.Tensor, h: torch.Tensor, c: torch.Tensor, layer: int, d: int):
        sfx = f"_l{layer}" + ("_reverse" if d else "")
        wi, wh, whr, b = (getattr(self, name + sfx) for name in ("wi", "wh", "whr", "b"))
        steps = range(seq.shape[0] - 1, -1, -1) if d else range(seq.shape[0])
        # one GEMM projects every step's input; each step then adds h @ W_hh
        gx = torch.addmm(b, seq.reshape(-1, seq.shape[-1]), wi).view(seq.shape[0], seq.shape[1], -1)
        outs: list[torch.Tensor] = []
        for t in steps:
            gates = _hidden_gates(gx[t], h, wh, whr, len(steps))
            i, f, g, o = gates.chunk(4, 1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        if d:
            outs.reverse()
        return torch.stack(outs, 0), h, c


class CellGRU(_CellRNN):
    """nn.GRU as explicit cell math."""

    def __init__(self, gru: nn.GRU) -> None:
        super().__init__(gru)
        self.hidden_size, self.num_layers = gru.hidden_size, gru.num_layers
        self.batch_first, self.directions = gru.batch_first, 2 if gru.bidirectional else 1
        for layer in range(self.num_layers):
            for d in range(self.directions):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                w_ih, w_hh = getattr(gru, "weight_ih" + sfx), getattr(gru, "weight_hh" + sfx)
                b_ih, b_hh = _rnn_bias(gru, sfx, w_ih.shape[0], w_ih)
                self.register_buffer("wi" + sfx, w_ih.t().contiguous().detach().clone())
                self.register_buffer("wh" + sfx, w_hh.t().contiguous().detach().clone())
                self.register_buffer("whr" + sfx, w_hh.contiguous().detach().clone())
                self.register_buffer("bi" + sfx, b_ih.detach().clone())
                self.register_buffer("bh" + sfx, b_hh.detach().clone())

    def forward(self, x: torch.Tensor, hx: torch.Tensor | None = None):
        if not cell_rewrite_applies(self, x):     # dynamo must not see the original on this path
            return self.original(x, hx)
        x, unbatched = _to_time_major(x, self.batch_first)
        (h0,) = _initial_state(x, None if hx is None else (hx,), self.num_layers * self.directions,
                               self.hidden_size, unbatched, 1)
        hs, layer_in = [], x
        for layer in range(self.num_layers):
            outs = []
            for d in range(self.directions):
                out, h = self._run(layer_in, h0[layer * self.directions + d], layer, d)
                outs.append(out)
                hs.append(h)
            layer_in = outs[0] if self.directions == 1 else torch.cat(outs, -1)
        return _from_time_major(layer_in, self.batch_first, unbatched), _stack_state(hs, unbatched)

    def _run(self, seq: torch.Tensor, h: torch.Tensor, layer: int, d: int):
        sfx = f"_l{layer}" + ("_reverse" if d else "")
        wi, wh, whr, bi, bh = (getattr(self, name + sfx) for name in ("wi", "wh", "whr", "bi", "bh"))
        gi_all = torch.addmm(bi, seq.reshape(-1, seq.shape[-1]), wi).view(seq.shape[0], seq.shape[1], -1)
        steps = range(seq.shape[0] - 1, -1, -1) if d else range(seq.shape[0])
        outs: list[torch.Tensor] = []
        for t in steps:
            gh = _hidden_gates(bh, h, wh, whr, len(steps))
            ir, iz, i_n = gi_all[t].chunk(3, 1)
            hr, hz, hn = gh.chunk(3, 1)
            r = torch.sigmoid(ir + hr)
            z = torch.sigmoid(iz + hz)
            n = torch.tanh(i_n + r * hn)
            h = n + z * (h - n)
            outs.append(h)
        if d:
            outs.reverse()
        return torch.stack(outs, 0), h


def _hidden_gates(bias: torch.Tensor, h: torch.Tensor, wh: torch.Tensor, whr: torch.Tensor,
                  steps: int) -> torch.Tensor:
    """``bias + h @ wh``: one step's hidden contribution to the gates (``wh`` is W_hh transposed,
    ``whr`` W_hh itself). Compiled on the CPU at batch 1 over several steps, it is a multiply and a
    row sum over ``whr``, which Inductor fuses with the step's gate math into one kernel; one GEMM
    library call per step costs more there (see the module docstring). Elsewhere, ``addmm``."""
    if steps > 1 and h.shape[0] == 1 and h.is_cpu and torch.compiler.is_compiling():
        return bias + (whr * h.unsqueeze(1)).sum(-1)
    return torch.addmm(bias, h, wh)


def _rnn_bias(rnn: nn.Module, sfx: str, rows: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if getattr(rnn, "bias", True):
        return getattr(rnn, "bias_ih" + sfx), getattr(rnn, "bias_hh" + sfx)
    zero = torch.zeros(rows, dtype=like.dtype, device=like.device)
    return zero, zero


def _to_time_major(x: torch.Tensor, batch_first: bool) -> tuple[torch.Tensor, bool]:
    if x.dim() == 2:
        return x.unsqueeze(1), True
    return (x.transpose(0, 1) if batch_first else x), False


def _from_time_major(y: torch.Tensor, batch_first: bool, unbatched: bool) -> torch.Tensor:
    if unbatched:
        return y.squeeze(1)
    return y.transpose(0, 1) if batch_first else y


def _initial_state(x: torch.Tensor, hx: Any, layers: int, hidden: int, unbatched: bool, parts: int):
    if hx is None:
        zero = x.new_zeros(layers, x.shape[1], hidden)
        return (zero,) * parts
    return tuple(h.unsqueeze(1) if unbatched else h for h in hx)


def _stack_state(states: list[torch.Tensor], unbatched: bool) -> torch.Tensor:
    out = torch.stack(states, 0)
    return out.squeeze(1) if unbatched else out


# ----------------------------------------------------------------------------- attention

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


# ----------------------------------------------------------------------------- transposed convolution

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


_GEMM_DECONVS = {nn.ConvTranspose1d: GemmConvTranspose1d, nn.ConvTranspose2d: GemmConvTranspose2d}


def gemm_deconv_rewritable(conv: nn.Module) -> bool:
    """Whether ``conv`` is a transposed convolution the GEMM form covers: ungrouped, undilated,
    zero-padded, 1-D or 2-D (how large its output is, :func:`gemm_deconv_applies` decides per call)."""
    return type(conv) in _GEMM_DECONVS and _gemm_form_covers(conv)


def _gemm_form_covers(conv: nn.Module) -> bool:
    return conv.groups == 1 and conv.padding_mode == "zeros" and all(d == 1 for d in conv.dilation)


def gemm_deconv_applies(conv: nn.Module, x: Any, output_size: Any = None) -> bool:
    """Whether this call, compiled, runs as GEMM + col2im: a rewritable ``conv`` (its original class
    or the rewritten one), a batched CPU input, no ``output_size``, at most
    :data:`MAX_GEMM_DECONV_OUTPUT` output elements per sample."""
    spatial = len(conv.kernel_size)
    if not (isinstance(conv, tuple(_GEMM_DECONVS)) and _gemm_form_covers(conv) and output_size is None
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


# ----------------------------------------------------------------------------- conv + batchnorm

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


def _conv_bn_pairs(parent: nn.Module) -> list[tuple[str, str]]:
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
        found.extend(f"fold_conv_bn:{_join(name, c)}+{b}" for c, b in _conv_bn_pairs(sub))
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
                child.__class__ = _GEMM_DECONVS[type(child)]
                applied.append(f"deconv_gemm:{_join(name, cname)}")
        for conv_name, bn_name in _conv_bn_pairs(sub):
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
        out.__class__ = _GEMM_DECONVS[type(out)]
        applied = ["deconv_gemm:"]
    return out, applied


def _join(parent: str, child: str) -> str:
    return f"{parent}.{child}" if parent else child
