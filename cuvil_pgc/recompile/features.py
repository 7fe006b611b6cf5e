"""What the cost models know about each scope: profile statistics plus the module's op census.

The Analysis gives per-region time, calls, bottleneck label, top ops and fusion candidates; one
forward of each scope under a dispatch-mode counter gives its aten op count, pointwise op count,
FLOPs and bytes touched (the structure a profile of a CPU run does not always hold). The profile's
times were taken under instrumentation, so they are rescaled by the measured eager time of the
whole model before use.
"""

from __future__ import annotations

import functools
import inspect
from typing import TYPE_CHECKING, Any

import torch
from torch._ops import HigherOrderOperator
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from cuvil_pgc.analyze import vocabulary
from cuvil_pgc.recompile.candidates import ScopeFeatures
from cuvil_pgc.recompile.matching import RegionMatch
from cuvil_pgc.recompile.measure import gemm_us
from cuvil_pgc.recompile.ort_fusion import attention_shape
from cuvil_pgc.recompile.rewrites import rewrite_opportunities
from cuvil_pgc.recompile.rewrites.attention import math_attention_applies
from cuvil_pgc.recompile.rewrites.cells import CELL_REWRITES, cell_rewrite_applies
from cuvil_pgc.recompile.rewrites.deconv import gemm_deconv_applies, gemm_deconv_rewritable

if TYPE_CHECKING:
    from cuvil_pgc.analyze.analysis import Analysis

#: labels of a scope without a profiled region: launch overhead and every class of the "work" remedy
ALL_LABELS = ["launch_overhead", *(c.name for c in vocabulary.CLASSES if c.remedy == "work")]
#: version of what :func:`op_census` counts; bump it when the counts change. Records keep the
#: features they were measured with, and the refit leaves out those of an older census (their
#: measurements stay valid and are reused; a reuse restores the record with today's features)
CENSUS_VERSION = 5
_MHA_SIGNATURE = inspect.signature(torch.nn.MultiheadAttention.forward)
#: 2-D matrix products: what Inductor freezing turns into prepacked (oneDNN / MKL) linear calls
GEMM_OPS = (torch.ops.aten.addmm, torch.ops.aten.mm)


class _OpCensus(TorchDispatchMode):
    """Counts the aten ops of one call. Higher-order ops (``torch.cond``, ``while_loop``, ``scan``)
    pass through it too: without ``supports_higher_order_operators`` torch refuses any of them under
    a dispatch mode, and the census crashed every recompile of a model with a ``torch.cond``. A
    ``cond`` is counted by the branch eager takes (as torch's FLOP counter runs its branches); any
    other runs as eager runs it, with every mode set aside (the FLOP counter returns
    ``NotImplemented`` for a ``while_loop``), its ops uncounted."""

    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.pointwise = 0
        self.gemms = 0
        self.bytes = 0
        self.higher_order = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if isinstance(func, HigherOrderOperator):
            self.higher_order += 1
            if func is torch.ops.higher_order.cond and not kwargs:
                pred, true_fn, false_fn, operands = args
                with self:
                    return (true_fn if bool(pred) else false_fn)(*operands)
            with _disable_current_modes():
                return func(*args, **(kwargs or {}))
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        if torch.Tag.pointwise in getattr(func, "tags", ()):
            self.pointwise += 1
        elif func.overloadpacket in GEMM_OPS:
            self.gemms += 1
        for t in torch.utils._pytree.tree_leaves((args, kwargs, out)):
            if isinstance(t, torch.Tensor):
                self.bytes += t.numel() * t.element_size()
        return out


class _GlobalCount:
    """Stands in for FlopCounterMode's module tracker: the census reads the whole call's count
    ("Global") only. The tracker hooks every module and registers a gradient hook on each input
    that requires grad, which fails without autograd (under no_grad or inference_mode) for some
    inputs: a Hugging Face DeBERTa-v2, feeding its relative position table (a parameter) to its
    attention's projections, crashed every recompile of it with "AssertionError: Expected gradient
    function to be set" (and a tensor ``view_as`` made in inference mode with an AttributeError)."""

    parents = frozenset({"Global"})

    def __enter__(self) -> _GlobalCount:
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


