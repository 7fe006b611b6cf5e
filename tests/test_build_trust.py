"""Secure by default: only builds signed by a trusted key load, the opt-in is explicit and logged,
and every failure of loading becomes the plain model under fallback="eager".

Also: a build made for another model is refused (load_build and compare), and a build records the
torch thread count it was measured at (load_build warns in a process that runs another).
"""

from __future__ import annotations

import json
import logging
import zipfile

import pytest
import torch
from torch import nn

from cuvil_pgc._structure import module_tree_digest
from cuvil_pgc.cli import main
from cuvil_pgc.errors import BuildError, ConfigError
from cuvil_pgc.recompile import load_build
from cuvil_pgc.recompile.manifest import current_fingerprint
from cuvil_pgc.recompile.matching import structural_hash
from cuvil_pgc.recompile.package import BuildWriter, open_build
from cuvil_pgc.recompile.signing import generate_keypair
from tests._buildkit import read_entries, write_entries

pytestmark = pytest.mark.usefixtures("build_env")     # own cache, no trust from the environment


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Other(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def small():
    torch.manual_seed(0)
    return Small().eval(), (torch.randn(2, 8),)


@pytest.fixture
def spies(monkeypatch):
    """Records every manifest parse, member read and native load of a build."""
    import cuvil_pgc.recompile.apply as apply_mod
    import cuvil_pgc.recompile.package as package_mod

    calls: list[str] = []
    real_decode, real_read = package_mod.decode_manifest, package_mod.VerifiedBuild.read_bytes

    def decode(data, *, path):
        calls.append("decode_manifest")
        return real_decode(data, path=path)

    def read_bytes(self, name):
        calls.append(f"read {name}")
        return real_read(self, name)

    def realize(*a, **k):
        calls.append("realize")
        raise AssertionError("a native artifact was loaded")

    monkeypatch.setattr(package_mod, "decode_manifest", decode)
    monkeypatch.setattr(package_mod.VerifiedBuild, "read_bytes", read_bytes)
    monkeypatch.setattr(apply_mod, "realize", realize)
    return calls


def _aoti_choice(model) -> dict:
    return {"scope": "", "candidate": {"scope": "", "backend": "aoti"}, "config": "aoti",
            "structure": structural_hash(model), "weights": None, "input_signature": "x",
            "input_spec": None, "artifact": "aoti/0.pt2"}


def write_build(path, model, *, key=None, choices=(), plan=None, members=None, threads=0):
    """A build for ``model`` on this machine; ``members`` adds raw members (a crafted .so)."""
    plan = plan if plan is not None else {"format": 1, "device": "cpu", "choices": list(choices), "regions": []}
    w = BuildWriter(path, "m", 1, fingerprint=current_fingerprint("cpu"), model_hash=structural_hash(model),
                    model_class=type(model).__qualname__, threads=threads,
                    model_tree=module_tree_digest(model))
    w.add_bytes("plan.json", plan if isinstance(plan, bytes) else json.dumps(plan).encode())
    for name, data in (members or {}).items():
        w.add_bytes(name, data)
    w.close(None if key is None else str(key))
    return path


# --- refused by default -------------------------------------------------------------------------------

def test_an_unsigned_build_is_refused_by_default_before_anything_is_read(tmp_path, spies):
    model, _ = small()
    path = write_build(tmp_path / "u.cuvilpkg", model, choices=[_aoti_choice(model)],
                       members={"aoti/0.pt2": b"\x7fELF crafted shared object"})
    with pytest.raises(BuildError, match="without a trusted key") as err:
        load_build(path, model)
    assert "keygen" in str(err.value) and "allow_unsigned=True" in str(err.value)
    assert spies == []            # no manifest parsed, no member read, nothing loaded


def test_a_build_signed_by_another_key_is_refused_before_its_manifest_is_parsed(tmp_path, spies):
    model, _ = small()
    mine, theirs = generate_keypair(tmp_path / "mine"), generate_keypair(tmp_path / "theirs")
    path = write_build(tmp_path / "f.cuvilpkg", model, key=theirs[0], choices=[_aoti_choice(model)],
                       members={"aoti/0.pt2": b"\x7fELF crafted"})
    with pytest.raises(BuildError, match="signed by key"):
        load_build(path, model, pubkey=mine[1])
    with pytest.raises(BuildError, match="signed by key"):
        load_build(path, model, pubkey=mine[1], allow_unsigned=True)     # an opt-in never weakens a key
    assert spies == []


def test_a_rewritten_manifest_is_refused(tmp_path, keys, spies):
    model, _ = small()
    path = write_build(tmp_path / "r.cuvilpkg", model, key=keys[0])
    entries = []
    for info, data in read_entries(path):
        if info.filename == "manifest.json":    # the attacker points the digests at their own plan
            doc = json.loads(data)
            doc["name"] = "evil"
            data = json.dumps(doc, indent=2).encode()
        entries.append((info, data))
    write_entries(path, entries)
    with pytest.raises(BuildError, match="signature is invalid"):
        load_build(path, model, pubkey=keys[1])
    assert spies == []


def test_an_unsigned_build_with_a_key_configured_is_refused_even_with_the_opt_in(tmp_path, keys, monkeypatch):
    model, _ = small()
    path = write_build(tmp_path / "u.cuvilpkg", model)
    monkeypatch.setenv("CUVIL_TRUSTED_KEY", str(keys[1]))
    with pytest.raises(BuildError, match="not signed"):
        load_build(path, model, allow_unsigned=True)


# --- trusted keys and the opt-in ----------------------------------------------------------------------

def test_trusted_key_from_argument_environment_and_store(tmp_path, keys, monkeypatch):
    from cuvil_pgc.recompile.store import BuildStore

    model, inputs = small()
    path = write_build(tmp_path / "s.cuvilpkg", model, key=keys[0])
    assert load_build(path, model, pubkey=keys[1]).cuvil_load_report.notes == []
    monkeypatch.setenv("CUVIL_TRUSTED_KEY", str(keys[1]))
    assert load_build(path, model).cuvil_load_report.path == str(path)
    monkeypatch.delenv("CUVIL_TRUSTED_KEY")
    store = BuildStore(tmp_path / "store")
    store.trust(keys[1])
    store.push(path)
    assert load_build("store://m@1", model, store=store.root).cuvil_load_report.path


def test_the_opt_in_to_unsigned_builds_works_and_is_logged(tmp_path, monkeypatch, caplog):
    model, inputs = small()
    path = write_build(tmp_path / "u.cuvilpkg", model)
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.trust"):
        fast = load_build(path, model, allow_unsigned=True)
    assert fast is model and any("nobody vouches for" in r.getMessage() and "unsigned" in r.getMessage()
                                 for r in caplog.records)
    caplog.clear()
    monkeypatch.setenv("CUVIL_ALLOW_UNSIGNED", "1")
    with caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.trust"):
        load_build(path, model)
    assert any(str(path) in r.getMessage() for r in caplog.records)
    monkeypatch.setenv("CUVIL_ALLOW_UNSIGNED", "maybe")
    with pytest.raises(ConfigError, match="CUVIL_ALLOW_UNSIGNED"):
        load_build(path, model)


# --- fallback="eager" catches every failure of loading ----------------------------------------------

def test_fallback_eager_turns_a_failing_native_load_into_the_plain_model(tmp_path, keys, monkeypatch):
    import cuvil_pgc.recompile.apply as apply_mod

    def dlopen(*a, **k):
        raise RuntimeError("Error in dlopen: aoti/0.so: invalid ELF header")

    monkeypatch.setattr(apply_mod, "realize", dlopen)
    model, _ = small()
    path = write_build(tmp_path / "n.cuvilpkg", model, key=keys[0], choices=[_aoti_choice(model)],
                       members={"aoti/0.pt2": b"not a package"})
    with pytest.warns(RuntimeWarning, match="eager mode: .*dlopen"):
        same = load_build(path, model, pubkey=keys[1], fallback="eager")
    assert same is model and "dlopen" in same.cuvil_load_report.notes[0]
    with pytest.raises(BuildError, match="RuntimeError: Error in dlopen"):
        load_build(path, model, pubkey=keys[1])


def test_deeply_nested_plan_and_manifest_are_refused_not_recursed(tmp_path, keys):
    model, _ = small()
    deep = b'{"format": 1, "choices": [], "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path = write_build(tmp_path / "d.cuvilpkg", model, key=keys[0], plan=deep)
    with pytest.raises(BuildError, match="nests 100001 levels"):
        load_build(path, model, pubkey=keys[1])
    with pytest.warns(RuntimeWarning, match="eager mode"):
        assert load_build(path, model, pubkey=keys[1], fallback="eager") is model
    # an unsigned, deeply nested manifest: refused as a BuildError, not a RecursionError
    good = write_build(tmp_path / "g.cuvilpkg", model)
    manifest = b'{"format_version": 2, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    entries = [(i, manifest if i.filename == "manifest.json" else d) for i, d in read_entries(good)]
    bad = write_entries(tmp_path / "m.cuvilpkg", entries)
    with pytest.raises(BuildError, match="nests"):
        load_build(bad, model, allow_unsigned=True)
    with pytest.warns(RuntimeWarning, match="eager mode"):
        assert load_build(bad, model, allow_unsigned=True, fallback="eager") is model


# --- verify ------------------------------------------------------------------------------------------

def _cli(capsys, *args):
    with pytest.raises(SystemExit) as done:
        main(list(args))
    out, err = capsys.readouterr()
    return done.value.code, out, err


def test_verify_without_a_key_fails_on_an_unsigned_build_unless_allowed(tmp_path, keys, capsys):
    model, _ = small()
    unsigned = write_build(tmp_path / "u.cuvilpkg", model)
    signed = write_build(tmp_path / "s.cuvilpkg", model, key=keys[0])
    code, _, err = _cli(capsys, "verify", str(unsigned))
    assert code == 1 and "without a trusted key" in err and len(err.strip().splitlines()) == 1
    code, out, err = _cli(capsys, "verify", str(unsigned), "--allow-unsigned", "--json")
    assert code == 0 and json.loads(out)["signature"] == {"present": False, "verified": False, "key_id": None}
    code, _, _ = _cli(capsys, "verify", str(signed))
    assert code == 1                                       # signed, but nobody said by whom to trust
    code, out, _ = _cli(capsys, "verify", str(signed), "--pubkey", str(keys[1]), "--json")
    assert code == 0 and json.loads(out)["signature"]["verified"] is True


# --- a build for another model -----------------------------------------------------------------------

def test_load_build_and_compare_refuse_a_build_made_for_another_model(tmp_path, keys, capsys, monkeypatch):
    model, _ = small()
    choice = {"scope": "fc1", "candidate": {"scope": "fc1", "backend": "eager", "rewrite": True},
              "config": "eager+rewrite", "structure": structural_hash(model.fc1), "weights": None,
              "input_signature": "x", "input_spec": None, "artifact": None}
    path = write_build(tmp_path / "small.cuvilpkg", model, key=keys[0], choices=[choice])
    other = Other().eval()
    with pytest.raises(BuildError, match="made for another model: it was recompiled from a Small, this model "
                                         "is a Other"):
        load_build(path, other, pubkey=keys[1])
    changed = Small().eval()                     # the same model, a submodule changed: still this model's build
    changed.fc1 = nn.Linear(8, 16, bias=False)
    with pytest.warns(RuntimeWarning, match="changed since the build"):
        assert load_build(path, changed, pubkey=keys[1]).cuvil_load_report.skipped
    factory = tmp_path / "other_model.py"
    factory.write_text("import torch\nfrom tests.test_build_trust import Other\n"
                       "def build():\n    return Other().eval(), (torch.randn(2, 8),)\n")
    code, out, err = _cli(capsys, "compare", "--model", f"{factory}:build", "eager", str(path),
                          "--pubkey", str(keys[1]), "--rounds", "5", "--json")
    assert code == 1 and out == "" and "made for another model" in err


class Wider(nn.Module):
    """Another architecture that happens to share Small's class name (Model, Net ... are common)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


Wider.__qualname__ = "Small"


def test_another_architecture_with_the_same_class_name_is_refused(tmp_path, keys, capsys):
    model, _ = small()
    whole = {"scope": "", "candidate": {"scope": "", "backend": "eager", "rewrite": True}, "config": "eager+rewrite",
             "structure": structural_hash(model), "weights": None, "input_signature": "x", "input_spec": None,
             "artifact": None}
    path = write_build(tmp_path / "whole.cuvilpkg", model, key=keys[0], choices=[whole])
    with pytest.raises(BuildError, match="made for another model: its submodules .* are not those of the Small"):
        load_build(path, Wider().eval(), pubkey=keys[1])
    # an edited forward keeps the tree: an earlier version's build, whose changed region runs eagerly
    version2 = type("Small", (Small,), {"forward": lambda self, x: self.fc2(self.fc1(x))})().eval()
    with pytest.warns(RuntimeWarning, match="changed since the build"):
        report = load_build(path, version2, pubkey=keys[1]).cuvil_load_report
    assert report.skipped and not report.applied


def test_compare_refuses_a_build_none_of_whose_regions_applies(tmp_path, keys, capsys, monkeypatch):
    model, _ = small()
    whole = {"scope": "", "candidate": {"scope": "", "backend": "eager", "rewrite": True}, "config": "eager+rewrite",
             "structure": structural_hash(model), "weights": None, "input_signature": "x", "input_spec": None,
             "artifact": None}
    path = write_build(tmp_path / "whole.cuvilpkg", model, key=keys[0], choices=[whole])
    factory = tmp_path / "edited_model.py"
    factory.write_text("import torch\nfrom tests.test_build_trust import Small\n"
                       "class Edited(Small):\n    def forward(self, x):\n        return self.fc2(self.fc1(x))\n"
                       "Edited.__qualname__ = 'Small'\n"
                       "def build():\n    return Edited().eval(), (torch.randn(2, 8),)\n")
    code, out, err = _cli(capsys, "compare", "--model", f"{factory}:build", "eager", str(path),
                          "--pubkey", str(keys[1]), "--rounds", "5", "--json")
    assert code == 1 and out == ""
    assert "none of the build's 1 optimized region(s) applies" in err and "eager model against itself" in err


# --- threads -----------------------------------------------------------------------------------------

def test_a_build_records_its_thread_count_and_load_warns_at_another(tmp_path, keys):
    model, _ = small()
    here = torch.get_num_threads()
    path = write_build(tmp_path / "t.cuvilpkg", model, key=keys[0], threads=here + 1)
    with open_build(path, keys[1]) as vb:
        assert vb.manifest.threads == here + 1
    with pytest.warns(RuntimeWarning, match=rf"measured at {here + 1} torch thread\(s\), this process runs {here}"):
        report = load_build(path, model, pubkey=keys[1]).cuvil_load_report
    assert report.threads == here + 1 and "set_num_threads" in report.notes[0]
    same = write_build(tmp_path / "s.cuvilpkg", model, key=keys[0], threads=here)
    assert load_build(same, model, pubkey=keys[1]).cuvil_load_report.notes == []


def test_recompile_measures_at_the_threads_asked_for_and_restores_them(tmp_path, monkeypatch):
    import cuvil_pgc.recompile.build as build_mod

    seen = []

    def fake_search(model, inputs, analysis, **kw):
        seen.append(torch.get_num_threads())
        raise RuntimeError("stop here")

    monkeypatch.setattr("cuvil_pgc.recompile.search.search", fake_search)
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    with pytest.raises(RuntimeError, match="stop here"):
        build_mod.recompile(*small(), records=False, threads=target)
    assert seen == [target] and torch.get_num_threads() == before


def test_written_manifest_has_the_new_format_and_fields(tmp_path, keys):
    model, _ = small()
    path = write_build(tmp_path / "v.cuvilpkg", model, key=keys[0], threads=3)
    with zipfile.ZipFile(path) as zf:
        doc = json.loads(zf.read("manifest.json"))
    assert doc["format_version"] == 2 and doc["threads"] == 3 and doc["model_class"] == "Small"


# --- recompile signs when a key is configured --------------------------------------------------------

def test_recompile_signs_with_the_configured_key_and_says_how_to_make_one(tmp_path, keys, capsys, monkeypatch):
    import cuvil_pgc.recompile.build as build_mod
    from cuvil_pgc.recompile.plan_doc import Plan

    seen = []

    def fake_recompile(model, inputs, traces, **kw):     # the search is not what this test is about
        seen.append(kw["threads"])
        plan = {"format": 1, "device": "cpu", "choices": [], "regions": [], "measured_candidates": 1,
                "reused_records": 0, "space_size": 1, "speedup_vs_eager": 1.0, "baseline_ms": 1.0,
                "plan_ms": 1.0, "stale": [], "final_medians_ms": {"eager": 1.0}}
        return build_mod.Build(module=model, plan=Plan.from_json(plan), artifacts={}, cache_artifacts=None,
                               fingerprint=current_fingerprint("cpu"), model_hash=structural_hash(model),
                               trace_hashes=[], threads=kw["threads"], model_class=type(model).__qualname__)

    monkeypatch.setattr(build_mod, "recompile", fake_recompile)
    trace = tmp_path / "t.trace.json"
    trace.write_text("{}")
    factory = tmp_path / "small_model.py"
    factory.write_text("from tests.test_build_trust import small as build\n")
    monkeypatch.setenv("CUVIL_SIGNING_KEY", str(keys[0]))
    signed = tmp_path / "s.cuvilpkg"
    code, out, err = _cli(capsys, "recompile", str(trace), "--model", f"{factory}:build", "-o", str(signed),
                          "--threads", "1", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["threads"] == 1 and seen == [1]
    # the final race's medians: a region's measured_ms comes from there, its alternatives' from the search
    assert doc["final_medians_ms"] == {"eager": 1.0} and doc["deployed_medians_ms"] == {}
    with open_build(signed, keys[1], require_signature=True) as vb:
        assert vb.signature_verified and vb.manifest.threads == 1
    monkeypatch.delenv("CUVIL_SIGNING_KEY")
    code, out, err = _cli(capsys, "recompile", str(trace), "--model", f"{factory}:build", "-o",
                          str(tmp_path / "u.cuvilpkg"))
    assert code == 0 and "unsigned" in err and "cuvil-pgc keygen" in err and "--sign" in err
    assert "torch thread(s)" in out


def test_profile_model_runs_at_the_threads_asked_for(tmp_path, capsys, monkeypatch):
    import cuvil_pgc.instrument.runner as runner

    seen = []
    monkeypatch.setattr(runner, "run_model", lambda *a, **k: seen.append(torch.get_num_threads()) or 0)
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    code, _, err = _cli(capsys, "profile", "--model", "cuvil_pgc.zoo:mlp", "-o", str(tmp_path / "m.trace.json"),
                        "--threads", str(target))
    assert code == 0 and seen == [target] and f"profiling at {target} torch thread(s)" in err
    assert torch.get_num_threads() == before
    code, _, err = _cli(capsys, "profile", "--threads", "1", str(tmp_path / "script.py"))
    assert code == 1 and "--threads applies to --model only" in err
