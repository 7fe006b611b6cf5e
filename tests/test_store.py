"""The build store: push, anti-rollback, rollback and its log, refs, concurrency, and the CLI."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st_h

from cuvil_pgc.errors import BuildError, StoreError
from cuvil_pgc.recompile import _store_state as st
from cuvil_pgc.recompile import signing
from cuvil_pgc.recompile.package import open_build
from cuvil_pgc.recompile.store import ENV_STORE, BuildStore, open_any_build, parse_ref
from tests._buildkit import default_members, files_under, keypair, make_build


@pytest.fixture
def keys(tmp_path):
    private, public = keypair(tmp_path / "keys")
    return signing.load_private_key(private), public


@pytest.fixture
def builds(tmp_path, keys):
    directory = tmp_path / "builds"
    directory.mkdir()
    return {v: make_build(directory / f"mlp-{v}.cuvilpkg", keys[0], version=v) for v in range(1, 6)}


@pytest.fixture
def store(tmp_path, keys, builds):
    s = BuildStore(tmp_path / "store")
    s.trust(keys[1])
    for path in builds.values():
        s.push(path)
    return s


def snapshot(store: BuildStore) -> dict[str, bytes]:
    return {p: (store.root / p).read_bytes() for p in files_under(store.root) if (store.root / p).is_file()}


def ops(store: BuildStore, name: str = "mlp") -> list[tuple]:
    return [(e.op, e.pointer, e.previous, e.version) for e in store.log(name)]


# --- push ---------------------------------------------------------------------------------------------------

def test_push_lists_and_resolves(store, builds):
    entries = store.entries("mlp")
    assert [e.version for e in entries] == [5, 4, 3, 2, 1]
    assert all(e.signed and e.pointers == [] for e in entries)
    assert ops(store) == [("push", None, None, v) for v in range(1, 6)]
    _, version, path = store.resolve("store://mlp@3")
    assert version == 3 and path.read_bytes() == builds[3].read_bytes()
    assert files_under(store.root / ".incoming") == []


def test_next_version(store, tmp_path):
    assert store.next_version("mlp") == 6
    assert store.next_version("bert") == 1


def test_identical_repush_is_idempotent(store, builds):
    before = snapshot(store)
    result = store.push(builds[2])
    assert not result.added and result.version == 2
    assert snapshot(store) == before


def test_different_content_for_existing_version_is_refused(store, keys, tmp_path):
    before = snapshot(store)
    other = make_build(tmp_path / "other.cuvilpkg", keys[0], version=2,
                       members={**default_members(2), "plan.json": b'{"changed": true}'})
    with pytest.raises(StoreError, match="mlp v2 is already in the store with different content"):
        store.push(other)
    assert snapshot(store) == before


def test_push_requires_the_trusted_signature(store, tmp_path):
    before = snapshot(store)
    unsigned = make_build(tmp_path / "u.cuvilpkg", version=9)
    with pytest.raises(BuildError, match="not signed"):
        store.push(unsigned)
    intruder, intruder_pub = keypair(tmp_path / "intruder")
    foreign = make_build(tmp_path / "f.cuvilpkg", signing.load_private_key(intruder), version=9)
    with pytest.raises(BuildError, match="signed by key"):
        store.push(foreign)
    with pytest.raises(StoreError, match="the store trusts key"):
        store.push(foreign, intruder_pub)
    assert snapshot(store) == before


def test_store_without_trusted_key_accepts_unsigned_and_checks_given_key(tmp_path, keys):
    s = BuildStore(tmp_path / "open-store")
    assert s.push(make_build(tmp_path / "u.cuvilpkg", version=1)).signed is False
    with pytest.raises(BuildError, match="not signed"):
        s.push(make_build(tmp_path / "u2.cuvilpkg", version=2), keys[1])
    assert [e.version for e in s.entries()] == [1]


def test_trust_change_needs_replace(store, tmp_path):
    _, other_pub = keypair(tmp_path / "other")
    with pytest.raises(StoreError, match="already trusts key"):
        store.trust(other_pub)
    store.trust(other_pub, replace=True)
    with pytest.raises(BuildError, match="signed by key"):   # stored builds no longer verify
        store.open("store://mlp@1")


# --- anti-rollback, rollback, tags -----------------------------------------------------------------------------

def test_promote_refuses_versions_below_the_high_water_mark(store):
    store.promote("mlp", 1)
    store.promote("mlp", 3)
    before = snapshot(store)
    with pytest.raises(StoreError, match="anti-rollback.*v2.*high-water mark v3.*rollback mlp --to 2"):
        store.promote("mlp", 2)
    assert not store.promote("mlp", 3).changed      # no-op, not logged
    assert snapshot(store) == before
    assert store.promote("mlp", 5).previous == 3
    assert store.resolve("store://mlp")[1] == 5
    assert ops(store)[5:] == [("promote", "current", None, 1), ("promote", "current", 1, 3),
                              ("promote", "current", 3, 5)]


def test_rollback_moves_back_explicitly_and_is_logged(store):
    for v in (1, 3, 4):
        store.promote("mlp", v)
    move = store.rollback("mlp", reason="p99 regression")
    assert (move.previous, move.version) == (4, 3)
    assert store.rollback("mlp").version == 1
    with pytest.raises(StoreError, match="no earlier version"):
        store.rollback("mlp")
    state = store.state("mlp").pointers["current"]
    assert (state.version, state.high_water) == (1, 4)
    with pytest.raises(StoreError, match="anti-rollback"):
        store.promote("mlp", 3)                      # still below the high-water mark 4
    assert store.rollback("mlp", to=3).version == 3  # ... reachable on purpose only
    assert store.rollback("mlp").version == 1        # and a plain rollback returns to where it came from
    assert store.promote("mlp", 4).version == 4
    log = store.log("mlp")
    rollbacks = [(e.previous, e.version, e.reason) for e in log if e.op == "rollback"]
    assert rollbacks == [(4, 3, "p99 regression"), (3, 1, None), (1, 3, None), (3, 1, None)]
    assert all(e.user and e.host and e.time for e in log)


def test_rollback_refusals(store):
    with pytest.raises(StoreError, match="no current version"):
        store.rollback("mlp")
    store.promote("mlp", 2)
    store.promote("mlp", 3)
    with pytest.raises(StoreError, match="move forward"):
        store.rollback("mlp", to=4)
    with pytest.raises(StoreError, match="already v3"):
        store.rollback("mlp", to=3)
    with pytest.raises(StoreError, match="v9 is not in the store"):
        store.rollback("mlp", to=9)
    with pytest.raises(StoreError, match="no builds named 'bert'"):
        store.rollback("bert")


def test_tags_follow_the_same_anti_rollback_rule(store):
    store.tag("mlp", 2, "canary")
    store.tag("mlp", 4, "canary")
    store.tag("mlp", 3, "stable")
    with pytest.raises(StoreError, match="cannot tag canary mlp v3.*--tag canary"):
        store.tag("mlp", 3, "canary")
    assert store.rollback("mlp", tag="canary").version == 2
    assert store.resolve("store://mlp@canary")[1] == 2
    assert store.resolve("store://mlp@stable")[1] == 3
    assert [e.pointers for e in store.entries("mlp") if e.pointers] == [["stable"], ["canary"]]
    with pytest.raises(StoreError, match="moved by promote"):
        store.tag("mlp", 5, "current")
    with pytest.raises(StoreError, match="not usable"):
        store.tag("mlp", 5, "Bad Tag")


def test_refs(store):
    store.promote("mlp", 4)
    assert parse_ref("store://mlp") == ("mlp", "current")
    assert parse_ref("store://mlp@stable") == ("mlp", "stable")
    assert store.resolve("store://mlp")[1] == 4
    with pytest.raises(StoreError, match="no stable version"):
        store.resolve("store://mlp@stable")
    with pytest.raises(StoreError, match="v7 is not in the store"):
        store.resolve("store://mlp@7")
    for bad in ("store://", "store://../x", "store://mlp@a/b", "file://mlp"):
        with pytest.raises(StoreError, match="not a store reference"):
            parse_ref(bad)
    with open_any_build("store://mlp@2", store=store.root) as build:
        assert build.manifest.version == 2 and build.signature_verified


def test_swapped_file_in_store_is_refused(store, builds):
    """A validly signed v1 copied over v3's file (a freeze / mix-and-match attack on the store)."""
    shutil.copy(builds[1], store.root / "mlp" / "3.cuvilpkg")
    with pytest.raises(BuildError, match="describes mlp v1, but this file should hold mlp v3"):
        store.open("store://mlp@3")
    with pytest.raises(BuildError, match="describes mlp v1"):
        store.promote("mlp", 3)
    assert "current" not in store.state("mlp").pointers


