"""Builds end to end: recompile → save → load_build, compatibility refusal, eager fallback, warm loads."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from cuvil_pgc.analyze.analysis import Analysis, RegionStats
from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile import load_build, recompile
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.manifest import Fingerprint, current_fingerprint
from cuvil_pgc.recompile.matching import structural_hash
from cuvil_pgc.recompile.package import BuildWriter, open_build
from cuvil_pgc.recompile.records import RecordDB
from cuvil_pgc.recompile.signing import generate_keypair

pytestmark = pytest.mark.usefixtures("build_env")     # own cache, no trust from the environment


class HostBound(nn.Module):
    """Python work around a few ops: an exported package drops it, eager pays it every call."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = 0
        for i in range(3000):     # host-side work with no tensor ops
            total += i
        return self.fc2(torch.relu(self.fc1(x))) + (total * 0)


def host_bound():
    torch.manual_seed(0)
    return HostBound().eval(), (torch.randn(2, 16),)


def _analysis() -> Analysis:
    def rs(path, label, module):
        return RegionStats(path=path, calls=10, total_us=2000.0, self_us=1500.0, mean_us=200.0, p50_us=200.0,
                           p95_us=200.0, p99_us=200.0, share=0.9, hotness=1500.0, bottleneck=label, confidence=0.9,
                           evidence={"module": module})
    return Analysis(regions=[rs("model", "host_bound", "HostBound"), rs("model/model.fc1", "launch_overhead", "Linear")])


def _write_build(path, model, *, fingerprint: Fingerprint, choices=(), key=None) -> None:
    plan = {"format": 1, "device": "cpu", "choices": list(choices), "regions": []}
    w = BuildWriter(path, "m", 1, fingerprint=fingerprint, model_hash=structural_hash(model),
                    model_class=type(model).__qualname__)
    w.add_bytes("plan.json", json.dumps(plan).encode())
    w.close(None if key is None else str(key))


def test_load_build_refuses_another_environment_and_falls_back_to_eager(tmp_path, keys):
    model, inputs = host_bound()
    fp = current_fingerprint("cpu")
    # "Another machine" is derived from this one, whatever its ISA: every other field stays equal.
    other = Fingerprint(torch="1.13.0", python=fp.python, platform=fp.platform, cpu_isa=f"not-{fp.cpu_isa}",
                        device=fp.device)
    path = tmp_path / "old.cuvilpkg"
    _write_build(path, model, fingerprint=other, key=keys[0])
    with pytest.raises(BuildError) as err:
        load_build(path, model, pubkey=keys[1])
    message = str(err.value)
    assert "torch: built '1.13.0'" in message and "cpu_isa" in message and "fallback='eager'" in message
    with pytest.warns(RuntimeWarning, match="eager"):
        same = load_build(path, model, fallback="eager", pubkey=keys[1])
    assert same is model and "fell back" in same.cuvil_load_report.notes[0]


def test_load_build_verifies_before_reading(tmp_path, keys):
    model, _ = host_bound()
    path = tmp_path / "b.cuvilpkg"
    _write_build(path, model, fingerprint=current_fingerprint("cpu"), key=keys[0])
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x01               # one flipped byte, inside a member's data
    path.write_bytes(bytes(data))
    with pytest.raises(BuildError):
        load_build(path, model, pubkey=keys[1])


@pytest.mark.slow
def test_round_trip_eager_space_and_changed_region_is_skipped(tmp_path, keys):
    model, inputs = host_bound()
    build = recompile(model, inputs, analysis=_analysis(), backends=("eager",), rounds=5,
                      records=RecordDB(tmp_path / "rec"), plan={"fc1": Candidate("fc1", rewrite=True)})
    out = build.save(tmp_path / "e.cuvilpkg", name="hb", version=3, signing_key=keys[0])
    with open_build(out) as vb:
        plan = json.loads(vb.read_bytes("plan.json"))
        assert vb.manifest.name == "hb" and vb.manifest.version == 3
        assert vb.manifest.model_hash == structural_hash(model)
    assert [c["config"] for c in plan["choices"]] == ["eager+rewrite"]
    fast = load_build(out, model, pubkey=keys[1])
    assert fast.cuvil_load_report.applied == ["fc1: eager+rewrite"]
    with torch.no_grad():
        assert torch.allclose(fast(*inputs), model(*inputs), atol=1e-6)
    from cuvil_pgc.recompile.store import BuildStore

    store = BuildStore(tmp_path / "store")
    store.trust(keys[1])
    store.push(out)
    store.tag("hb", 3, "stable")
    via_store = load_build("store://hb@stable", model, store=tmp_path / "store")
    assert via_store.cuvil_load_report.applied == ["fc1: eager+rewrite"]
    changed = HostBound().eval()
    changed.fc1 = nn.Linear(16, 32, bias=False)
    stale = load_build(out, changed, pubkey=keys[1])
    assert stale.cuvil_load_report.applied == [] and "changed" in stale.cuvil_load_report.skipped[0]


