"""Bundled example models: ``FACTORY() -> (model, example_inputs)`` with fixed seeds, no downloads.

Contract (what ``--model cuvil_pgc.zoo:NAME`` and the recompiler rely on):

- every factory returns ``(model, example_inputs)``: a ``torch.nn.Module`` in eval mode with
  float32 parameters on the CPU, and a tuple of positional CPU inputs at batch 1;
- the same ``seed`` gives bit-identical weights and inputs, and the caller's global torch RNG
  state is left untouched;
- a factory runs in well under a second, and a forward pass takes about 0.05-3 ms on a small CPU,
  so profiles, searches and benchmarks over the whole zoo stay short;
- submodules are named attributes (``blocks.0.linear``, ``frontend.conv1.bn``), so
  ``instrument_module`` regions have readable paths.

Each model exists to exercise one kind of bottleneck; the factory docstrings say which. Callers
run them under ``torch.inference_mode()`` or ``torch.no_grad()`` like any inference code.

``ZOO`` maps names to factories; :func:`get` looks one up with a helpful error. Importing this
package is cheap: torch loads when a factory is first called.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from cuvil_pgc.errors import ModelSpecError

Factory = Callable[..., tuple[Any, tuple[Any, ...]]]


@contextmanager
def _seeded(seed: int) -> Iterator[Any]:
    """Seed torch for module initialisation without disturbing the caller's RNG state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield torch.Generator().manual_seed(seed + 1)


def _finish(model: Any, inputs: tuple[Any, ...], seed: int) -> tuple[Any, tuple[Any, ...]]:
    """Give batchnorm layers non-trivial running statistics, then switch to eval mode."""
    import torch

    generator = torch.Generator().manual_seed(seed + 2)
    for module in model.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            with torch.no_grad():
                shape = module.running_mean.shape
                module.running_mean.copy_(torch.randn(shape, generator=generator) * 0.1)
                module.running_var.copy_(torch.rand(shape, generator=generator) + 0.5)
                module.weight.copy_(torch.rand(shape, generator=generator) + 0.5)
                module.bias.copy_(torch.randn(shape, generator=generator) * 0.1)
    return model.float().eval(), inputs


def mlp(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """MLP at batch 1: three Linear-LayerNorm-GELU blocks (256 -> 512 -> 512 -> 512) and a head.

    Exercises per-op dispatch / launch overhead: a dozen tiny ops whose run time is mostly fixed
    cost, and Linear+LayerNorm+GELU chains that fusion removes.
    """
    import torch

    from cuvil_pgc.zoo._models import MLP

    with _seeded(seed) as gen:
        model = MLP(256, 512, 3, 10)
        inputs = (torch.randn(1, 256, generator=gen),)
    return _finish(model, inputs, seed)


def cnn(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """Small ResNet at batch 1 on a 3x32x32 image: stem, residual stages of width 16, 32, 64, head.

    Exercises convolution compute and memory layout (NCHW vs channels_last), conv+batchnorm folding
    (freezing) and conv-bn-relu / residual-add fusion.
    """
    import torch

    from cuvil_pgc.zoo._models import SmallResNet

    with _seeded(seed) as gen:
        model = SmallResNet((16, 32, 64), 10)
        inputs = (torch.randn(1, 3, 32, 32, generator=gen),)
    return _finish(model, inputs, seed)


def lstm_step(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """One nn.LSTM step (256 -> 256, batch 1, sequence length 1) carrying (h, c), and a 64-way head.

    Inputs ``(x, h, c)`` shaped (1, 1, 256), (1, 1, 256), (1, 1, 256); outputs ``(logits, h, c)``.
    Exercises launch overhead: eager nn.LSTM spends most of a step in fixed per-call cost, which a
    rewrite into fused cell math (one addmm plus pointwise gates) removes.
    """
    import torch

    from cuvil_pgc.zoo._models import LSTMStep

    with _seeded(seed) as gen:
        model = LSTMStep(256, 256, 64)
        inputs = tuple(torch.randn(1, 1, 256, generator=gen) for _ in range(3))
    return _finish(model, inputs, seed)


def transformer(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """One nn.TransformerEncoderLayer (d_model 128, 4 heads, FFN 512) over 16 tokens, pooled head.

    Exercises small attention and FFN matmuls, where eager is overhead-bound and fusion of the
    layer norms, residual adds and softmax pays.
    """
    import torch

    from cuvil_pgc.zoo._models import EncoderClassifier

    with _seeded(seed) as gen:
        model = EncoderClassifier(128, 4, 512, 10)
        inputs = (torch.randn(1, 16, 128, generator=gen),)
    return _finish(model, inputs, seed)


def mixed(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """CRNN-style mixed model on a 3x32x64 image: conv front end, LSTM over 32 columns, MLP head.

    Exercises all three bottlenecks in one model, so a plan must choose per region: convolutions
    (compute, layout), a recurrent loop (launch overhead) and a small MLP (dispatch, fusion).
    """
    import torch

    from cuvil_pgc.zoo._models import ConvRecurrentNet

    with _seeded(seed) as gen:
        model = ConvRecurrentNet(width=32, rows=4, hidden=128, classes=10)
        inputs = (torch.randn(1, 3, 32, 64, generator=gen),)
    return _finish(model, inputs, seed)


def gru_tagger(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """Sequence tagger: embedding (1000 x 64), bidirectional GRU (hidden 128) over 32 tokens, 17 tags.

    Exercises a recurrent op whose eager cost is dominated by per-step fixed overhead, and the
    per-call cost of each compile backend (the issue's eager / compile / AOTInductor figures).
    """
    import torch

    from cuvil_pgc.zoo._models import GRUTagger

    with _seeded(seed) as gen:
        model = GRUTagger(1000, 64, 128, 17)
        inputs = (torch.randint(0, 1000, (1, 32), generator=gen),)
    return _finish(model, inputs, seed)


def tiny_bert(seed: int = 0) -> tuple[Any, tuple[Any, ...]]:
    """BERT-shaped classifier: hidden 128, 2 layers, 2 heads, FFN 512, over 32 tokens, 2 classes.

    Attention is written op by op (matmul, scale, softmax, matmul) as in eager BERT. Exercises
    many small matmuls plus pointwise/normalisation chains: fusion and wrapper overhead.
    """
    import torch

    from cuvil_pgc.zoo._models import TinyBert

    with _seeded(seed) as gen:
        model = TinyBert(1000, 128, 2, 2, 512, 64, 2)
        inputs = (torch.randint(0, 1000, (1, 32), generator=gen),)
    return _finish(model, inputs, seed)


ZOO: dict[str, Factory] = {
    "mlp": mlp,
    "cnn": cnn,
    "lstm_step": lstm_step,
    "transformer": transformer,
    "mixed": mixed,
    "gru_tagger": gru_tagger,
    "tiny_bert": tiny_bert,
}


def get(name: str) -> Factory:
    """The factory registered as ``name``; a ModelSpecError lists the names when it is unknown."""
    try:
        return ZOO[name]
    except KeyError:
        raise ModelSpecError(f"the zoo has no model {name!r}",
                             fix=f"choose one of {', '.join(sorted(ZOO))}") from None


__all__ = ["ZOO", "Factory", "get", *ZOO]
