"""Runtime regions of Hugging Face models return the model's own ``ModelOutput``, built without its
constructor once a first build proved the fast one equal to it (``recompile/hf_outputs.py``)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._pytree import tree_leaves

from cuvil_pgc.recompile import output_template
from cuvil_pgc.recompile.hf_outputs import same_model_output
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
        first = tm.build(outs)                                       # proven against the constructor
        assert type(first) is type(reference) and list(first.keys()) == list(reference.keys())
        assert [id(x) for x in tree_leaves(first)] == [id(x) for x in tree_leaves(reference)] == list(map(id, outs))
        cls = type(reference)
        built = []
        monkeypatch.setattr(cls, "__post_init__", lambda self, real=cls.__post_init__, built=built: built.append(1) or real(self))
        again = tm.build(outs)
        monkeypatch.undo()
        if tm._hf is None:                                           # nested outputs take the generic path
            assert isinstance(reference.hidden_states, tuple) and built == [1]
        else:
            assert built == []                                       # no constructor call
        assert [id(x) for x in tree_leaves(again)] == list(map(id, outs)) and again.to_tuple()[0] is outs[0]
        assert tm._hf is None or same_model_output(again, reference)
        assert list(again.keys()) == list(reference.keys()) and again[0] is reference[0]


def test_a_fast_build_that_disagrees_with_the_constructor_is_dropped(monkeypatch):
    template = OutputTemplate.of(outputs_mod.BaseModelOutput(last_hidden_state=torch.randn(2, 3)))
    assert template._hf is not None
    monkeypatch.setattr(output_template, "same_model_output", lambda fast, reference: False)
    outs = [torch.randn(2, 3)]
    first = template.build(outs)
    assert template._hf is None and first.last_hidden_state is outs[0]
    assert type(template.build(outs)).__name__ == "BaseModelOutput"   # the constructor from now on