def op_census(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, float]:
    """aten ops, pointwise ops, GEMMs, bytes touched, FLOPs (all, and convolutions'), recurrent cell
    steps and the GEMMs a cell rewrite unrolls them into, rewritable attention and
    transposed-convolution calls of one call.

    The census counts what a compiler sees, not eager's fused shortcuts: the transformer inference
    fast path (one native op per encoder layer, which export and torch.compile never take) is off,
    so attention and the feed-forward reach the counter as the matmuls a compiled graph runs. A
    oneDNN RNN stays one op, as it does in a compiled graph, and its cell math, which no FLOP
    formula covers, is counted by :func:`rnn_flops`; CPU attention is counted like the GPU kernels.
    """
    from torch.utils.flop_counter import FlopCounterMode

    census = _OpCensus()
    flops = FlopCounterMode(display=False, custom_mapping={
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _cpu_attention_flops})
    flops.mod_tracker = _GlobalCount()
    steps: list[int] = []
    uncounted: list[int] = []

    cell_gemms: list[tuple[int, int, int, int]] = []
    stepwise_gemms: list[tuple[int, int, int, int]] = []

    names = {id(m): name for name, m in module.named_modules()}
    cell_rnns: set[str] = set()     # RNNs a cell rewrite runs as cell math in this call

    def before(rnn: torch.nn.RNNBase, a: tuple[Any, ...]) -> None:
        if a and cell_rewrite_applies(rnn, a[0]):
            cell_rnns.add(names[id(rnn)])
            steps.append(rnn_cell_steps(rnn, a))
            cell_gemms.extend(rnn_cell_gemms(rnn, a))
        uncounted.append(flops.get_total_flops())

    def after(rnn: torch.nn.RNNBase, a: tuple[Any, ...], _out: Any) -> None:
        if flops.get_total_flops() == uncounted[-1]:     # a fused RNN op: no formula counted it
            uncounted[-1] = rnn_flops(rnn, a)
        else:                                            # ran as cell ops: two GEMMs a step
            uncounted[-1] = 0
            stepwise_gemms.extend(rnn_cell_gemms(rnn, a, stepwise=True))

    rnns = [m for m in module.modules() if isinstance(m, torch.nn.RNNBase)]
    hooks = [h for m in rnns for h in (m.register_forward_pre_hook(before), m.register_forward_hook(after))]
    attention: list[int] = []       # scores (batch x heads x queries x keys) of each rewritable call
    hooks += [m.register_forward_pre_hook(functools.partial(_count_attention, attention), with_kwargs=True)
              for m in module.modules() if type(m) is torch.nn.MultiheadAttention]
    deconvs: list[int] = []         # transposed convolutions the rewrite would run as GEMM + col2im
    hooks += [m.register_forward_pre_hook(functools.partial(_count_deconv, deconvs))
              for m in module.modules() if gemm_deconv_rewritable(m)]
    fastpath = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        with torch.no_grad(), flops, census:
            module(*args, **kwargs)
    finally:
        torch.backends.mha.set_fastpath_enabled(fastpath)
        for h in hooks:
            h.remove()
        if census.higher_order:
            # torch.cond and its kin compile their eager call; one compiled under a dispatch mode
            # fails every later call without it ("torch.* op returned non-Tensor"): start afresh
            torch._dynamo.reset()
    conv_flops = sum(n for op, n in flops.get_flop_counts().get("Global", {}).items() if "convolution" in str(op))
    return {"ops": census.ops, "pointwise": census.pointwise, "gemms": census.gemms, "bytes": census.bytes,
            "flops": flops.get_total_flops() + sum(uncounted), "conv_flops": conv_flops, "cell_gemms": cell_gemms,
            "stepwise_gemms": stepwise_gemms, "rnn_steps": sum(steps), "rnn_calls": len(steps),
            "cell_rnns": sorted(cell_rnns),
            "attention_calls": len(attention), "attention_scores": sum(attention), "deconv_calls": len(deconvs)}


