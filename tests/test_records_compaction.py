"""The record database's file is rewritten with its latest record per key once most of its lines
are superseded (the crash journal writes 3-4 per candidate), without losing a record another
process appends meanwhile."""

from __future__ import annotations

import fcntl
import json
import os
import stat
from dataclasses import asdict

import pytest

from cuvil_pgc.recompile import records
from cuvil_pgc.recompile.records import STARTED, UNFINISHED, Record, RecordDB


def _rec(candidate: str, status: str = "ok", median: float | None = 1.0) -> Record:
    return Record("s", candidate, "m", "2x16", status, median_us=median)


def _lines(db: RecordDB) -> list[str]:
    return db.path.read_text().splitlines()


@pytest.fixture
def journaled(tmp_path, monkeypatch):
    """A file of 3 candidates, each journaled (started, unfinished, started) before its record,
    and one left started: 13 lines, 4 live."""
    monkeypatch.setattr(records, "COMPACT_AFTER", 4)
    db = RecordDB(tmp_path)
    for name in ("a", "b", "c"):
        for status in (STARTED, UNFINISHED, STARTED):
            db.add(_rec(name, status, None))
        db.add(_rec(name, median=float(ord(name))))
    db.add(_rec("d", STARTED, None))
    return tmp_path


def test_a_file_mostly_superseded_is_rewritten_when_read(journaled):
    before = os.stat(journaled / records.RECORDS_FILE)
    db = RecordDB(journaled)
    assert {(r.candidate, r.status, r.median_us) for r in db} == {
        ("a", "ok", 97.0), ("b", "ok", 98.0), ("c", "ok", 99.0), ("d", STARTED, None)}
    assert len(_lines(db)) == 4
    assert stat.S_IMODE(os.stat(db.path).st_mode) == stat.S_IMODE(before.st_mode)
    again = RecordDB(journaled)     # what the next process reads is the same
    assert {r.key: r for r in again} == {r.key: r for r in db}


def test_a_file_with_few_superseded_lines_is_left_as_it_is(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "COMPACT_AFTER", 4)
    db = RecordDB(tmp_path)
    for name in "abcdef":
        db.add(_rec(name, STARTED, None))
        db.add(_rec(name))
    assert len(RecordDB(tmp_path)) == 6 and len(_lines(db)) == 12     # 6 superseded of 12: not more than live


def test_a_record_appended_while_the_file_is_compacted_is_kept(journaled, monkeypatch):
    """Another process compacts the file between this one's open and its lock: the record goes
    into the new file, not the replaced one."""
    real, armed = fcntl.flock, [True]

    def flock(fh, op):
        if armed[0] and op == fcntl.LOCK_EX:
            armed[0] = False
            RecordDB(journaled).lookup("s", "a", "m", "2x16")      # another reader: it compacts now
        return real(fh, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    RecordDB(journaled).add(_rec("e"))
    assert not armed[0]
    fresh = RecordDB(journaled)
    assert fresh.lookup("s", "e", "m", "2x16") is not None and len(fresh) == 5 and len(_lines(fresh)) == 5


def test_a_record_appended_between_the_read_and_the_compaction_is_kept(journaled, monkeypatch):
    """Another process appends after this one read the file and before its compaction's lock."""
    real, armed = fcntl.flock, [True]

    def flock(fh, op):
        if armed[0] and op == fcntl.LOCK_EX:
            armed[0] = False
            with open(journaled / records.RECORDS_FILE, "a") as other:      # as another process's add
                other.write(json.dumps(asdict(_rec("e")), sort_keys=True) + "\n")
        return real(fh, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    assert len(RecordDB(journaled)) == 5 and not armed[0]
    assert len(_lines(RecordDB(journaled))) == 5


def test_a_directory_it_cannot_write_keeps_its_file(journaled, monkeypatch):
    def refuse(path, data, mode=0o666):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(records, "write_atomic", refuse)
    db = RecordDB(journaled)
    assert len(db) == 4 and len(_lines(db)) == 13


WRITER = """
import sys
from cuvil_pgc.recompile import records
from cuvil_pgc.recompile.records import STARTED, Record, RecordDB

records.COMPACT_AFTER = 20
directory, name = sys.argv[1], sys.argv[2]
db = RecordDB(directory)
for i in range(400):
    key = f"{name}{i}"
    db.add(Record("s", key, "m", "2x16", STARTED))
    db.add(Record("s", key, "m", "2x16", "ok", median_us=float(i)))
    if i % 10 == 0:
        RecordDB(directory).lookup("s", key, "m", "2x16")     # a fresh reader compacts
"""


def test_processes_appending_and_compacting_at_once_lose_no_record(tmp_path):
    import subprocess
    import sys

    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "db"), name]) for name in "xyz"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    db = RecordDB(tmp_path / "db")
    assert len(db) == 1200 and {r.status for r in db} == {"ok"}
