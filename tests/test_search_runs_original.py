"""A candidate whose build would run the original module in the searching process (a hook inside
its region, which no compiled program calls) is rejected with the reason: its figure would be
eager's and its accuracy eager's. Hugging Face models in transformers 5 install such hooks on
their first call with ``output_hidden_states``; every candidate of such a model once measured as
eager and passed the guard, bf16 included, and went into the records as "ok"."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile import search as search_mod
from cuvil_pgc.recompile.records import UNFINISHED, RecordDB
from cuvil_pgc.recompile.trials import SearchOptions

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="needs onnxruntime")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


def _search(tmp_path, on_the_model: bool = False):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    (model if on_the_model else model[0]).register_forward_hook(lambda m, args, out: None)   # a user's hook
    db = RecordDB(tmp_path / "rec")
    options = SearchOptions(budget=4, backends=("ort",), rounds=3, deployed_race=False)
    result = search_mod.search(model, (torch.randn(2, 16),), None, options=options, records=db, machine_key="m")
    ort = [t for key, t in result.trials.items() if key.startswith("<model>::ort")]
    assert result.choices.get("") is None or result.choices[""].backend == "eager"
    # a state of this process, not of the candidates: the next search tries them again (the model has
    # one scope here; without the hook these are recorded "ok")
    assert not [r for r in db.for_machine("m") if r.candidate.startswith("ort") and r.status != UNFINISHED]
    return result, ort


WHY = "the build runs the original module here: a hook is registered on '0'"


@needs_ort
def test_a_scope_with_a_hook_inside_gets_no_build_and_says_why(tmp_path, caplog):
    """Every build of the scope would run the original module: none is built, none is recorded, and
    the user is told which hook keeps it eager (the plan's table said "runs_original" alone)."""
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.search"):
        result, ort = _search(tmp_path)
    said = [r.getMessage() for r in caplog.records if "gets no program" in r.getMessage()]
    assert said == ["cuvil-pgc: <model> gets no program: a hook is registered on '0', which the build's programs "
                    "do not call (the original module does, as long as the hook stays); remove the hook before "
                    "recompile for a build of it (a hook on a module outside it leaves it on its program)"]
    assert ort and all(t.status == "not_measured" or (t.status == "runs_original" and t.reason.startswith(
        "not built: " + WHY)) for t in ort), ort
    assert any(t.status == "runs_original" for t in ort)


@needs_ort
def test_a_hook_on_the_scope_itself_is_told_where_it_runs_around_the_program(tmp_path, caplog):
    """A service's monitoring hook on its model: registered on the model load_build returns, it
    runs around the build's program (tests/test_region_inner_hooks.py); said, beside removing it."""
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.search"):
        _search(tmp_path, on_the_model=True)
    said = [r.getMessage() for r in caplog.records if "gets no program" in r.getMessage()]
    assert len(said) == 1 and "registered on the original module" in said[0], said
    assert "registered, after load_build, on the module load_build returns in its place" in said[0], said


@needs_ort
def test_a_build_that_ran_the_original_module_is_rejected_and_not_recorded(tmp_path, monkeypatch):
    """What a look at the scope's hooks cannot foresee: the built region ran the original module."""
    monkeypatch.setattr(search_mod, "hooked_inside", lambda module: None)
    result, ort = _search(tmp_path)
    built = [t for t in ort if t.status == "runs_original" and not t.reason.startswith("not built")]
    assert len(built) == 1, ort           # so would every other build of the scope: one is built, no more
    assert built[0].reason.startswith(WHY) and built[0].measured_us is None
    others = [t for t in ort if t is not built[0]]
    assert others and all(t.status == "not_measured" or (t.status == "runs_original" and t.reason == "not built: "
                                                         + built[0].reason) for t in others)


@needs_ort
class Asking(nn.Module):
    """A service's call of a Hugging Face model, asking for hidden states or not (``hidden``)."""

    def __init__(self, model, hidden):
        super().__init__()
        self.model, self.hidden = model, hidden

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=self.hidden)


def _tiny_bert(transformers, hidden):
    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=100, max_position_embeddings=32)
    ids = torch.randint(1, 100, (1, 12))
    return Asking(transformers.BertModel(config).eval(), hidden).eval(), {"input_ids": ids,
                                                                          "attention_mask": torch.ones_like(ids)}


