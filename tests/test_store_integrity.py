"""The build store's log is the source of truth: a chained history that state.json must agree with
(issue 23, item 8), its repair command, and stores written before the chain."""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import pytest

from cuvil_pgc.errors import StoreError
from cuvil_pgc.recompile import _store_log as slog
from cuvil_pgc.recompile import signing
from cuvil_pgc.recompile.store import BuildStore
from tests._buildkit import keypair, make_build


@pytest.fixture
def store(tmp_path):
    private, public = keypair(tmp_path / "keys")
    key = signing.load_private_key(private)
    s = BuildStore(tmp_path / "store")
    s.trust(public)
    for v in range(1, 5):
        s.push(make_build(tmp_path / f"mlp-{v}.cuvilpkg", key, version=v))
    s.promote("mlp", 1)
    s.promote("mlp", 3)
    return s


def _files(store: BuildStore) -> tuple[Path, Path]:
    return store.root / "mlp" / "state.json", store.root / "mlp" / "log.jsonl"


def cli(capsys, *args: str) -> tuple[int, str, str]:
    from cuvil_pgc.cli import main

    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return info.value.code, out, err


def test_every_entry_chains_to_the_one_before_and_replays_to_the_state(store):
    state_path, log_path = _files(store)
    lines = log_path.read_bytes().splitlines()
    docs = [json.loads(line) for line in lines]
    assert "prev" not in docs[0]
    assert [d["prev"] for d in docs[1:]] == [slog.digest(line) for line in lines[:-1]]
    chain = slog.read_chain(log_path)
    assert slog.replay(chain, "mlp") == store.state("mlp")


def test_state_json_replaced_by_a_directory_is_a_clear_error_and_repairable(store, capsys):
    state_path, _ = _files(store)
    state_path.unlink()
    state_path.mkdir()
    for call in (lambda: store.entries("mlp"), lambda: store.promote("mlp", 4), lambda: store.resolve("mlp")):
        with pytest.raises(StoreError, match=r"state\.json: store state cannot be read.*builds repair mlp"):
            call()
    code, out, err = cli(capsys, "builds", "repair", "mlp", "--store", str(store.root))
    assert code == 0 and "rewrote state.json from the log" in out, err
    assert store.state("mlp").pointers["current"].version == 3
    assert any(p.name.startswith("state.json.damaged-") and p.is_dir() for p in state_path.parent.iterdir())
    assert store.promote("mlp", 4).version == 4


def test_a_malformed_log_line_stops_reads_and_writes(store, capsys):
    state_path, log_path = _files(store)
    lines = log_path.read_bytes().splitlines()
    lines[2] = b'{"op": "promote", oops'
    log_path.write_bytes(b"\n".join(lines) + b"\n")
    before = log_path.read_bytes()
    code, out, err = cli(capsys, "builds", "log", "mlp", "--store", str(store.root))
    assert code == 1 and out == "" and err.count("\n") == 1
    assert "log.jsonl: store log line 3 is malformed" in err and "builds repair mlp" in err and "--from-state" in err
    for call in (lambda: store.promote("mlp", 4), lambda: store.rollback("mlp"), lambda: store.tag("mlp", 4, "stable")):
        with pytest.raises(StoreError, match="line 3 is malformed"):
            call()
    assert log_path.read_bytes() == before                  # nothing appended after the damage
    code, out, _ = cli(capsys, "builds", "repair", "mlp", "--from-state", "--store", str(store.root))
    assert code == 0 and "started a new log from state.json" in out
    kept = [p for p in log_path.parent.iterdir() if p.name.startswith("log.jsonl.damaged-")]
    assert len(kept) == 1 and kept[0].read_bytes() == before
    assert store.promote("mlp", 4).version == 4
    assert [e.op for e in store.log("mlp")] == ["checkpoint", "promote"]


