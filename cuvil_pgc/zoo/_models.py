"""The nn.Module classes behind the bundled zoo (see ``cuvil_pgc.zoo`` for the factories).

Every submodule is a named attribute (or a ModuleList of them), so ``instrument_module`` gives
regions readable paths such as ``model.blocks.0.linear`` or ``model.frontend.conv1``. The
classes hold no randomness of their own: the factories seed initialisation and inputs.
"""

from __future__ import annotations

import math
from itertools import pairwise

import torch
from torch import nn
from torch.nn import functional as F


class MLPBlock(nn.Module):
    """Linear -> LayerNorm -> GELU: three small ops that eager runs as separate kernels."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.norm = nn.LayerNorm(out_features)
        self.act = nn.GELU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.linear(x)))


class MLP(nn.Module):
    """A stack of MLPBlocks and a linear head."""

    def __init__(self, in_features: int, hidden: int, depth: int, classes: int) -> None:
        super().__init__()
        widths = [in_features] + [hidden] * depth
        self.blocks = nn.ModuleList(MLPBlock(a, b) for a, b in pairwise(widths))
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ConvBNReLU(nn.Module):
    """conv -> batchnorm -> relu, the pattern that Inductor freezing folds and fuses."""

    def __init__(self, cin: int, cout: int, stride: int = 1, relu: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU() if relu else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.bn(self.conv(x)))


class Projection(nn.Module):
    """1x1 strided conv + batchnorm: the shortcut of a block that changes width or resolution."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 1, stride=stride, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bn(self.conv(x))


class ResidualBlock(nn.Module):
    """A ResNet basic block: two conv-bn(-relu) and a (projected) shortcut, then relu."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = ConvBNReLU(cin, cout, stride)
        self.conv2 = ConvBNReLU(cout, cout, relu=False)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = Projection(cin, cout, stride)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.conv2(self.conv1(x)) + self.shortcut(x))


class SmallResNet(nn.Module):
    """stem -> residual stages -> global average pool -> linear head."""

    def __init__(self, widths: tuple[int, ...], classes: int) -> None:
        super().__init__()
        self.stem = ConvBNReLU(3, widths[0])
        stages, cin = [], widths[0]
        for i, width in enumerate(widths):
            stages.append(ResidualBlock(cin, width, stride=1 if i == 0 else 2))
            cin = width
        self.stages = nn.ModuleList(stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(cin, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.head(torch.flatten(self.pool(x), 1))


class LSTMStep(nn.Module):
    """One decoding step: nn.LSTM over a length-1 sequence, carrying (h, c), plus a linear head."""

    def __init__(self, features: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.rnn = nn.LSTM(features, hidden, batch_first=True)
        self.head = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor, h: torch.Tensor, c: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        out, (h1, c1) = self.rnn(x, (h, c))
        return self.head(out[:, -1]), h1, c1


class EncoderClassifier(nn.Module):
    """One nn.TransformerEncoderLayer over a short sequence, mean-pooled into a linear head."""

    def __init__(self, d_model: int, heads: int, ffn: int, classes: int) -> None:
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(d_model, heads, ffn, dropout=0.0, batch_first=True)
        self.head = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x).mean(dim=1))


class ConvFrontEnd(nn.Module):
    """Two conv-bn-relu layers (the second strided) that turn an image into feature columns."""

    def __init__(self, cin: int, width: int, rows: int) -> None:
        super().__init__()
        self.conv1 = ConvBNReLU(cin, width // 2)
        self.conv2 = ConvBNReLU(width // 2, width, stride=2)
        self.pool = nn.AdaptiveAvgPool2d((rows, None))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.conv2(self.conv1(x)))            # (N, C, rows, W)
        return x.flatten(1, 2).transpose(1, 2)              # (N, W, C * rows): one step per column


class ConvRecurrentNet(nn.Module):
    """A CRNN-style model: conv front end, LSTM over the image columns, MLP classifier on the last step."""

    def __init__(self, width: int, rows: int, hidden: int, classes: int) -> None:
        super().__init__()
        self.frontend = ConvFrontEnd(3, width, rows)
        self.rnn = nn.LSTM(width * rows, hidden, batch_first=True)
        self.classifier = MLP(hidden, hidden // 2, 1, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.frontend(x))
        return self.classifier(out[:, -1])


class GRUTagger(nn.Module):
    """Sequence tagger: embedding, bidirectional GRU, a per-token linear classifier."""

    def __init__(self, vocab: int, embed: int, hidden: int, tags: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, embed)
        self.rnn = nn.GRU(embed, hidden, batch_first=True, bidirectional=True)
        self.classifier = nn.Linear(2 * hidden, tags)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(self.embed(tokens))
        return self.classifier(out)


class BertSelfAttention(nn.Module):
    """Multi-head self-attention written out op by op, as in BERT's eager implementation."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.output = nn.Linear(hidden, hidden)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        n, t, d = x.shape
        return x.view(n, t, self.heads, d // self.heads).transpose(1, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self._split(self.query(x)), self._split(self.key(x)), self._split(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        context = torch.matmul(torch.softmax(scores, dim=-1), v)
        return self.output(context.transpose(1, 2).flatten(2))


class BertLayer(nn.Module):
    """Post-norm transformer layer: attention + residual + norm, GELU FFN + residual + norm."""

    def __init__(self, hidden: int, heads: int, intermediate: int) -> None:
        super().__init__()
        self.attention = BertSelfAttention(hidden, heads)
        self.attention_norm = nn.LayerNorm(hidden)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.output_norm = nn.LayerNorm(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.attention_norm(x + self.attention(x))
        return self.output_norm(x + self.output(F.gelu(self.intermediate(x))))


class TinyBert(nn.Module):
    """A BERT-shaped sequence classifier: embeddings, a few BertLayers, pooler and classifier."""

    def __init__(self, vocab: int, hidden: int, layers: int, heads: int, intermediate: int,
                 max_positions: int, classes: int) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(vocab, hidden)
        self.position_embeddings = nn.Embedding(max_positions, hidden)
        self.embedding_norm = nn.LayerNorm(hidden)
        self.layers = nn.ModuleList(BertLayer(hidden, heads, intermediate) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embedding_norm(self.word_embeddings(tokens) + self.position_embeddings(positions))
        for layer in self.layers:
            x = layer(x)
        return self.classifier(torch.tanh(self.pooler(x[:, 0])))
