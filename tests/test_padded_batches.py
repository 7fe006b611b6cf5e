"""A batch padded to one length, its attention mask marking the padding: what a model computes at
a padded position is not defined, and runtimes answer it each their own way. An OPT given a
left-padded batch of two got no build: ONNX Runtime's and OpenVINO's programs matched eager to
4e-7 at every real position and differed by 0.4 at the six padded ones, and the guard refused
them all. The guard now leaves the padded positions out (cuvil_pgc.recompile.padding)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile.accuracy import check_outputs
from cuvil_pgc.recompile.padding import padding_of

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="needs onnxruntime")


class Tagger(nn.Module):
    """Token ids and their mask in; per-position logits, a per-sequence score and its argmax out."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(20, 8)
        self.head = nn.Linear(8, 5)

    def forward(self, input_ids, attention_mask=None):
        logits = self.head(self.embed(input_ids))
        return {"logits": logits, "score": logits.mean(1), "best": logits.argmax(-1)}


def left_padded(batch: int = 2, length: int = 6, pads: tuple[int, ...] = (0, 2)) -> dict[str, torch.Tensor]:
    ids = torch.randint(1, 20, (batch, length))
    mask = torch.ones_like(ids)
    for row, n in enumerate(pads):
        mask[row, :n] = 0
    return {"input_ids": ids, "attention_mask": mask}


def test_the_mask_is_read_by_its_parameters_name_positional_or_keyword():
    x = left_padded()
    model = Tagger()
    for padding in (padding_of(model, (x["input_ids"], x["attention_mask"])),
                    padding_of(model, (x["input_ids"],), {"attention_mask": x["attention_mask"]})):
        assert padding is not None and padding.names == ("attention_mask",) and padding.padded == 2
        assert padding.describe() == "the 2 positions `attention_mask` marks as padding"
    assert padding_of(model, (x["input_ids"], torch.ones(2, 6, dtype=torch.long))) is None     # nothing padded
    assert padding_of(model, (x["input_ids"], x["attention_mask"] * 2)) is None                 # not a 0/1 mask
    assert padding_of(model, (x["input_ids"], x["attention_mask"][:, None])) is None           # not (batch, length)

    class Other(nn.Module):
        def forward(self, input_ids, weights):
            return input_ids * weights

    assert padding_of(Other(), (x["input_ids"], x["attention_mask"])) is None                  # not named a mask


def test_outputs_laid_out_by_batch_then_position_are_compared_at_real_positions_alone():
    padding = padding_of(Tagger(), (), left_padded())
    real = padding.real[0]
    assert torch.equal(padding.compared((2, 6, 5)), real[:, :, None])                  # logits
    assert torch.equal(padding.compared((2, 4, 6, 3)), real[:, None, :, None])         # a cache's keys
    assert torch.equal(padding.compared((2, 6, 6)), real[:, :, None] & real[:, None, :])   # attention weights
    assert padding.compared((2, 5)) is None                                            # per sequence
    assert padding.compared((3, 6, 5)) is None                                         # another batch
    assert padding.compared((6,)) is None


def test_the_guard_passes_a_program_that_differs_at_padded_positions_alone():
    torch.manual_seed(0)
    x = left_padded()
    model = Tagger().eval()
    with torch.no_grad():
        ref = model(**x)
    padding = padding_of(model, (), x)
    pad = ~padding.real[0]
    theirs = {"logits": ref["logits"].clone(), "score": ref["score"], "best": ref["best"].clone()}
    theirs["logits"][pad] += 0.4                       # undefined there: each runtime answers its own way
    theirs["best"][pad] = (theirs["best"][pad] + 1) % 5
    assert not check_outputs(ref, theirs).ok
    passed = check_outputs(ref, theirs, padding=padding)
    assert passed.ok and passed.uncompared == 2 * 5 + 2
    wrong = {**theirs, "logits": theirs["logits"].clone()}
    wrong["logits"][0, 3, 1] += 0.4                    # a real position
    assert "1 of 50 values" in check_outputs(ref, wrong, padding=padding).reason
    score = {**theirs, "score": ref["score"] + 0.4}    # per sequence: compared everywhere
    assert not check_outputs(ref, score, padding=padding).ok


def test_the_search_keeps_a_candidate_that_differs_at_padded_positions_alone(monkeypatch):
    from cuvil_pgc.recompile import plan as plan_mod
    from cuvil_pgc.recompile import search as search_mod
    from cuvil_pgc.recompile.realized import Realized
    from cuvil_pgc.recompile.trials import SearchOptions

    class PadsItsOwnWay(nn.Module):          # what ONNX Runtime returned for the OPT's padded rows
        def __init__(self, inner, where):
            super().__init__()
            self.inner, self.where = inner, where

        def forward(self, input_ids, attention_mask=None):
            out = dict(self.inner(input_ids, attention_mask))
            logits = out["logits"].clone()
            logits[self.where(attention_mask)] += 0.4
            return {**out, "logits": logits}

    def padded(mask):
        return mask == 0

    def first_real(mask):
        return (mask == 1) & (mask.cumsum(1) == 1)

    torch.manual_seed(0)
    model, x = Tagger().eval(), left_padded()
    for where, status in ((padded, "ok"), (first_real, "accuracy_error")):
        def fake_realize(module, cand, inputs, where=where, **kw):
            return Realized(PadsItsOwnWay(module, where) if not cand.scope else module)

        monkeypatch.setattr("cuvil_pgc.recompile.checked_build.realize", fake_realize)
        monkeypatch.setattr(plan_mod, "realize", fake_realize)
        options = SearchOptions(budget=2, backends=("ort",), rounds=3, deployed_race=False)
        result = search_mod.search(model, (x["input_ids"], x["attention_mask"]), None, options=options,
                                   records=None, machine_key="m")
        assert result.trials["<model>::ort"].status == status, result.trials["<model>::ort"].reason


@needs_ort
@pytest.mark.slow   # a two-layer OPT exported for ONNX Runtime, at its size and for others
def test_an_opt_given_a_left_padded_batch_gets_a_build_that_serves_other_paddings():
    transformers = pytest.importorskip("transformers")
    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.candidates import Candidate

    torch.manual_seed(0)
    config = transformers.OPTConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2, ffn_dim=64,
                                    vocab_size=100, max_position_embeddings=64, word_embed_proj_dim=32,
                                    use_cache=False)
    model = transformers.OPTForCausalLM(config).eval()
    x = {"input_ids": torch.randint(3, 100, (2, 12)), "attention_mask": torch.ones(2, 12, dtype=torch.long)}
    x["attention_mask"][1, :4] = 0
    build = recompile(model, x, plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3,
                      dynamic=True)
    choice, = build.plan.choices
    assert choice.candidate.backend == "ort" and choice.other_sizes_refused is None and choice.other_shapes
    fast = build.module
    other = {"input_ids": torch.randint(3, 100, (3, 9)), "attention_mask": torch.ones(3, 9, dtype=torch.long)}
    other["attention_mask"][0, :5] = 0
    other["attention_mask"][2, :1] = 0
    for call in (x, other, other):
        with torch.no_grad():
            got, want = fast(**call).logits, model(**call).logits
        real = call["attention_mask"].bool()
        torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-5)
    assert fast.fallback_calls == 0 and fast.other_shape_calls >= 1