def _count_attention(counted: list[int], mha: torch.nn.MultiheadAttention, args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> None:
    """Record a call the attention rewrite would run as matmul + softmax (see rewrites)."""
    call = _MHA_SIGNATURE.bind(mha, *args, **kwargs)
    call.apply_defaults()
    a = call.arguments
    if math_attention_applies(mha, a["query"], a["key"], a["value"], a["key_padding_mask"], a["need_weights"],
                              a["attn_mask"], a["is_causal"]):
        length, batch = a["query"].shape[:2] if not mha.batch_first else a["query"].shape[1::-1]
        counted.append(int(batch) * mha.num_heads * int(length) ** 2)


def _count_deconv(counted: list[int], conv: torch.nn.Module, args: tuple[Any, ...]) -> None:
    if args and gemm_deconv_applies(conv, args[0], args[1] if len(args) > 1 else None):
        counted.append(1)


def _cpu_attention_flops(query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
    """CPU attention's kernel has no FLOP formula of its own; it does the GPU kernels' matmuls."""
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def rnn_flops(rnn: torch.nn.RNNBase, args: tuple[Any, ...]) -> int:
    """Multiply-add FLOPs of one call of ``rnn``: every gate's input and hidden matmul, every step,
    layer and direction (plus the LSTM projection); the pointwise gate math is left out."""
    x = args[0] if args else None
    if isinstance(x, torch.nn.utils.rnn.PackedSequence):
        rows = int(x.data.shape[0])
    elif isinstance(x, torch.Tensor):
        rows = x.numel() // max(rnn.input_size, 1)          # batch x sequence length
    else:
        return 0
    gates = {"LSTM": 4, "GRU": 3}.get(rnn.mode, 1)
    proj = getattr(rnn, "proj_size", 0)
    state = proj or rnn.hidden_size
    directions = 2 if rnn.bidirectional else 1
    total = 0
    for layer in range(rnn.num_layers):
        inputs = rnn.input_size if layer == 0 else state * directions
        per_row = gates * rnn.hidden_size * (inputs + state) + (rnn.hidden_size * proj)
        total += 2 * rows * per_row * directions
    return total


def rnn_cell_steps(rnn: torch.nn.RNNBase, args: tuple[Any, ...]) -> int:
    """Cell steps one call of ``rnn`` runs: sequence length x layers x directions.

    A cell rewrite unrolls every one of them into the graph, so its cost grows with this count.
    """
    x = args[0] if args else None
    if isinstance(x, torch.nn.utils.rnn.PackedSequence):
        length = len(x.batch_sizes)
    elif isinstance(x, torch.Tensor):
        length = x.shape[0] if x.dim() == 2 or not rnn.batch_first else x.shape[1]
    else:
        length = 1
    return int(length) * rnn.num_layers * (2 if rnn.bidirectional else 1)


def rnn_cell_gemms(rnn: torch.nn.RNNBase, args: tuple[Any, ...], stepwise: bool = False
                   ) -> list[tuple[int, int, int, int]]:
    """The GEMMs a cell rewrite runs for one call of ``rnn``, as (count, m, k, n): per layer and
    direction, one projection of every step's input and one hidden-state product per step. Empty
    where the rewrite does not apply (:func:`~.rewrites.cells.cell_rewrite_applies`). ``stepwise``: the GEMMs
    of an RNN without a fused kernel (a CPU ``nn.GRU``), which projects each step's input alone."""
    x = args[0] if args else None
    if not cell_rewrite_applies(rnn, x):
        return []
    directions = 2 if rnn.bidirectional else 1
    length = rnn_cell_steps(rnn, args) // (rnn.num_layers * directions)
    batch = 1 if x.dim() == 2 else int(x.shape[0 if rnn.batch_first else 1])
    gated = {"LSTM": 4, "GRU": 3}.get(rnn.mode, 1) * rnn.hidden_size
    out = []
    for layer in range(rnn.num_layers):
        inputs = rnn.input_size if layer == 0 else rnn.hidden_size * directions
        projection = (directions * length, batch, inputs, gated) if stepwise else \
            (directions, length * batch, inputs, gated)
        out += [projection, (directions * length, batch, rnn.hidden_size, gated)]
    return out


def scope_features(scope: str, module: Any, inputs: Any, match: RegionMatch | None, analysis: Analysis | None,
                   root_calls: float, scale: float) -> ScopeFeatures:
    """Features of one scope; ``scale`` converts profiled µs to measured µs (instrumentation)."""
    census = op_census(module, inputs.args, inputs.kwargs)
    stats = match.stats if match else None
    calls = (stats.calls / root_calls) if stats and root_calls else 1.0
    eager_us = (stats.total_us / root_calls * scale) if stats and root_calls else 0.0
    evidence: dict[str, Any] = {"hotness": getattr(stats, "hotness", 0.0) if stats else 0.0}
    if census["rnn_steps"]:
        evidence["rnn_steps"] = census["rnn_steps"] * calls
        evidence["rnn_calls"] = census["rnn_calls"] * calls
    device = device_of(module)
    for key in ("cell_gemms", "stepwise_gemms"):    # what those GEMMs cost on this machine, measured
        if census[key]:
            evidence[key[:-1] + "_us"] = sum(n * gemm_us(m, k, w, device) for n, m, k, w in census[key]) * calls
    if census["attention_calls"]:
        evidence["attention_calls"] = census["attention_calls"] * calls
        evidence["attention_scores"] = census["attention_scores"] * calls
    batch = _batch(inputs)
    if batch:          # batch-1 inference keeps OpenVINO's latency hint (see candidates._steered_knobs)
        evidence["batch"] = batch
    attention = attention_shape(module)
    if attention:      # what ONNX Runtime's transformer optimizer needs (the ort fuse knob)
        evidence["attention"] = attention
    if census["conv_flops"] and census["flops"]:
        evidence["conv_share"] = census["conv_flops"] / census["flops"]
    if census["deconv_calls"]:
        evidence["deconv_calls"] = census["deconv_calls"] * calls
    if stats:
        evidence.update(_profile_evidence(stats, analysis, root_calls, scale, device))
    return ScopeFeatures(
        scope=scope, path=stats.path if stats else "", bottleneck=stats.bottleneck if stats else "unknown",
        eager_us=eager_us, calls=calls, ops=census["ops"] * calls, pointwise_ops=census["pointwise"] * calls,
        gemms=census["gemms"] * calls,
        flops=census["flops"] * calls, bytes=census["bytes"] * calls,
        has_conv=any(isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)) for m in module.modules()),
        rewrites=_rewrites_that_apply(module, census), labels=[stats.bottleneck] if stats else list(ALL_LABELS),
        evidence=evidence)