@pytest.mark.slow
def test_recompile_aoti_round_trip_signed(tmp_path):
    model, inputs = host_bound()
    key, pub = generate_keypair(tmp_path / "k")
    build = recompile(model, inputs, analysis=_analysis(), backends=("aoti",), budget=2, rounds=5,
                      records=RecordDB(tmp_path / "rec"))
    doc = build.to_json()
    assert doc["space_size"] >= 3 and doc["measured_candidates"] <= 3
    assert {"path", "chosen", "predicted_ms", "measured_ms", "baseline_ms", "alternatives"} <= set(doc["regions"][0])
    whole = doc["regions"][0]       # the whole model's row quotes the final race, like the plan's totals
    assert whole["scope"] == "<model>"
    assert (whole["measured_ms"], whole["baseline_ms"]) == (doc["plan_ms"], doc["baseline_ms"])
    assert any(r.features.get("probe") for r in RecordDB(tmp_path / "rec"))     # backends calibrated first
    aoti_trials = [t for t in build.result.trials.values() if t.candidate.backend == "aoti" and t.status == "ok"]
    assert aoti_trials, "an AOTInductor candidate must compile and pass the guard"
    path = build.save(tmp_path / "a.cuvilpkg", signing_key=key)
    with open_build(path, pub, require_signature=True) as vb:
        members = vb.members()
        chosen = json.loads(vb.read_bytes("plan.json"))["choices"]
    n_aoti = sum(c["candidate"]["backend"] == "aoti" for c in chosen)
    assert sum(m.endswith(".pt2") for m in members) == n_aoti
    fresh, _ = host_bound()
    fast = load_build(path, fresh, pubkey=pub, require_signature=True)
    assert fast.cuvil_load_report.aoti_packages == n_aoti
    with torch.no_grad():
        assert torch.allclose(fast(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)


#: a deployment's process loads the build; torch's CPU ISA probe would raise (see aoti_loader: it
#: compiles and loads a test library per ISA, 48 s of a fresh process's load on the H200)
FRESH_LOAD = """
import sys, torch, torch._inductor.cpu_vec_isa as isa
def probed(*args, **kwargs):
    raise AssertionError("the CPU ISA was probed")
isa.pick_vec_isa = isa.valid_vec_isa_list = probed
from cuvil_pgc.recompile import load_build
from tests.test_recompile_build import host_bound
model, inputs = host_bound()
fast = load_build(sys.argv[1], model)
with torch.no_grad():
    print(fast.cuvil_load_report.aoti_packages, torch.allclose(fast(*inputs), model(*inputs), rtol=1e-4, atol=1e-5))
"""


def _load_in_a_fresh_process(path) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", FRESH_LOAD, str(path)], capture_output=True, text=True,
                          timeout=300, cwd=Path(__file__).resolve().parent.parent)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.split()


@pytest.mark.slow
def test_a_package_is_not_applied_to_weights_changed_since_the_build(tmp_path, monkeypatch):
    """An AOTInductor package holds the weights it was built with: a fine-tuned model of the same
    structure runs that region eagerly, listed and warned about, never with the old weights. A
    fresh process loads the build without torch's CPU ISA probe."""
    model, inputs = host_bound()
    build = recompile(model, inputs, plan={"": Candidate("", "aoti")}, rounds=5, records=RecordDB(tmp_path / "rec"))
    path = build.save(tmp_path / "w.cuvilpkg")
    monkeypatch.setenv("CUVIL_ALLOW_UNSIGNED", "1")       # the documented opt-in, for the whole test
    assert load_build(path, host_bound()[0]).cuvil_load_report.aoti_packages == 1
    assert _load_in_a_fresh_process(path) == ["1", "True"]
    tuned, _ = host_bound()
    with torch.no_grad():
        tuned.fc1.bias.add_(0.5)
    # a service that loads its checkpoint into the loaded build would run eagerly for good: the warning says so
    with pytest.warns(RuntimeWarning, match="weights changed since the build.*load it into the model first"):
        loaded = load_build(path, tuned)
    assert loaded.cuvil_load_report.aoti_packages == 0 and loaded.cuvil_load_report.applied == []
    with torch.no_grad():
        assert torch.equal(loaded(*inputs), tuned(*inputs))
    with pytest.raises(BuildError, match=r"1 region\(s\) changed since the build: <model>: weights changed"):
        load_build(path, tuned, stale="error")               # a deployment that wants no silent eager region
    with pytest.warns(RuntimeWarning, match="running the model in eager mode: .*weights changed"):
        assert load_build(path, tuned, stale="error", fallback="eager") is tuned
    with pytest.raises(BuildError, match="stale='ignore' is not one of"):
        load_build(path, tuned, stale="ignore")


@pytest.mark.slow
def test_pinned_compile_plan_ships_cache_artifacts_and_second_load_is_warm(tmp_path):
    model, inputs = host_bound()
    build = recompile(model, inputs, plan={"fc1": Candidate("fc1", "compile")}, rounds=5,
                      records=RecordDB(tmp_path / "rec"))
    path = build.save(tmp_path / "c.cuvilpkg")
    with open_build(path) as vb:
        assert "inductor_cache.bin" in vb.members()
    torch._dynamo.reset()
    first = load_build(path, host_bound()[0], example_inputs=inputs, allow_unsigned=True)
    torch._dynamo.reset()
    second = load_build(path, host_bound()[0], example_inputs=inputs, allow_unsigned=True)
    report = second.cuvil_load_report
    assert first.cuvil_load_report.cache_artifacts == "loaded"
    assert report.compiled_regions == 1 and report.cache_hits >= 1 and report.cache_misses == 0 and report.warm
    with torch.no_grad():
        assert torch.allclose(second(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)


@pytest.mark.cuda
def test_cuda_graphs_plan_round_trip(tmp_path):
    model, inputs = host_bound()
    build = recompile(model, inputs, device="cuda", plan={"": Candidate("", "cudagraphs", mode="reduce-overhead")},
                      rounds=5, records=False)
    path = build.save(tmp_path / "g.cuvilpkg")
    fast = load_build(path, host_bound()[0], allow_unsigned=True)
    x = inputs[0].cuda()
    with torch.no_grad():
        for _ in range(3):
            out = fast(x)
        assert torch.allclose(out, model.cuda()(x), rtol=1e-4, atol=1e-5)