def test_corrupt_state_is_reported(store):
    (store.root / "mlp" / "state.json").write_text('{"name": "mlp", "versions": 3}')
    with pytest.raises(StoreError, match="state is corrupt.*log.jsonl"):
        store.entries("mlp")


def test_lock_timeout(store, builds, tmp_path):
    store.lock_timeout_s = 0.2
    extra = make_build(tmp_path / "v6.cuvilpkg", signing.load_private_key(tmp_path / "keys" / "key"), version=6)
    with st.exclusive_lock(store.root / "mlp" / ".lock", 1.0):
        with pytest.raises(StoreError, match="stayed locked"):
            store.push(extra)
    assert 6 not in store.state("mlp").versions
    assert files_under(store.root / ".incoming") == []


# --- concurrency ---------------------------------------------------------------------------------------------

def _worker(store_root: str, paths: list[str], promote: list[int]) -> list[tuple[str, int, str]]:
    store = BuildStore(store_root, lock_timeout_s=120)
    outcomes = []
    for path in paths:
        try:
            result = store.push(path)
            outcomes.append(("push", result.version, "added" if result.added else "same"))
        except StoreError:
            outcomes.append(("push", -1, "refused"))
    for version in promote:
        try:
            outcomes.append(("promote", version, "moved" if store.promote("mlp", version).changed else "same"))
        except StoreError:
            outcomes.append(("promote", version, "refused"))
    return outcomes


