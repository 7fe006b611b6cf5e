"""The cache is visible and bounded: `cuvil-pgc cache`, `cache clear`, LRU eviction."""

from __future__ import annotations

import json
import os
import time

import pytest
from typer.testing import CliRunner

from cuvil_pgc import _cache
from cuvil_pgc.cli import app
from cuvil_pgc.errors import ConfigError

DAY = 86400


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv(_cache.CACHE_DIR_ENV, str(root))
    now = time.time()

    def put(rel: str, size: int, age_days: float) -> None:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
        t = now - age_days * DAY
        os.utime(path, (t, t))

    put("machine-abc.json", 100, 40)
    put("records/records.jsonl", 1000, 40)
    put("artifacts/old.pt2", 5000, 30)
    put("artifacts/mid.pt2", 5000, 10)
    put("artifacts/new.pt2", 5000, 1)
    put("loaded/b1/x/model.so", 2000, 20)
    return root


def test_usage_by_kind(cache):
    by_kind = {u.kind: (u.entries, u.bytes) for u in _cache.usage()}
    assert by_kind == {"machine": (1, 100), "records": (1, 1000), "artifacts": (3, 15000), "loaded": (1, 2000),
                       "other": (0, 0)}


def test_limit_evicts_least_recently_used_and_never_records(cache):
    assert _cache.enforce_limit(10_500) == (2, 7000)        # old.pt2 (30 d), then loaded/b1 (20 d)
    left = sorted(p.name for p in (cache / "artifacts").iterdir())
    assert left == ["mid.pt2", "new.pt2"] and not (cache / "loaded" / "b1").exists()
    assert (cache / "records" / "records.jsonl").exists() and (cache / "machine-abc.json").exists()
    _cache.touch(cache / "artifacts" / "mid.pt2")           # used now: new.pt2 is older
    assert _cache.enforce_limit(5000) == (1, 5000)
    assert [p.name for p in (cache / "artifacts").iterdir()] == ["mid.pt2"]


def test_cache_max_from_the_environment(monkeypatch):
    monkeypatch.setenv(_cache.CACHE_MAX_ENV, "500M")
    assert _cache.max_bytes() == 500 * 1024**2
    monkeypatch.delenv(_cache.CACHE_MAX_ENV)
    assert _cache.max_bytes() == _cache.DEFAULT_MAX
    monkeypatch.setenv(_cache.CACHE_MAX_ENV, "lots")
    with pytest.raises(ConfigError, match="CUVIL_CACHE_MAX='lots' is not a size"):
        _cache.max_bytes()


def test_cache_command_shows_kinds_and_clear_trims_by_age(cache):
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, ["cache", "--json"]).stdout)
    assert doc["directory"] == str(cache)
    assert {r["kind"]: r["bytes"] for r in doc["rows"]}["artifacts"] == 15000
    shown = runner.invoke(app, ["cache"], env={"COLUMNS": "80"})
    assert shown.exit_code == 0 and "artifacts" in shown.stdout and "14.6 KiB" in shown.stdout
    result = runner.invoke(app, ["cache", "clear", "--older-than", "15d"])
    assert result.exit_code == 0, result.output
    assert "removed 4 entries" in result.stdout                # machine, records, old.pt2, loaded/b1
    assert sorted(p.name for p in (cache / "artifacts").iterdir()) == ["mid.pt2", "new.pt2"]
    assert runner.invoke(app, ["cache", "clear", "--kind", "artifacts"]).exit_code == 0
    assert not list((cache / "artifacts").iterdir())
    bad = runner.invoke(app, ["cache", "clear", "--older-than", "soon"])
    assert bad.exit_code != 0


def test_one_cache_directory_for_every_kind(tmp_path, monkeypatch):
    from cuvil_pgc.analyze import machine
    from cuvil_pgc.recompile import records

    monkeypatch.delenv(_cache.CACHE_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert machine.cache_dir() == records.cache_dir() == _cache.cache_dir() == tmp_path / "cuvil-pgc"
