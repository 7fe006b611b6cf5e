"""ONNX Runtime's transformer optimizer for regions with attention: the ``fuse`` knob of ``ort``.

``onnxruntime.transformers.optimizer.optimize_model`` rewrites an exported transformer graph into
ONNX Runtime's fused contrib operators (``Attention``/``MultiHeadAttention``,
``SkipLayerNormalization``, ``FastGelu``/``BiasGelu``/``Gelu`` ...), which its own graph levels do
not produce. It runs with ``opt_level=0`` (its Python fusions only): ONNX Runtime's graph
optimizations still run when the session is created, at the candidate's ``opt`` level.

:func:`attention_shape` finds what the optimizer needs in the module: the model type (``gpt2``
for decoders, else ``bert``), the number of heads and the hidden size (0 where they cannot be
read: the optimizer then detects them from the graph). The features record it as the scope's
``attention`` evidence, and the plan space adds ``ort+fuse=<type>`` for such scopes. A fusion that
fails or fuses nothing raises :class:`FusionError`: that candidate is rejected with the reason,
the scope's other ONNX Runtime candidates are not affected.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

#: the domain of ONNX Runtime's contrib (fused) operators
CONTRIB_DOMAIN = "com.microsoft"
DECODER_TYPES = ("gpt2", "gpt_neo", "gptj", "gpt_neox", "llama", "mistral", "qwen2", "opt", "bloom", "falcon")


class FusionError(RuntimeError):
    """The transformer optimizer failed on a region's graph, or fused nothing in it."""


def attention_shape(module: Any) -> dict[str, Any] | None:
    """``{"model_type", "num_heads", "hidden_size"}`` of a module holding attention, else None.

    Read from a Hugging Face ``config`` (``num_attention_heads``/``n_head``, ``hidden_size``/
    ``n_embd``, ``model_type``, ``is_decoder``), an ``nn.MultiheadAttention``, or a submodule whose
    class name says attention and whose attributes name its heads."""
    import torch

    for sub in module.modules():
        config = getattr(sub, "config", None)
        heads = _first_int(config, ("num_attention_heads", "n_head", "num_heads"))
        if config is not None and heads:
            kind = str(getattr(config, "model_type", "") or "")
            decoder = kind in DECODER_TYPES or bool(getattr(config, "is_decoder", False))
            return {"model_type": "gpt2" if decoder else "bert", "num_heads": heads,
                    "hidden_size": _first_int(config, ("hidden_size", "n_embd", "d_model")) or 0}
    for sub in module.modules():
        if isinstance(sub, torch.nn.MultiheadAttention):
            return {"model_type": "bert", "num_heads": sub.num_heads, "hidden_size": sub.embed_dim}
        if "attention" in type(sub).__name__.lower():
            heads = _first_int(sub, ("num_heads", "n_head", "num_attention_heads", "heads"))
            if heads:
                hidden = _first_int(sub, ("hidden_size", "embed_dim", "d_model", "all_head_size", "dim")) or 0
                return {"model_type": "bert", "num_heads": heads, "hidden_size": hidden}
    return None


def _first_int(obj: Any, names: tuple[str, ...]) -> int:
    for name in names:
        value = getattr(obj, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return 0


def fuse_transformer(onnx_path: Path, out_path: Path, shape: dict[str, Any]) -> dict[str, int]:
    """Write ``onnx_path`` fused by the transformer optimizer to ``out_path``; returns the count of
    each fused (contrib) operator it added. Raises :class:`FusionError` when the optimizer fails
    or adds no fused operator."""
    try:
        import onnx
        from onnxruntime.transformers.optimizer import optimize_model

        before = _contrib_ops(onnx.load(str(onnx_path), load_external_data=False))
        chatter = io.StringIO()
        with contextlib.redirect_stdout(chatter), _quiet_optimizer_logs():
            optimized = optimize_model(str(onnx_path), model_type=shape.get("model_type", "bert"),
                                       num_heads=int(shape.get("num_heads") or 0),
                                       hidden_size=int(shape.get("hidden_size") or 0), opt_level=0, use_gpu=False)
        after = _contrib_ops(optimized.model)
    except Exception as exc:
        raise FusionError(f"onnxruntime.transformers.optimizer failed: {type(exc).__name__}: "
                          f"{' '.join(str(exc).split())[:300]}") from exc
    fused = {op: n - before.get(op, 0) for op, n in after.items() if n > before.get(op, 0)}
    if not fused:
        raise FusionError(f"onnxruntime.transformers.optimizer fused nothing in this region "
                          f"(model_type={shape.get('model_type')}, num_heads={shape.get('num_heads')}, "
                          f"hidden_size={shape.get('hidden_size')}): no attention, layer-norm or GELU "
                          "pattern it knows")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(f"{out_path.name}.{os.getpid()}.tmp")
    import onnx

    onnx.save_model(optimized.model, str(tmp))
    os.replace(tmp, out_path)
    return fused


def _contrib_ops(model: Any) -> dict[str, int]:
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.domain == CONTRIB_DOMAIN:
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


@contextlib.contextmanager
def _quiet_optimizer_logs():
    """The optimizer logs every fusion at INFO/WARNING on its own loggers: keep them out of the CLI."""
    logger = logging.getLogger("onnxruntime.transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
