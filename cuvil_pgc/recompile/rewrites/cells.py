"""``nn.LSTM`` / ``nn.GRU`` as explicit cell math (:class:`CellLSTM`, :class:`CellGRU`); see
:mod:`cuvil_pgc.recompile.rewrites` for when and why."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

MAX_UNROLLED_STEPS = 32
#: rewrite names (see :func:`rewrite_opportunities`) that unroll an LSTM/GRU into cell steps
CELL_REWRITES = ("lstm_cell:", "gru_cell:")


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

    def __init__(self, rnn: nn.Module,
                 biases: Callable[[torch.Tensor, torch.Tensor], dict[str, torch.Tensor]]) -> None:
        """Copy ``rnn``'s weights, per layer and direction (suffix ``_l{layer}[_reverse]``), into
        buffers ``wi`` (W_ih transposed), ``wh`` (W_hh transposed) and ``whr`` (W_hh), then the
        buffers ``biases(b_ih, b_hh)`` names (zeros where ``rnn`` has no bias)."""
        super().__init__()
        object.__setattr__(self, "original", rnn)
        self.hidden_size, self.num_layers = rnn.hidden_size, rnn.num_layers
        self.batch_first, self.directions = rnn.batch_first, 2 if rnn.bidirectional else 1
        for layer in range(self.num_layers):
            for d in range(self.directions):
                sfx = f"_l{layer}" + ("_reverse" if d else "")
                w_ih, w_hh = getattr(rnn, "weight_ih" + sfx), getattr(rnn, "weight_hh" + sfx)
                # separate contiguous buffers, not slices of one: Inductor's CPP GEMM template
                # miscomputes a frozen weight that is a view with a storage offset (torch 2.13)
                self.register_buffer("wi" + sfx, w_ih.t().contiguous().detach().clone())
                self.register_buffer("wh" + sfx, w_hh.t().contiguous().detach().clone())
                self.register_buffer("whr" + sfx, w_hh.contiguous().detach().clone())
                for name, value in biases(*_rnn_bias(rnn, sfx, w_ih.shape[0], w_ih)).items():
                    self.register_buffer(name + sfx, value.detach().clone())

    def _apply(self, fn: Any, recurse: bool = True) -> Any:
        self.original._apply(fn, recurse)
        return super()._apply(fn, recurse)


class CellLSTM(_CellRNN):
    """nn.LSTM as explicit cell math (same inputs, outputs and parameters' values)."""

    def __init__(self, lstm: nn.LSTM) -> None:
        if lstm.proj_size:
            raise ValueError("LSTM with proj_size is not rewritten")
        super().__init__(lstm, lambda b_ih, b_hh: {"b": b_ih + b_hh})

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
        super().__init__(gru, lambda b_ih, b_hh: {"bi": b_ih, "bh": b_hh})

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