def test_a_missing_log_is_refused_not_recreated(store):
    _, log_path = _files(store)
    log_path.unlink()
    with pytest.raises(StoreError, match="log.jsonl: store log is missing.*--from-state"):
        store.promote("mlp", 4)
    with pytest.raises(StoreError, match="store log is missing"):
        store.log("mlp")
    assert not log_path.exists()


def test_a_high_water_mark_lowered_by_hand_is_caught(store, capsys):
    state_path, _ = _files(store)
    doc = json.loads(state_path.read_text())
    doc["pointers"]["current"].update(version=1, high_water=1, history=[])
    state_path.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match=r"state.json disagrees with the log: pointer current: v1 \(high-water v1"
                                         r".*v3 \(high-water v3.*builds repair mlp"):
        store.promote("mlp", 2)
    assert store.state("mlp").pointers["current"].version == 1       # nothing was changed
    code, out, _ = cli(capsys, "builds", "repair", "mlp", "--store", str(store.root))
    assert code == 0 and "state.json said: pointer current: v1" in out
    with pytest.raises(StoreError, match="anti-rollback.*high-water mark v3"):
        store.promote("mlp", 2)


@pytest.mark.parametrize("damage, problem", [
    ("edit", "line 4 does not follow line 3"),
    ("delete", "line 2 does not follow line 1"),
    ("delete-first", "first line of the store log names a line before it"),
    ("unchain", "line 3 has no digest of the line before it"),
])
def test_an_altered_history_breaks_the_chain(store, damage, problem):
    _, log_path = _files(store)
    lines = log_path.read_bytes().splitlines()
    if damage == "edit":
        doc = json.loads(lines[2])
        doc["manifest_sha256"] = "0" * 64
        lines[2] = json.dumps(doc).encode()
    elif damage == "delete":
        del lines[1]
    elif damage == "delete-first":
        del lines[0]
    else:
        doc = json.loads(lines[2])
        for key in ("prev", "record", "after"):
            doc.pop(key, None)
        lines[2] = json.dumps(doc).encode()
    log_path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(StoreError, match=problem):
        store.log("mlp")
    with pytest.raises(StoreError, match=problem):
        store.promote("mlp", 4)


def _as_legacy(log_path: Path) -> None:
    """Rewrite a log as the store wrote it before the chain (no prev, record or after)."""
    out = []
    for line in log_path.read_bytes().splitlines():
        doc = json.loads(line)
        for key in ("prev", "record", "after", "state"):
            doc.pop(key, None)
        out.append(json.dumps(doc).encode())
    log_path.write_bytes(b"\n".join(out) + b"\n")


def test_a_store_written_before_the_chain_stays_readable_and_migrates_on_its_next_write(store):
    _, log_path = _files(store)
    _as_legacy(log_path)
    assert [e.op for e in store.log("mlp")] == ["push"] * 4 + ["promote"] * 2
    assert [e.version for e in store.entries("mlp")] == [4, 3, 2, 1]
    assert store.promote("mlp", 4).version == 4
    ops = [e.op for e in store.log("mlp")]
    assert ops[-2:] == ["checkpoint", "promote"]
    chain = slog.read_chain(log_path)
    assert not chain.legacy and slog.replay(chain, "mlp") == store.state("mlp")


def test_a_legacy_store_whose_state_was_lowered_is_refused(store):
    state_path, log_path = _files(store)
    _as_legacy(log_path)
    doc = json.loads(state_path.read_text())
    doc["pointers"]["current"].update(version=1, high_water=1, history=[])
    state_path.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match="disagrees with the log: pointer current.*--from-state"):
        store.promote("mlp", 2)


def test_state_written_by_the_store_always_matches_the_log(store):
    store.tag("mlp", 2, "canary")
    store.rollback("mlp", reason="p99")
    store.tag("mlp", 4, "canary")
    store.rollback("mlp", tag="canary")
    state_path, log_path = _files(store)
    replayed = slog.replay(slog.read_chain(log_path), "mlp")
    assert replayed == msgspec.json.decode(state_path.read_bytes(), type=type(replayed))
    assert os.path.getsize(log_path) > 0
