"""The record database: every measurement the search makes, kept for later searches.

Records are JSON lines in ``$CUVIL_CACHE_DIR/records/records.jsonl`` (default
``~/.cache/cuvil-pgc/records``), appended under an ``fcntl`` lock so parallel searches do not
interleave lines. A record is keyed by the structural hash of the measured module, the candidate's
program key (its configuration plus the versions of the rewrite and layout programs cuvil-pgc
generates, and the version of a built region's call it was timed through,
:func:`~.apply.measurement_key`), the machine fingerprint and the input signature: the same
module, program, machine and shapes give the same key, so a second search reuses the measurement
instead of repeating it, and a changed program is measured afresh.
Records of other modules on the same machine feed the cost models' refit (TVM MetaSchedule style).
Unreadable lines are skipped (a crash mid-write leaves at most one partial line). A file whose
lines are mostly superseded is rewritten with the latest record per key when it is next read
(:data:`COMPACT_AFTER`).

A measurement is recorded as :data:`STARTED` before it begins and its own record replaces that one.
A native fault of a runtime ends the measuring process without an exception to catch (OpenVINO's
CPU plugin died with SIGFPE compiling a Gemma 2 at bf16; an AOTInductor package at sizes its export
did not hold): the started record it leaves behind (:func:`ended_its_process`) tells the next search
or calibration not to measure that again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import stat
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from cuvil_pgc._fsutil import write_atomic

log = logging.getLogger(__name__)

CACHE_ENV = "CUVIL_CACHE_DIR"
RECORDS_FILE = "records.jsonl"
#: a records file is rewritten with its latest record per key when it is read with more lines than
#: that superseded (the journal writes 3-4 per candidate) and more than it has live records
COMPACT_AFTER = 5000
#: the status of a measurement that has begun and whose own record has not replaced this one yet
STARTED = "started"
#: the status of a started measurement its process left for a reason of its own (an interrupt, a
#: search's error): a later process measures it again
UNFINISHED = "unfinished"


def cache_dir() -> Path:
    """The cache directory (:func:`cuvil_pgc._cache.cache_dir`)."""
    from cuvil_pgc._cache import cache_dir as root

    return root()


@dataclass
class Record:
    structure: str                 # structural hash of the measured module (scope); search records add "|settings digest"
    candidate: str                 # Candidate.key
    machine: str                   # machine fingerprint hash
    inputs: str                    # input signature (shapes, dtypes)
    status: str                    # "ok" | "compile_error" | "accuracy_error"
    median_us: float | None = None
    eager_us: float | None = None  # the scope's eager median measured in the same interleaved batch
    predicted_us: float | None = None
    reason: str = ""
    features: dict[str, Any] = field(default_factory=dict)
    created: float = field(default_factory=time.time)

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.structure, self.candidate, self.machine, self.inputs)


class RecordDB:
    """Append-only JSON-lines store of :class:`Record` with lookup by key."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else cache_dir() / "records"
        self.path = self.directory / RECORDS_FILE
        self._index: dict[tuple[str, str, str, str], Record] | None = None

    def __iter__(self) -> Iterator[Record]:
        return iter(self._load().values())

    def __len__(self) -> int:
        return len(self._load())

    def lookup(self, structure: str, candidate: str, machine: str, inputs: str) -> Record | None:
        return self._load().get((structure, candidate, machine, inputs))

    def for_machine(self, machine: str) -> list[Record]:
        return [r for r in self._load().values() if r.machine == machine]

    def add(self, record: Record) -> None:
        import fcntl

        self.directory.mkdir(parents=True, exist_ok=True)
        line = json.dumps(asdict(record), sort_keys=True) + "\n"
        while True:
            with open(self.path, "a", encoding="utf-8") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                try:
                    if _replaced(fh, self.path):     # compacted while this waited for the lock
                        continue
                    fh.write(line)
                    fh.flush()
                    break
                finally:
                    fcntl.flock(fh, fcntl.LOCK_UN)
        self._load()[record.key] = record

    def _load(self) -> dict[tuple[str, str, str, str], Record]:
        if self._index is None:
            self._index, lines = _read(self.path)
            if lines - len(self._index) > max(COMPACT_AFTER, len(self._index)):
                self._compact()
        return self._index

    def _compact(self) -> None:
        """Rewrite the file with its latest record per key, under the lock appenders take (one
        that waited for it appends to the new file, see :meth:`add`). A directory this process
        cannot write keeps its file as it is."""
        import fcntl

        try:
            with open(self.path, encoding="utf-8") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                try:
                    if _replaced(fh, self.path):
                        return
                    self._index, _ = _read(self.path)       # with what others appended meanwhile
                    text = "".join(json.dumps(asdict(r), sort_keys=True) + "\n" for r in self._index.values())
                    write_atomic(self.path, text.encode(), mode=stat.S_IMODE(os.fstat(fh.fileno()).st_mode))
                finally:
                    fcntl.flock(fh, fcntl.LOCK_UN)
        except OSError as exc:
            log.debug("cuvil-pgc: the records file %s is not compacted: %s", self.path, exc)