def test_hugging_face_output_capturing_hooks_inside_the_region_s_model_are_its_program_s_outputs():
    """transformers 5 hooks a model's layers on its first call with output_hidden_states; a region
    holding the whole model traced what they collect into its outputs, and runs its program. A
    region below the model (its encoder) must let them run: the collector is its caller's."""
    transformers = pytest.importorskip("transformers")
    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.region_hooks import hf_collector, hooked_inside

    model, inputs = _tiny_bert(transformers, hidden=True)
    with torch.no_grad():
        reference = model(**inputs)           # installs the hooks, as the profile's and recompile's calls do
    if hf_collector(model.model.encoder) is None:
        pytest.skip("this transformers installs no output-capturing hooks")
    assert hooked_inside(model) is None and hooked_inside(model.model) is None
    assert hf_collector(model) is None and hf_collector(model.model) is None     # their model is inside
    build = recompile(model, inputs, plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3,
                      calibrate=False)
    with torch.no_grad():
        out = build.module(**inputs)
    assert build.module.fallback_calls == 0
    assert len(out.hidden_states) == len(reference.hidden_states) == 3
    for a, b in zip(out.hidden_states, reference.hidden_states, strict=True):
        torch.testing.assert_close(a, b)


def test_a_region_below_a_hugging_face_model_runs_its_program_unless_the_call_collects_hidden_states():
    """The encoder of a BERT carries the model's output-capturing hooks on its layers (wav2vec2's
    encoder did after its first call): the region runs its program for a call that asks for no
    hidden states, and the original module, whose layers the hooks collect, for one that asks."""
    transformers = pytest.importorskip("transformers")
    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.region_hooks import hf_collector, hooked_inside

    model, inputs = _tiny_bert(transformers, hidden=True)
    with torch.no_grad():
        reference = model(**inputs)           # installs the hooks
    model.hidden = False
    if hf_collector(model.model.encoder) is None:
        pytest.skip("this transformers installs no output-capturing hooks")
    assert hooked_inside(model.model.encoder) is None
    build = recompile(model, inputs, plan={"model.encoder": Candidate("model.encoder", "ort")}, records=False,
                      deployed_race=False, rounds=3, calibrate=False)
    region = build.module.model.encoder
    with torch.no_grad():
        plain = build.module(**inputs)
        assert region.fallback_calls == 0                          # its program ran
        torch.testing.assert_close(plain.last_hidden_state, reference.last_hidden_state)
        build.module.hidden = True
        asked = build.module(**inputs)
    assert region.fallback_calls == 1
    assert len(asked.hidden_states) == len(reference.hidden_states) == 3
    for a, b in zip(asked.hidden_states, reference.hidden_states, strict=True):
        torch.testing.assert_close(a, b)



def test_a_region_whose_layers_hugging_face_hooks_collect_for_a_model_outside_runs_its_original_module_then():
    """A region called just as it was captured, by a model that passes its layers no flag, only the
    collector (transformers 5's capture_outputs): its fast call would skip the hooks, so every call
    asks whether the model's forward collects now."""
    pytest.importorskip("transformers")
    from transformers.utils.output_capturing import _active_collector, install_output_capuring_hook

    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.region_hooks import COLLECTING

    torch.manual_seed(0)
    body = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8))
    install_output_capuring_hook(body[0], "hidden_states", 0)
    model, x = nn.Sequential(body, nn.Linear(8, 2)).eval(), torch.randn(3, 8)
    build = recompile(model, (x,), plan={"0": Candidate("0", "ort")}, records=False, deployed_race=False, rounds=3,
                      calibrate=False)
    region = build.module[0]
    with torch.no_grad():
        for _ in range(3):
            region(x)
        assert region.fallback_calls == 0                   # nothing collects: its program
        collected = {"hidden_states": []}
        token = _active_collector.set(collected)
        try:
            out = region(x)
        finally:
            _active_collector.reset(token)
        assert region.fallback_calls == 1 and region.first_fallback == COLLECTING
        assert len(collected["hidden_states"]) == 2          # the layer's input and output, as eager collects
        torch.testing.assert_close(collected["hidden_states"][1], body[0](x))
        torch.testing.assert_close(out, body(x))
        region(x)
        assert region.fallback_calls == 1


def test_a_transformers_that_keeps_its_collector_elsewhere_leaves_such_a_region_on_its_original_module(monkeypatch):
    """Where this version of transformers' collector cannot be found, a call cannot be told not to
    collect: the region runs its original module, as it did before it could tell."""
    pytest.importorskip("transformers")
    import transformers.utils.output_capturing as capturing

    from cuvil_pgc.recompile.region_hooks import collecting, hf_collector

    body = nn.Sequential(nn.Linear(4, 4))
    capturing.install_output_capuring_hook(body[0], "hidden_states", 0)
    assert not collecting(hf_collector(body))                  # found: nothing collects now
    monkeypatch.delattr(capturing, "_active_collector")
    collector = hf_collector(body)
    assert collector is not None and collecting(collector)