def _batch(inputs: Any) -> int:
    """The leading dimension of the scope's first input tensor of two or more dimensions (0: none)."""
    leaves = torch.utils._pytree.tree_leaves((inputs.args, inputs.kwargs))
    first = next((t for t in leaves if isinstance(t, torch.Tensor) and t.dim() >= 2), None)
    return int(first.shape[0]) if first is not None else 0


def _rewrites_that_apply(module: Any, census: dict[str, Any]) -> list[str]:
    """The module's rewrite opportunities, less the cell rewrites of RNNs whose calls the cell math
    does not cover (packed sequences, long sequences): rewritten, they would run as before."""
    return [r for r in rewrite_opportunities(module)
            if not r.startswith(CELL_REWRITES) or r.split(":", 1)[1] in census["cell_rnns"]]


def device_of(module: Any) -> str:
    """The device type the module's parameters are on (``"cpu"`` without parameters)."""
    return next((p.device.type for p in module.parameters()), "cpu")


def _profile_evidence(stats: Any, analysis: Analysis | None, root_calls: float, scale: float,
                      device: str) -> dict[str, Any]:
    out: dict[str, Any] = {"bottleneck_evidence": stats.evidence, "confidence": stats.confidence}
    rnn_us = sum(float(op.get("total_us", 0.0)) for op in stats.top_ops or []
                 if any(k in str(op.get("name", "")).lower() for k in ("lstm", "gru", "rnn")))
    if rnn_us and root_calls:
        out["rnn_us"] = rnn_us / root_calls * scale
    saved = sum(f.bytes_saved for f in getattr(analysis, "fusion_candidates", [])
                if f.region == stats.path or f.region.startswith(stats.path + "/"))
    if saved:
        out["fusion_bytes_saved"] = saved / max(root_calls, 1.0)
    gpu_us = gpu_kernel_us(analysis, stats.path) if device == "cuda" else 0.0   # not for a CPU search of a GPU profile
    if gpu_us and root_calls:
        out["gpu_us"] = gpu_us / root_calls
    return out


def gpu_kernel_us(analysis: Analysis | None, path: str) -> float:
    """GPU kernel time of the region ``path`` and the regions inside it, over the whole profile:
    each region's evidence holds its own kernels' busy time (``kernel_busy_us``, their union).
    Not scaled to the search's timing: a kernel's duration does not grow with the host-side
    instrumentation that the scale corrects for."""
    return sum(float(r.evidence.get("kernel_busy_us") or 0.0) for r in getattr(analysis, "regions", [])
               if r.path == path or r.path.startswith(path + "/"))


def root_labels(analysis: Analysis | None, matched: list[RegionMatch], top: int = 5) -> list[str]:
    """Bottleneck labels the whole-model scope must address: the root's and the hottest regions'."""
    if analysis is None or not matched:
        return list(ALL_LABELS)
    hottest = sorted(matched, key=lambda m: -m.stats.hotness)[:top]
    return sorted({m.stats.bottleneck for m in hottest})


def add_rnn_time(scopes: dict[str, ScopeFeatures], all_feats: dict[str, ScopeFeatures],
                  modules: dict[str, Any]) -> None:
    """A scope's RNN time (what a cell rewrite can remove) includes its profiled RNN submodules'."""
    rnn_types = (torch.nn.LSTM, torch.nn.GRU)
    for scope, feats in scopes.items():
        if "rnn_us" in feats.evidence:
            continue
        inner = sum(f.eager_us for q, f in all_feats.items()
                    if q and isinstance(modules.get(q), rnn_types) and (not scope or q == scope or q.startswith(scope + ".")))
        if inner:
            feats.evidence["rnn_us"] = inner