@pytest.mark.slow   # four spawned interpreters: ~4 s here
def test_parallel_pushes_from_processes_leave_a_consistent_store(tmp_path, keys):
    workers = 4
    key = keys[0]
    root = tmp_path / "store"
    BuildStore(root).trust(keys[1])
    jobs = []
    for w in range(workers):
        own = [make_build(tmp_path / f"w{w}-v{v}.cuvilpkg", key, version=v) for v in range(w * 3 + 1, w * 3 + 4)]
        shared = make_build(tmp_path / f"w{w}-shared.cuvilpkg", key, version=100)          # identical in all
        clash = make_build(tmp_path / f"w{w}-clash.cuvilpkg", key, version=200,
                           members={"plan.json": b'{"worker": %d}' % w})                  # differs per worker
        jobs.append((str(root), [str(p) for p in (*own, shared, clash)], [w * 3 + 1, w * 3 + 3]))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        results = pool.starmap(_worker, jobs)
    outcomes = [o for r in results for o in r]

    store = BuildStore(root)
    state = store.state("mlp")
    assert sorted(state.versions) == [*range(1, 13), 100, 200]
    for version, record in state.versions.items():
        with open_build(root / "mlp" / f"{version}.cuvilpkg", keys[1], expect_version=version) as build:
            assert build.manifest_sha256 == record.manifest_sha256
    assert sorted(s for op, v, s in outcomes if op == "push" and v in (-1, 200)) == ["added"] + ["refused"] * 3
    assert [s for op, v, s in outcomes if op == "push" and v == 100].count("added") == 1
    log = store.log("mlp")
    assert len(log) == len((root / "mlp" / "log.jsonl").read_bytes().splitlines())
    assert sorted(e.version for e in log if e.op == "push") == [*range(1, 13), 100, 200]
    promoted = [e.version for e in log if e.op == "promote"]
    assert len(promoted) == sum(1 for op, _, s in outcomes if op == "promote" and s == "moved")
    assert promoted == sorted(promoted) and len(set(promoted)) == len(promoted)   # only ever forward
    current = state.pointers["current"]
    assert current.version == current.high_water == promoted[-1]
    assert files_under(root / ".incoming") == []


# --- CLI ---------------------------------------------------------------------------------------------------

def cli(capsys, *args: str) -> tuple[int, str, str]:
    from cuvil_pgc.cli import main

    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return info.value.code, out, err


