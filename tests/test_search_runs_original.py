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
from cuvil_pgc.recompile.records import RecordDB
from cuvil_pgc.recompile.trials import SearchOptions

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="needs onnxruntime")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


def _search(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4)).eval()
    model[0].register_forward_hook(lambda m, args, out: None)      # a user's hook inside the model
    db = RecordDB(tmp_path / "rec")
    options = SearchOptions(budget=4, backends=("ort",), rounds=3, deployed_race=False)
    result = search_mod.search(model, (torch.randn(2, 16),), None, options=options, records=db, machine_key="m")
    ort = [t for key, t in result.trials.items() if key.startswith("<model>::ort")]
    assert result.choices.get("") is None or result.choices[""].backend == "eager"
    # a state of this process, not of the candidates: the next search tries them again (the model has
    # one scope here; without the hook these are recorded "ok")
    assert not [r for r in db.for_machine("m") if r.candidate.startswith("ort")]
    return result, ort


WHY = "the build runs the original module here: a hook is registered on '0'"


@needs_ort
def test_a_scope_with_a_hook_inside_gets_no_build_and_says_why(tmp_path):
    """Every build of the scope would run the original module: none is built, none is recorded."""
    result, ort = _search(tmp_path)
    assert ort and all(t.status == "not_measured" or (t.status == "runs_original" and t.reason.startswith(
        "not built: " + WHY)) for t in ort), ort
    assert any(t.status == "runs_original" for t in ort)


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
