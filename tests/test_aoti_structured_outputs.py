"""An AOTInductor region whose output is a structure torch's pytree cannot write down (a
namedtuple class of the user's): the package returns the region's output tensors and the region
puts them back into the original structure, in the searching process and in a service that loads
the build. Before, packaging raised "Can't serialize TreeSpec of namedtuple class" and no
AOTInductor candidate of such a region was ever built."""

from __future__ import annotations

import dataclasses
import importlib
import json
import textwrap

import pytest
import torch

from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.plan_doc import PLAN_FORMAT, TENSOR_OUTPUTS_FORMAT, Plan
from tests._service import run_service

MODEL = textwrap.dedent('''
    import collections
    import torch
    from torch import nn

    Scores = collections.namedtuple("Scores", ["logits", "hidden", "aux"])


    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(12, 16), nn.Linear(16, 3)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            return Scores(self.fc2(h), h, None)


    def factory():
        torch.manual_seed(0)
        return Tagger().eval(), (torch.randn(2, 12),)
''')

SERVICE = textwrap.dedent('''
    import json, sys
    import torch
    from cuvil_pgc import load_build
    from {module} import factory

    model, inputs = factory()
    with torch.no_grad():
        ref = model(*inputs)
    fast = load_build(sys.argv[1], model, pubkey=sys.argv[2])
    other = torch.randn(5, 12)
    with torch.no_grad():
        outs = [fast(*inputs) for _ in range(3)]      # the first call learns the structure
        outs += [fast(other) for _ in range(2)]       # and the first of another size
        outs_ref = [ref] * 3 + [model(other)] * 2
    print(json.dumps({{"types": [type(o).__name__ for o in outs], "aux": [o.aux for o in outs],
                      "other_calls": fast.other_shape_calls,
                      "diff": max(float((o.logits - r.logits).abs().max()) for o, r in zip(outs, outs_ref)),
                      "applied": fast.cuvil_load_report.applied, "skipped": fast.cuvil_load_report.skipped,
                      "fallback_calls": fast.fallback_calls}}))
''')


@pytest.fixture
def tagger_module(tmp_path, monkeypatch):
    name = f"nt_tagger_{abs(hash(str(tmp_path))) % 10**8}"
    (tmp_path / f"{name}.py").write_text(MODEL)
    monkeypatch.syspath_prepend(str(tmp_path))
    return name, importlib.import_module(name)


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_an_aoti_region_returning_a_namedtuple_builds_and_loads_in_a_service(tmp_path, keys, tagger_module):
    name, module = tagger_module
    model, inputs = module.factory()
    build = recompile(model, inputs, plan={"": Candidate("", "aoti")}, records=False, deployed_race=False, rounds=3,
                      dynamic=True)
    other = torch.randn(5, 12)                                    # another batch: the program for other sizes
    with torch.no_grad():
        ref, out = model(*inputs), build.module(*inputs)
        other_ref, other_out = model(other), build.module(other)
    assert type(out) is module.Scores and out.aux is None and type(other_out) is module.Scores
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(other_out.hidden, other_ref.hidden, rtol=1e-4, atol=1e-5)
    assert build.module.fallback_calls == 0 and build.module.other_shape_calls == 1   # packages ran, not the original
    (choice,) = build.plan.choices
    assert choice.candidate.backend == "aoti" and choice.runtime["tensor_outputs"] is True
    doc = build.plan.to_json()
    assert doc["format"] == TENSOR_OUTPUTS_FORMAT > PLAN_FORMAT    # a reader of format 2 refuses it
    assert Plan.from_json(json.loads(json.dumps(doc))).choices[0].runtime["tensor_outputs"] is True

    path = build.save(tmp_path / "tagger.cuvilpkg", signing_key=str(keys[0]))
    report = run_service(SERVICE.format(module=name), path, keys[1], cwd=tmp_path)
    assert report["types"] == ["Scores"] * 5 and report["aux"] == [None] * 5, report
    assert report["other_calls"] == 2, report
    assert report["diff"] < 1e-4 and report["skipped"] == [] and report["applied"] == ["<model>: aoti (and other input sizes)"], report
    assert report["fallback_calls"] == 0, report