def test_cli_round_trip(tmp_path, capsys, monkeypatch):
    key = tmp_path / "release.key"
    code, out, _ = cli(capsys, "keygen", "-o", str(key))
    assert code == 0 and "key id" in out and (tmp_path / "release.key.pub").exists()
    private = signing.load_private_key(key)
    paths = [make_build(tmp_path / f"b{v}.cuvilpkg", private, version=v) for v in (1, 2, 3)]

    code, out, _ = cli(capsys, "verify", str(paths[0]), "--pubkey", f"{key}.pub", "--json")
    summary = json.loads(out)
    assert code == 0 and summary["signature"]["verified"] and summary["version"] == 1
    assert set(summary["members"]) == set(default_members())

    monkeypatch.setenv(ENV_STORE, str(tmp_path / "store"))
    assert cli(capsys, "builds", "trust", f"{key}.pub")[0] == 0
    for path in paths:
        code, out, _ = cli(capsys, "builds", "push", str(path))
        assert code == 0 and out.startswith("pushed mlp")
    assert cli(capsys, "builds", "promote", "mlp", "1")[0] == 0
    assert cli(capsys, "builds", "promote", "mlp", "3")[0] == 0
    code, out, err = cli(capsys, "builds", "promote", "mlp", "2")
    assert code == 1 and out == "" and err.count("\n") == 1 and "anti-rollback" in err
    assert cli(capsys, "builds", "tag", "mlp", "2", "stable", "--store", str(tmp_path / "store"))[0] == 0
    code, out, _ = cli(capsys, "builds", "rollback", "mlp", "--reason", "bad p99", "--json")
    assert code == 0 and json.loads(out) == {"name": "mlp", "pointer": "current", "previous": 3, "version": 1,
                                             "changed": True}

    code, out, _ = cli(capsys, "builds", "list", "mlp", "--json")
    rows = {r["version"]: r["pointers"] for r in json.loads(out)["builds"]}
    assert rows == {3: [], 2: ["stable"], 1: ["current"]}
    code, out, _ = cli(capsys, "builds", "log", "mlp", "--json")
    assert [(e["op"], e.get("reason")) for e in json.loads(out)["log"]][-2:] == [("tag", None), ("rollback", "bad p99")]
    code, out, _ = cli(capsys, "verify", "store://mlp@stable", "--json")
    assert json.loads(out)["version"] == 2 and json.loads(out)["signature"]["verified"]
    code, out, _ = cli(capsys, "builds", "list")
    assert code == 0 and "stable" in out and "current" in out
    code, out, _ = cli(capsys, "builds", "log", "mlp")
    assert code == 0 and "rollback" in out and "bad p99" in out


def test_cli_verify_failure_is_one_line(tmp_path):
    bad = tmp_path / "bad.cuvilpkg"
    bad.write_bytes(b"PK\x03\x04 not really")
    proc = subprocess.run([sys.executable, "-m", "cuvil_pgc", "verify", str(bad), "--allow-unsigned"],
                          capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}, timeout=120)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and str(bad) in proc.stderr and "zip" in proc.stderr


def test_cli_without_store_says_how_to_set_one(capsys, monkeypatch):
    monkeypatch.delenv(ENV_STORE, raising=False)
    code, _, err = cli(capsys, "builds", "list")
    assert code == 1 and "--store DIR" in err and ENV_STORE in err


def test_state_file_is_valid_json_schema(store):
    store.promote("mlp", 2)
    raw = (store.root / "mlp" / "state.json").read_bytes()
    assert msgspec.json.decode(raw, type=st.NameState).pointers["current"].version == 2


_OPS = st_h.lists(st_h.tuples(st_h.sampled_from(["advance", "rollback", "rollback_to"]),
                              st_h.sampled_from(["current", "stable"]), st_h.integers(1, 8)), max_size=40)


@given(_OPS)
def test_pointer_rules_hold_for_any_sequence_of_moves(moves):
    """Pointers never go below their high-water mark except through rollback, and marks never drop."""
    state = st.NameState(name="mlp", versions={v: None for v in range(1, 9)})
    for op, pointer, version in moves:
        before = state.pointers.get(pointer)
        high_before = 0 if before is None else before.high_water
        try:
            if op == "advance":
                move = st.advance_pointer(state, pointer, version, store="s")
                assert version >= high_before or not move.changed
            else:
                move = st.rollback_pointer(state, pointer, version if op == "rollback_to" else None, store="s")
                assert move.version < high_before
        except StoreError:
            assert state.pointers.get(pointer) == before        # a refusal changes nothing
            continue
        after = state.pointers[pointer]
        assert after.version == move.version <= after.high_water
        assert after.high_water == max(high_before, after.version)
        assert after.history == sorted(set(after.history)) and all(h < after.version for h in after.history)
