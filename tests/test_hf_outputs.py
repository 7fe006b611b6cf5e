"""Runtime regions of Hugging Face models return the model's own ``ModelOutput``, built without its
constructor where the template proved the fast build equal to it (``recompile/hf_outputs.py``), in
C on the lean call (``_leancall.c``)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_leaves, tree_unflatten

from cuvil_pgc.recompile import lean_call, output_template
from cuvil_pgc.recompile.hf_outputs import model_output, same_model_output
from cuvil_pgc.recompile.output_template import OutputTemplate

outputs_mod = pytest.importorskip("transformers.modeling_outputs")


@pytest.mark.parametrize("make", [
    lambda a, b: outputs_mod.BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=a, pooler_output=b),
    lambda a, b: outputs_mod.CausalLMOutputWithCrossAttentions(loss=None, logits=a, hidden_states=(b,)),
    lambda a, b: outputs_mod.BaseModelOutput(last_hidden_state=a),
], ids=["bert-pooled", "none-first-field-and-a-tuple", "one-field"])
def test_a_model_output_is_rebuilt_equal_to_its_constructors(make, monkeypatch):
    template = OutputTemplate.of(make(torch.randn(1, 4, 8), torch.randn(1, 8)))
    loaded = OutputTemplate.from_json(template.to_json())          # what a loaded build has
    for tm in (template, loaded):
        outs = [torch.randn(*shape) for shape, _ in tm.tensors]
        reference = make(*outs) if len(outs) == 2 else make(outs[0], None)
        first = tm.build(outs)
        assert type(first) is type(reference) and list(first.keys()) == list(reference.keys())
        assert [id(x) for x in tree_leaves(first)] == [id(x) for x in tree_leaves(reference)] == list(map(id, outs))
        cls = type(reference)
        built = []
        monkeypatch.setattr(cls, "__post_init__", lambda self, real=cls.__post_init__, built=built: built.append(1) or real(self))
        again = tm.build(outs)
        monkeypatch.undo()
        assert tm.model_output is not None and built == []           # no constructor call, a tuple field too
        assert [id(x) for x in tree_leaves(again)] == list(map(id, outs)) and again.to_tuple()[0] is outs[0]
        assert same_model_output(again, reference)
        assert list(again.keys()) == list(reference.keys()) and again[0] is reference[0]


def test_a_fast_build_that_disagrees_with_the_constructor_is_dropped(monkeypatch):
    output = outputs_mod.BaseModelOutput(last_hidden_state=torch.randn(2, 3))
    assert OutputTemplate.of(output).model_output is not None
    monkeypatch.setattr(output_template, "same_model_output", lambda fast, reference: False)
    template = OutputTemplate.of(output)
    assert template.model_output is None and template.lean_build == template.build   # the constructor
    outs = [torch.randn(2, 3)]
    assert type(template.build(outs)).__name__ == "BaseModelOutput" and template.build(outs).last_hidden_state is outs[0]


def test_a_fast_build_that_fails_is_dropped(monkeypatch):
    """A class whose own construction cannot run on the template's placeholders keeps the constructor."""
    output = outputs_mod.BaseModelOutput(last_hidden_state=torch.randn(2, 3))
    monkeypatch.setattr(output_template, "same_model_output", lambda fast, reference: 1 / 0)
    assert OutputTemplate.of(output).model_output is None


@pytest.mark.skipif(not lean_call.ACCELERATED, reason="the C lean call is not built")
@pytest.mark.parametrize("make", [
    lambda a, b: outputs_mod.BaseModelOutputWithPoolingAndCrossAttentions(last_hidden_state=a, pooler_output=b),
    lambda a, b: outputs_mod.CausalLMOutputWithCrossAttentions(loss=None, logits=a),
    lambda a, b: outputs_mod.BaseModelOutput(last_hidden_state=a),
    lambda a, b: outputs_mod.BaseModelOutput(last_hidden_state=a, hidden_states=(a, b)),
    lambda a, b: outputs_mod.BaseModelOutputWithPast(last_hidden_state=a, past_key_values=((a, b), (b, a))),
], ids=["bert-pooled", "none-first-field", "one-field", "a-tuple-field", "a-legacy-cache"])
def test_the_c_model_output_is_the_python_ones(make):
    from cuvil_pgc.recompile import _leancall

    template = OutputTemplate.of(make(torch.randn(1, 4, 8), torch.randn(1, 8)))
    recipe = template.model_output
    assert recipe is not None
    outs = [torch.randn(*shape) for shape, _ in template.tensors]
    c, python = _leancall.model_output(recipe, outs), model_output(recipe, outs)
    constructed = tree_unflatten(outs, template.spec)                # through the class's constructor
    assert same_model_output(c, python) and same_model_output(c, constructed)
    assert c.__dict__.keys() == python.__dict__.keys() and list(c.items()) == list(python.items())
    assert [id(x) for x in tree_leaves(c)] == list(map(id, outs))
    with pytest.raises(TypeError, match="recipe"):
        _leancall.model_output(recipe[:3], outs)
    with pytest.raises(IndexError):                                  # fewer outputs than the recipe takes
        _leancall.model_output(recipe, [])