def test_plans_without_such_a_region_stay_format_2():
    plan = Plan.from_json({"format": 2, "choices": [{"scope": "", "candidate": {"scope": "", "backend": "aoti"},
                                                     "runtime": None}]})
    assert plan.to_json()["format"] == PLAN_FORMAT == 2


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_an_aoti_plan_returning_a_namedtuple_races_in_its_worker(tagger_module):
    """The search races whole-model plans in worker processes (:mod:`.standalone`): the worker
    rebuilds the package of output tensors without the model's code, and answers with its tensors."""
    from cuvil_pgc.recompile.apply import ScopeInputs, realize
    from cuvil_pgc.recompile.standalone import race_standalone, standalone_spec

    _, module = tagger_module
    model, inputs = module.factory()
    cand, scope_inputs = Candidate("", "aoti"), ScopeInputs(inputs)
    realized = realize(model, cand, scope_inputs)
    with torch.no_grad():
        reference = model(*inputs)
    spec = standalone_spec(cand, realized, scope_inputs, "cpu")
    assert spec["tensor_outputs"] is True and spec["outputs"] is None      # a namedtuple is not written down
    samples, failed = race_standalone({"aoti": spec}, inputs, {"aoti": reference}, rounds=2, replicas=1)
    assert failed == {} and len(samples["aoti"].seconds) == 2


class Counted(torch.nn.Module):
    """Returns numbers beside its tensors, as services' heads do (a count, a threshold)."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 4)

    def forward(self, x):
        y = self.fc(x)
        return {"scores": y, "pooled": (y.sum(1), None), "count": 3, "threshold": 0.5}


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_an_aoti_region_returning_numbers_beside_tensors_returns_them_as_numbers(tmp_path, keys):
    """A package returned the ``3`` of ``{"count": 3}`` as a tensor: the accuracy guard refused
    it, so no AOTInductor candidate of such a region was built. It is now a package of the output
    tensors, and the numbers come back from the plan's template, in this process and from the file."""
    from cuvil_pgc import load_build

    torch.manual_seed(0)
    model, inputs = Counted().eval(), (torch.randn(2, 12),)
    build = recompile(model, inputs, plan={"": Candidate("", "aoti")}, records=False, deployed_race=False, rounds=3)
    (choice,) = build.plan.choices
    assert choice.runtime["tensor_outputs"] is True and choice.runtime["outputs"] is not None   # written down
    path = build.save(tmp_path / "counted.cuvilpkg", signing_key=str(keys[0]))
    fresh = Counted().eval()
    fresh.load_state_dict(model.state_dict())
    loaded = load_build(path, fresh, pubkey=keys[1])
    with torch.no_grad():
        ref = model(*inputs)
        for out in (build.module(*inputs), loaded(*inputs)):
            assert type(out["count"]) is int and out["count"] == 3 and type(out["threshold"]) is float
            assert out["pooled"][1] is None
            torch.testing.assert_close(out["scores"], ref["scores"], rtol=1e-4, atol=1e-5)
            torch.testing.assert_close(out["pooled"][0], ref["pooled"][0], rtol=1e-4, atol=1e-5)
    assert loaded.fallback_calls == 0 and loaded.cuvil_load_report.skipped == []


@dataclasses.dataclass
class Boxed:
    logits: torch.Tensor
    hidden: torch.Tensor


class BoxedHead(torch.nn.Module):
    """Returns a plain ``@dataclass`` holding its tensors, which torch's pytree does not open."""

    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(12, 4)

    def forward(self, x):
        y = self.fc(x)
        return Boxed(y, torch.relu(y))


@pytest.mark.usefixtures("build_env")
def test_an_aoti_region_returning_a_dataclass_returns_a_new_one_with_this_call_s_tensors():
    """A package of the output tensors once put a dataclass back as the example call's object: the
    build returned the example's logits for every input, so such a region got no AOTInductor
    candidate. The dataclass is now rebuilt around the package's tensors."""
    torch.manual_seed(0)
    model, inputs = BoxedHead().eval(), (torch.randn(2, 12),)
    build = recompile(model, inputs, plan={"": Candidate("", "aoti")}, records=False, deployed_race=False, rounds=3)
    assert [c.candidate.backend for c in build.plan.choices] == ["aoti"]
    other = torch.randn(2, 12)
    with torch.no_grad():
        out, ref = build.module(other), model(other)
    assert type(out) is Boxed
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out.hidden, ref.hidden, rtol=1e-4, atol=1e-5)