def _read(path: Path) -> tuple[dict[tuple[str, str, str, str], Record], int]:
    """The latest record per key in ``path``, and how many lines it has."""
    index: dict[tuple[str, str, str, str], Record] = {}
    lines = 0
    if path.exists():
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                lines += 1
                record = _parse(line)
                if record is not None:
                    index[record.key] = record   # the latest measurement wins
    return index, lines


def _replaced(fh: Any, path: Path) -> bool:
    """Whether ``path`` is no longer the file ``fh`` has open (a compaction replaced it)."""
    try:
        return os.fstat(fh.fileno()).st_ino != os.stat(path).st_ino
    except FileNotFoundError:
        return True


def this_process() -> dict[str, Any]:
    """The ``features`` of a :data:`STARTED` record that :func:`ended_its_process` reads."""
    return {"host": socket.gethostname(), "pid": os.getpid()}


def ended_its_process(rec: Record) -> bool:
    """Whether ``rec`` is a :data:`STARTED` record whose process has ended without the measurement's
    own record: the measurement ended it. One of a process still running (another search now, on
    this host: the records directory may be shared) is not."""
    if rec.status != STARTED:
        return False
    pid = rec.features.get("pid")
    if rec.features.get("host") != socket.gethostname() or not isinstance(pid, int):
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:      # another user's process (PermissionError): it runs
        return False
    return False


@dataclass
class Journal:
    """The measurements this process has begun and not recorded yet, kept in the database so that
    the next process can tell which one ended this one.

    :meth:`started` records a measurement :data:`STARTED` before anything builds or runs it;
    :meth:`leave` marks it :data:`UNFINISHED` once it is built and checked (a fault from there on is
    not its own) or when this process stops for a reason of its own (an interrupt, an error);
    :meth:`done` forgets it once its own record is added. :meth:`settled` reads a record back.
    The search (:mod:`.search_records`) and the calibration (:mod:`.calibrate`) both keep one."""

    db: RecordDB
    #: by record key, the marks of measurements started and neither left nor recorded
    open: dict[tuple[str, str, str, str], Record] = field(default_factory=dict)

    def started(self, mark: Record) -> None:
        """Record ``mark`` (its key and ``features``; its status is set here) as started by this process."""
        self.open[mark.key] = mark
        self.db.add(replace(mark, status=STARTED, features={**mark.features, **this_process()}))

    def done(self, key: tuple[str, str, str, str]) -> None:
        """The measurement of ``key`` has its own record now."""
        self.open.pop(key, None)

    def leave(self, key: tuple[str, str, str, str] | None = None) -> None:
        """Mark the started measurement of ``key`` (None: every open one) :data:`UNFINISHED`."""
        for k in [key] if key is not None else list(self.open):
            if (mark := self.open.pop(k, None)) is not None:
                self.db.add(replace(mark, status=UNFINISHED, created=time.time()))

    def settled(self, rec: Record | None, reason: str, warning: str, **features: Any) -> Record | None:
        """The record to go by instead of measuring: None for none, one left :data:`UNFINISHED`, or
        one :data:`STARTED` by a process still running (it measures it; so does this one). A started
        one whose process ended (:func:`ended_its_process`) becomes a ``compile_error`` with
        ``reason`` and ``features``, recorded so that ``warning``, logged now, is said once."""
        if rec is None or rec.status == UNFINISHED or (rec.status == STARTED and not ended_its_process(rec)):
            return None
        if rec.status != STARTED:
            return rec
        log.warning("%s", warning)
        ended = replace(rec, status="compile_error", reason=reason, features=features, created=time.time())
        self.db.add(ended)
        return ended


def _parse(line: str) -> Record | None:
    try:
        doc = json.loads(line)
        return Record(**{k: v for k, v in doc.items() if k in Record.__dataclass_fields__})
    except (ValueError, TypeError):
        return None


def machine_key(fingerprint: Any) -> str:
    """A short stable hash of a fingerprint (msgspec Struct, dataclass or dict)."""
    if hasattr(fingerprint, "__struct_fields__"):
        doc = {f: getattr(fingerprint, f) for f in fingerprint.__struct_fields__}
    elif isinstance(fingerprint, dict):
        doc = fingerprint
    else:
        doc = asdict(fingerprint)
    # core and intra-op thread counts change timings even where the build fingerprint ignores them
    import torch

    doc = {**doc, "cpus": os.cpu_count(), "threads": torch.get_num_threads()}
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]
