"""FLOP and byte estimates for aten operators, from the shapes the profiler recorded.

Contract: ``estimate_cost(name, shapes, dtypes, concrete)`` returns an :class:`OpCost` and never
raises. Inputs are what ``_KinetoEvent`` reports with ``record_shapes=True``: ``shapes`` a list
with one shape (list of ints) per argument, ``dtypes`` the matching C++ type names ("float",
"c10::Half", "Scalar", "TensorList", ...), and ``concrete`` the recorded scalar arguments (needed
for convolution and pooling geometry; see :func:`needs_concrete`).

FLOPs (multiply and add counted as two, like torch.utils.flop_counter): the matmul family (mm,
addmm, bmm, baddbmm, matmul, linear), convolutions (conv1d/2d/3d, conv_transpose*, convolution,
_convolution, mkldnn, cudnn and slow-conv variants) and scaled_dot_product_attention with its
flash / efficient / math / cudnn variants use torch.utils.flop_counter's formulas (``mm_flop``,
``bmm_flop``, ``conv_flop_count``, ``sdpa_flop_count``) after mapping each op's arguments onto
them; bias additions and softmax are not counted, as there. Elementwise arithmetic counts one FLOP
per output element; views and allocations (empty, resize_) count zero; every other op has
``flops=None`` (unknown).

Bytes: the sizes of all tensor inputs plus the output (elements x element size). The output is
inferred from the op and the input shapes where that is cheap (matmuls, convolutions, attention,
pooling, broadcasting elementwise ops, same-shape ops such as norms and activations, in-place ops
write their first argument). Where it cannot be inferred, or an input is a TensorList (the
profiler records no shapes for those), ``bytes`` counts what is known and ``partial`` is True.
Views and allocations move no data: ``bytes=0``. The output dtype follows torch's promotion
roughly (in-place: self's; else the highest category among inputs; bool for comparisons). Ops that may or may not copy (reshape, contiguous, flatten)
get ``bytes=None``. These are traffic estimates for roofline reasoning, not measured counters.

An op's estimate covers its whole call, children included: aten::linear carries the FLOPs that
its child aten::addmm also carries. Sum ops of nesting depth 0 (the ``depth`` the operator
sampler records) to total a region without double counting.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

Shape = list[int]


class OpCost(NamedTuple):
    flops: int | None
    bytes: int | None
    partial: bool = False


ELEMENT_SIZE: dict[str, int] = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2,
    "long int": 8, "long long int": 8, "int": 4, "short int": 2, "signed char": 1,
    "unsigned char": 1, "bool": 1, "short unsigned int": 2, "unsigned int": 4,
    "long unsigned int": 8, "c10::complex<float>": 8, "c10::complex<double>": 16,
    "c10::complex<c10::Half>": 4, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1, "c10::Float8_e8m0fnu": 1,
    "c10::qint8": 1, "c10::quint8": 1, "c10::qint32": 4,
}
_NON_TENSOR = frozenset({"Scalar", "ScalarList", "", "None", "GenericList", "int[]", "Device", "Layout"})

_VIEWS = frozenset({
    "view", "t", "transpose", "permute", "expand", "expand_as", "as_strided", "unsqueeze", "squeeze",
    "select", "slice", "narrow", "_reshape_alias", "_unsafe_view", "alias", "detach", "view_as",
    "diagonal", "unfold", "split", "split_with_sizes", "chunk", "unbind", "movedim", "swapaxes",
    "numpy_T", "mT", "empty", "empty_like", "empty_strided", "resize_", "as_strided_", "lift_fresh",
    "resolve_conj", "resolve_neg", "_nnpack_available",
})
# Full profiler names of the ops above, for callers that skip estimating them at all.
VIEW_OPS = frozenset(f"aten::{op}" for op in _VIEWS)
_MAYBE_COPY = frozenset({"reshape", "contiguous", "flatten", "to", "type_as"})
_ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "rsub", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "pow", "relu",
    "relu6", "gelu", "silu", "sigmoid", "tanh", "hardtanh", "hardswish", "hardsigmoid", "leaky_relu",
    "elu", "mish", "clamp", "clamp_min", "clamp_max", "maximum", "minimum", "where", "addcmul",
    "addcdiv", "reciprocal", "square", "erf", "sin", "cos", "threshold", "softplus", "lerp",
})
_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "isnan", "isinf", "logical_and",
                          "logical_or", "logical_not", "logical_xor"})
_SAME_SHAPE = frozenset({
    "clone", "softmax", "_softmax", "log_softmax", "_log_softmax", "layer_norm", "native_layer_norm",
    "batch_norm", "_batch_norm_impl_index", "native_batch_norm", "_native_batch_norm_legit",
    "_native_batch_norm_legit_no_training", "group_norm", "native_group_norm", "instance_norm",
    "rms_norm", "_fused_rms_norm", "dropout", "native_dropout", "feature_dropout", "alpha_dropout",
    "cumsum", "masked_fill", "tril", "triu", "roll", "flip",
})
_WRITE_ONLY = frozenset({"copy_", "fill_", "zero_", "normal_", "uniform_", "random_", "bernoulli_"})


def base_name(name: str) -> str:
    """``aten::addmm`` → ``addmm`` (other namespaces keep their name)."""
    return name[6:] if name.startswith("aten::") else name


def needs_concrete(name: str) -> bool:
    """Whether the estimate for this op needs its recorded scalar arguments."""
    return name in CONCRETE_OPS or base_name(name) in _GEOMETRY


def element_size(dtype: str) -> int | None:
    return ELEMENT_SIZE.get(dtype)


def estimate_cost(name: str, shapes: Sequence[Shape], dtypes: Sequence[str],
                  concrete: Sequence[Any] | None = None) -> OpCost:
    """FLOP and byte estimate of one op call; unknown parts are None (never raises)."""
    op = base_name(name)
    if op in _VIEWS:
        return OpCost(0, 0)
    if not shapes:
        return OpCost(None, None, True)
    try:
        return _estimate(op, list(shapes), list(dtypes), concrete)
    except Exception:  # odd shapes or a formula that asserts: an unknown estimate, not an error
        return OpCost(None, None, True)


def _estimate(op: str, shapes: list[Shape], dtypes: list[str], concrete: Sequence[Any] | None) -> OpCost:
    in_bytes, partial = _input_bytes(shapes, dtypes)
    if op in _MAYBE_COPY:
        return OpCost(None, None, partial)
    if op in _WRITE_ONLY:
        return _write_only(op, shapes, dtypes, in_bytes, partial)
    try:
        out_shape, flops = _output_and_flops(op, shapes, concrete)
    except Exception:  # missing scalar arguments or a formula that asserts: output unknown
        out_shape, flops = None, None
    out_bytes = _nbytes(out_shape, _result_dtype(op, shapes, dtypes))
    if out_bytes is None:
        return OpCost(flops, in_bytes, True)
    return OpCost(flops, in_bytes + out_bytes, partial)


def _write_only(op: str, shapes: list[Shape], dtypes: list[str], in_bytes: int, partial: bool) -> OpCost:
    """copy_ reads its source and writes self; fill_, zero_ and the RNG fills only write self."""
    out_bytes = _nbytes(shapes[0], dtypes[0] if dtypes else None)
    if out_bytes is None:
        return OpCost(None, in_bytes, True)
    read = in_bytes - out_bytes if op == "copy_" else 0
    return OpCost(0 if op in ("fill_", "zero_") else None, read + out_bytes, partial)


def _input_bytes(shapes: list[Shape], dtypes: list[str]) -> tuple[int, bool]:
    total, partial = 0, False
    for shape, dtype in zip(shapes, dtypes, strict=False):
        size = ELEMENT_SIZE.get(dtype)
        if size is not None:
            total += math.prod(shape) * size
        elif dtype not in _NON_TENSOR:
            partial = True  # TensorList and friends: the profiler records no shapes for them
    return total, partial


def _nbytes(shape: Shape | None, dtype: str | None) -> int | None:
    size = ELEMENT_SIZE.get(dtype or "")
    if shape is None or size is None:
        return None
    return math.prod(shape) * size


def _result_dtype(op: str, shapes: list[Shape], dtypes: list[str]) -> str | None:
    """Roughly torch's type promotion: in-place ops keep self's dtype; otherwise the highest
    category (complex > floating > integer > bool) wins, 0-dim tensors only when nothing else is there."""
    if _strip_variant(op) in _COMPARISONS:
        return "bool"
    tensors = [(s, d) for s, d in zip(shapes, dtypes, strict=False) if d in ELEMENT_SIZE]
    if not tensors:
        return None
    if op.endswith("_") and not op.startswith("_"):
        return tensors[0][1]
    dims = [d for s, d in tensors if s] or [d for _, d in tensors]
    return max(dims, key=lambda d: (_category(d), ELEMENT_SIZE[d]))


def _category(dtype: str) -> int:
    if "complex" in dtype:
        return 3
    if dtype in ("float", "double") or "Half" in dtype or "BFloat" in dtype or "Float8" in dtype:
        return 2
    return 0 if dtype == "bool" else 1


def _strip_variant(op: str) -> str:
    """``add_`` → ``add``; ``mul.out`` style names do not occur in profiler events."""
    return op[:-1] if op.endswith("_") and not op.startswith("_") else op


def _output_and_flops(op: str, shapes: list[Shape], concrete: Sequence[Any] | None
                      ) -> tuple[Shape | None, int | None]:
    rule = _RULES.get(op)
    if rule is not None:
        return rule(shapes, concrete)
    plain = _strip_variant(op)
    if plain in _ELEMENTWISE or plain in _COMPARISONS:
        out = list(shapes[0]) if op != plain else _broadcast_tensors(shapes)
        return out, (math.prod(out) if plain in _ELEMENTWISE and out is not None else None)
    if op in _SAME_SHAPE or plain in _SAME_SHAPE:
        return list(shapes[0]), None
    return None, None


def _broadcast_tensors(shapes: list[Shape]) -> Shape | None:
    """Broadcast shape of the tensor arguments (0-dim tensors and scalars broadcast freely)."""
    out: Shape = []
    for shape in shapes:
        out = _broadcast(out, shape)
    return out


def _broadcast(a: Shape, b: Shape) -> Shape:
    n = max(len(a), len(b))
    a = [1] * (n - len(a)) + list(a)
    b = [1] * (n - len(b)) + list(b)
    return [x if y == 1 else y for x, y in zip(a, b, strict=True)]


# --- matmul family -------------------------------------------------------------------------------
def _mm_flop(a: Shape, b: Shape) -> int:
    """torch.utils.flop_counter.mm_flop: 2·m·k·n (written out here: the analyzer estimates the ops
    of torch.profiler traces without importing torch, 3 s on 2 cores)."""
    (m, k), (k2, n) = a, b
    if k != k2:
        raise ValueError(f"matmul: inner dimensions {k} and {k2}")
    return m * n * 2 * k


def _bmm_flop(a: Shape, b: Shape) -> int:
    """torch.utils.flop_counter.bmm_flop: 2·b·m·k·n."""
    (batch, m, k), (batch2, k2, n) = a, b
    if batch != batch2 or k != k2:
        raise ValueError(f"bmm: shapes {a} and {b}")
    return batch * m * n * 2 * k


def _conv_flop(x: Shape, w: Shape, out: Shape, transposed: bool) -> int:
    """torch.utils.flop_counter.conv_flop_count: 2 · batch · output points (input points when
    transposed) · filter size · c_out · c_in; bias not counted."""
    c_out, c_in, *filter_size = w
    return math.prod((x if transposed else out)[2:]) * math.prod(filter_size) * x[0] * c_out * c_in * 2


def _sdpa_flop(q: Shape, k: Shape, v: Shape) -> int:
    """torch.utils.flop_counter.sdpa_flop_count: scores and output as two bmms (grouped-query
    attention broadcasts the key/value heads to the query's)."""
    (b, h_q, s_q, d_q), (b2, h_kv, s_k, d_k), (b3, h_v, s_v, d_v) = q, k, v
    if not (b == b2 == b3 and h_kv == h_v and d_q == d_k and s_k == s_v) or h_q < h_kv or h_q % h_kv:
        raise ValueError(f"sdpa: shapes {q}, {k}, {v}")
    return _bmm_flop([b * h_q, s_q, d_q], [b * h_q, d_q, s_k]) + _bmm_flop([b * h_q, s_q, s_k], [b * h_q, s_k, d_v])


def _mm(shapes: list[Shape], _c: Any) -> tuple[Shape, int]:
    a, b = shapes[0], shapes[1]
    return [a[0], b[1]], _mm_flop(a, b)


def _addmm(shapes: list[Shape], _c: Any) -> tuple[Shape, int]:
    return _mm(shapes[1:3], _c)


def _bmm(shapes: list[Shape], _c: Any) -> tuple[Shape, int]:
    a, b = shapes[0], shapes[1]
    return [a[0], a[1], b[2]], _bmm_flop(a, b)


def _baddbmm(shapes: list[Shape], _c: Any) -> tuple[Shape, int]:
    return _bmm(shapes[1:3], _c)


def _matmul(shapes: list[Shape], _c: Any) -> tuple[Shape, int]:
    """torch.matmul semantics: 1-D operands gain and lose a dimension, batch dims broadcast."""
    a, b = shapes[0], shapes[1]
    m, k = (1, a[0]) if len(a) == 1 else (a[-2], a[-1])
    n = 1 if len(b) == 1 else b[-1]
    batch = _broadcast(a[:-2], b[:-2]) if len(a) > 2 or len(b) > 2 else []
    out = batch + ([m] if len(a) > 1 else []) + ([n] if len(b) > 1 else [])
    return out, _bmm_flop([math.prod(batch), m, k], [math.prod(batch), k, n])


def _linear(shapes: list[Shape], _c: Any) -> tuple[Shape, int]:
    x, w = shapes[0], shapes[1]
    rows = math.prod(x[:-1])
    return list(x[:-1]) + [w[0]], _mm_flop([rows, x[-1]], [w[1], w[0]])


# --- convolution and pooling --------------------------------------------------------------------
class ConvGeometry(NamedTuple):
    stride: Sequence[int]
    padding: Sequence[int] | str
    dilation: Sequence[int]
    transposed: bool = False
    output_padding: Sequence[int] = ()
    groups: int = 1


def _conv_args(op: str, c: Sequence[Any]) -> ConvGeometry:
    """Map each convolution overload's argument order onto one geometry."""
    if op in ("conv1d", "conv2d", "conv3d"):          # input, weight, bias, stride, padding, dilation, groups
        return ConvGeometry(c[3], c[4], c[5], groups=c[6])
    if op in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d"):
        # input, weight, bias, stride, padding, output_padding, groups, dilation
        return ConvGeometry(c[3], c[4], c[7], True, c[5], c[6])
    if op in ("convolution", "_convolution", "convolution_overrideable"):
        # input, weight, bias, stride, padding, dilation, transposed, output_padding, groups, ...
        return ConvGeometry(c[3], c[4], c[5], bool(c[6]), c[7], c[8])
    if op in ("mkldnn_convolution", "_mkldnn_convolution"):  # input, weight, bias, padding, stride, dilation, groups
        return ConvGeometry(c[4], c[3], c[5], groups=c[6])
    if op == "cudnn_convolution":                      # input, weight, padding, stride, dilation, groups, ...
        return ConvGeometry(c[3], c[2], c[4], groups=c[5])
    # thnn_conv2d / _slow_conv2d_forward: input, weight, kernel_size, bias, stride, padding
    return ConvGeometry(c[4], c[5], [1] * len(c[2]))


def _spatial(values: Sequence[int] | int, n: int) -> list[int]:
    if isinstance(values, int):
        return [values] * n
    values = list(values)
    return values * n if len(values) == 1 else values


def _conv(op: str) -> Callable[[list[Shape], Any], tuple[Shape, int]]:
    def rule(shapes: list[Shape], concrete: Any) -> tuple[Shape, int]:
        x, w = shapes[0], shapes[1]
        g = _conv_args(op, concrete)
        n = len(x) - 2
        kernel = w[2:]
        stride, dilation = _spatial(g.stride, n), _spatial(g.dilation, n)
        if g.padding == "same":
            out_sp = list(x[2:])
        else:
            pad = [0] * n if g.padding == "valid" else _spatial(g.padding, n)
            if g.transposed:
                opad = _spatial(g.output_padding or 0, n)
                out_sp = [(x[i + 2] - 1) * stride[i] - 2 * pad[i] + dilation[i] * (kernel[i] - 1) + opad[i] + 1
                          for i in range(n)]
            else:
                out_sp = [(x[i + 2] + 2 * pad[i] - dilation[i] * (kernel[i] - 1) - 1) // stride[i] + 1
                          for i in range(n)]
        c_out = w[1] * g.groups if g.transposed else w[0]
        out = [x[0], c_out, *out_sp]
        return out, _conv_flop(x, w, out, g.transposed)
    return rule


def _pool(op: str) -> Callable[[list[Shape], Any], tuple[Shape, None]]:
    """max_pool: input, kernel, stride, padding, dilation, ceil_mode; avg_pool: ..., padding, ceil_mode."""
    n = int(op.removesuffix("_with_indices")[-2])
    is_max = op.startswith("max")

    def rule(shapes: list[Shape], c: Any) -> tuple[Shape, None]:
        x = shapes[0]
        kernel = _spatial(c[1], n)
        stride = _spatial(c[2], n) if c[2] else kernel
        pad = _spatial(c[3], n)
        dilation = _spatial(c[4], n) if is_max else [1] * n
        ceil_mode = bool(c[5] if is_max else c[4])
        lead = list(x[: len(x) - n])
        return lead + [_pooled(x[len(lead) + i], kernel[i], stride[i], pad[i], dilation[i], ceil_mode)
                       for i in range(n)], None
    return rule


def _pooled(size: int, kernel: int, stride: int, pad: int, dilation: int, ceil_mode: bool) -> int:
    """One spatial dimension of a pooling output, as ATen's pooling_output_shape computes it."""
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1
    return out


def _adaptive_pool(shapes: list[Shape], c: Any) -> tuple[Shape, None]:
    x, size = shapes[0], list(c[1]) if not isinstance(c[1], int) else [c[1]]
    return list(x[: len(x) - len(size)]) + size, None


# --- attention -----------------------------------------------------------------------------------
def _sdpa(shapes: list[Shape], _c: Any) -> tuple[Shape, int]:
    q, k, v = shapes[0], shapes[1], shapes[2]
    # flop_counter takes (batch, heads, seq, dim); fold any extra leading dims into batch.
    q4, k4, v4 = (_as_bhsd(s) for s in (q, k, v))
    return list(q[:-1]) + [v[-1]], _sdpa_flop(q4, k4, v4)


def _as_bhsd(shape: Shape) -> Shape:
    if len(shape) == 4:
        return list(shape)
    if len(shape) == 3:
        return [1, *shape]
    return [math.prod(shape[:-3]), *shape[-3:]]


def _flash_layout_sdpa(shapes: list[Shape], c: Any) -> tuple[Shape, int]:
    """_flash_attention_forward / _efficient_attention_forward take (batch, seq, heads, dim)."""
    q, k, v = ([s[0], s[2], s[1], s[3]] for s in shapes[:3])
    out, flops = _sdpa([q, k, v], c)
    return [out[0], out[2], out[1], out[3]], flops


_RULES: dict[str, Callable[[list[Shape], Any], tuple[Shape | None, int | None]]] = {
    "mm": _mm, "addmm": _addmm, "bmm": _bmm, "baddbmm": _baddbmm, "matmul": _matmul, "linear": _linear,
    "scaled_dot_product_attention": _sdpa, "_scaled_dot_product_flash_attention": _sdpa,
    "_scaled_dot_product_flash_attention_for_cpu": _sdpa, "_scaled_dot_product_efficient_attention": _sdpa,
    "_scaled_dot_product_attention_math": _sdpa, "_scaled_dot_product_cudnn_attention": _sdpa,
    "_scaled_dot_product_fused_attention_overrideable": _sdpa,
    "_flash_attention_forward": _flash_layout_sdpa, "_efficient_attention_forward": _flash_layout_sdpa,
}
_CONVS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
          "convolution", "_convolution", "convolution_overrideable", "mkldnn_convolution",
          "_mkldnn_convolution", "cudnn_convolution", "thnn_conv2d", "_slow_conv2d_forward")
_POOLS = ("max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices",
          "avg_pool1d", "avg_pool2d", "avg_pool3d")
_ADAPTIVE = ("adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_avg_pool3d", "_adaptive_avg_pool2d",
             "_adaptive_avg_pool3d")
_RULES.update({op: _conv(op) for op in _CONVS})
_RULES.update({op: _pool(op) for op in _POOLS})
_RULES.update({op: _adaptive_pool for op in _ADAPTIVE})
_GEOMETRY = frozenset(_CONVS + _POOLS + _ADAPTIVE)
CONCRETE_OPS = frozenset(f"aten::{op}" for op in _GEOMETRY)
