"""The operator census a scope's features come from (:func:`cuvil_pgc.recompile.features.op_census`)."""

from __future__ import annotations

import torch

from cuvil_pgc.recompile.features import op_census


def test_a_parameter_fed_to_a_submodule_is_counted_without_autograd():
    """A Hugging Face DeBERTa-v2 feeds its relative position table (a parameter) to its attention's
    projections. torch's FLOP counter tracked modules with gradient hooks on such inputs, which
    fail without autograd: every recompile of the model crashed with "AssertionError: Expected
    gradient function to be set"."""
    import transformers

    cfg = transformers.DebertaV2Config(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                       intermediate_size=64, vocab_size=100, relative_attention=True,
                                       position_buckets=8, max_relative_positions=16, pos_att_type=["p2c", "c2p"])
    torch.manual_seed(0)
    census = op_census(transformers.DebertaV2Model(cfg).eval(), (torch.randint(0, 100, (1, 8)),), {})
    assert census["gemms"] == 8 and census["flops"] > 0
