"""A candidate whose outputs are garbage (values no rounding makes) was rejected like one that
rounds a little too much, and its record kept it out of every later search on the machine: one
transient runtime fault (seen once with OpenVINO returning 1.7e34 for logits of about 1) banned
the candidate for good."""

from __future__ import annotations

import pytest
import torch

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile.accuracy import GUARD_VERSION, check_outputs
from cuvil_pgc.recompile.apply import ScopeInputs, measurement_key
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.records import Record, RecordDB
from cuvil_pgc.recompile.search_records import SearchRecords


@pytest.mark.parametrize(("out", "garbage"), [
    (torch.tensor([1.0, -2.0, 1.7e34]), True),
    (torch.tensor([1.0, float("nan"), 3.0]), True),
    (torch.tensor([1.0, -2.0, float("inf")]), True),
    (torch.tensor([1.0, -2.0, 3.5]), False),           # off, but by what rounding or a bug in range makes
    (torch.tensor([1.0, -2.0, 3.0]), False),           # passes
])
def test_garbage_is_told_from_a_precision_failure(out, garbage):
    check = check_outputs(torch.tensor([1.0, -2.0, 3.0]), out)
    assert check.garbage is garbage
    assert check.ok is (not garbage and float(out[2]) == 3.0)


def test_a_garbage_verdict_is_not_reused_but_a_precision_verdict_is(tmp_path):
    db = RecordDB(tmp_path / "rec")
    inputs = {"": ScopeInputs((torch.randn(2, 4),))}
    records = SearchRecords(db, "m", {"": "s"}, {"": "settings"}, {"": "w"}, inputs)
    rounded, faulty = Candidate("", "ort", precision="bf16"), Candidate("", "openvino")
    for cand, fault in ((rounded, False), (faulty, True)):
        db.add(Record(structure=records._structure(""), candidate=measurement_key(cand), machine="m",
                      inputs=inputs[""].signature, status="accuracy_error", reason="off",
                      features={"weights": "w", "guard": GUARD_VERSION, **({"fault": True} if fault else {})}))
    assert records.reusable(rounded) is not None
    assert records.reusable(faulty) is None


@pytest.mark.slow   # two small searches with their CPU probes
@pytest.mark.skipif(not (runtimes.check("ort").ok and runtimes.check("openvino").ok), reason="needs both runtimes")
def test_a_search_marks_garbage_and_the_next_search_checks_the_candidate_again(tmp_path, monkeypatch):
    from torch import nn

    from cuvil_pgc.recompile import plan as plan_mod
    from cuvil_pgc.recompile import search as search_mod
    from cuvil_pgc.recompile.realized import Realized
    from cuvil_pgc.recompile.trials import SearchOptions

    class Garbage(nn.Module):          # what a faulty runtime returned
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(*args) * 0 + 1.7e34

    built: list[str] = []

    def fake_realize(module, cand, inputs, **kw):
        built.append(cand.key)
        return Realized(Garbage(module) if cand.backend == "openvino" else module)

    monkeypatch.setattr("cuvil_pgc.recompile.checked_build.realize", fake_realize)
    monkeypatch.setattr(plan_mod, "realize", lambda module, cand, inputs, **kw: Realized(module))
    monkeypatch.setattr(runtimes, "openvino_native_bf16", lambda: False)
    db = RecordDB(tmp_path / "rec")
    torch.manual_seed(0)
    model, inputs = nn.Sequential(nn.Linear(16, 8), nn.ReLU()).eval(), (torch.randn(2, 16),)
    options = SearchOptions(budget=3, backends=("ort", "openvino"), rounds=3, deployed_race=False)
    first = search_mod.search(model, inputs, None, options=options, records=db, machine_key="m")
    faulty = first.trials["<model>::openvino"]
    assert faulty.status == "accuracy_error" and faulty.fault and "runtime fault" in faulty.reason
    built.clear()
    again = search_mod.search(model, inputs, None, options=options, records=db, machine_key="m")
    assert "<model>::openvino" in built and not again.trials["<model>::openvino"].reused
    assert again.trials["<model>::ort"].reused                     # an ordinary record is still reused
