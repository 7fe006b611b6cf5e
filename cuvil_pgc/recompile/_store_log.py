"""The build store's log: a hash-chained history that ``state.json`` must agree with.

``<store>/<name>/log.jsonl`` is the source of truth; ``state.json`` is a copy that readers use
without taking the lock. Contract:

- **Chain.** Every line is one :class:`~cuvil_pgc.recompile._store_state.LogEntry` whose ``prev``
  is the SHA-256 (hex) of the line before it, without its newline; the first line has none. An
  edited, removed, reordered or inserted line breaks the chain at the line after it.
- **Replay.** Entries carry what the state needs: a push its ``record``, a pointer move the
  pointer ``after`` it, a ``checkpoint`` the whole ``state``. :func:`replay` rebuilds the state
  from the last checkpoint (or the first line) onward.
- **Check on every write** (:func:`checked_state`, under the name's lock): the log must read and
  chain, and ``state.json`` must equal its replay; otherwise a StoreError names the file, the
  problem and the repair command (``cuvil-pgc builds repair NAME``). A missing log beside an
  existing state is refused, never silently recreated.
- **Logs written before the chain** (no ``prev`` anywhere) stay readable. On their next write the
  state is checked against what such a log can tell (versions and digests pushed, each pointer's
  last value and highest mark) and, if it agrees, a ``checkpoint`` entry carrying the state is
  appended: the store is migrated, chained from then on.
- **Repair** (:func:`repair`): with an intact log, ``state.json`` is rewritten from the replay;
  with ``from_state=True`` (the log is damaged or missing) a new log starts with a checkpoint of
  ``state.json``. Whatever is replaced is kept beside it as ``<file>.damaged-<time>``.
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path

import msgspec

from cuvil_pgc.errors import StoreError
from cuvil_pgc.recompile import _store_state as st

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(st.LogEntry)


@dataclass
class Chain:
    """A log as read: its entries, the raw lines they came from, and whether it predates chaining."""

    entries: list[st.LogEntry]
    lines: list[bytes]
    legacy: bool = False        # every line was written before the chain existed

    @property
    def last_digest(self) -> str | None:
        return digest(self.lines[-1]) if self.lines else None


def digest(line: bytes) -> str:
    return hashlib.sha256(line).hexdigest()


def _replayable(entry: st.LogEntry) -> bool:
    return entry.record is not None or entry.after is not None or entry.state is not None


def repair_command(directory: Path, *flags: str) -> str:
    return " ".join(["cuvil-pgc builds repair", directory.name, "--store", str(directory.parent), *flags])


def read_chain(path: Path) -> Chain:
    """Every entry of the log, chain verified; StoreError naming the line that breaks it."""
    try:
        lines = [line for line in path.read_bytes().splitlines() if line.strip()]
    except FileNotFoundError:
        return Chain([], [])
    except OSError as exc:
        raise StoreError(f"store log cannot be read ({exc.strerror or exc})", path=path,
                         fix=from_state_fix(path)) from None
    entries = []
    for n, line in enumerate(lines, 1):
        try:
            entries.append(_DECODER.decode(line))
        except msgspec.DecodeError as exc:
            raise StoreError(f"store log line {n} is malformed ({exc})", path=path, fix=from_state_fix(path)) from None
    seen_chained = False
    for n, entry in enumerate(entries, 1):
        if entry.prev is None and not _replayable(entry):        # a line written before the chain
            if seen_chained:
                raise StoreError(f"store log line {n} has no digest of the line before it: it was inserted or "
                                 "edited", path=path, fix=from_state_fix(path))
            continue
        if n == 1 and entry.prev is not None:
            raise StoreError("the first line of the store log names a line before it: lines were removed from "
                             "its start", path=path, fix=from_state_fix(path))
        if n > 1 and entry.prev != digest(lines[n - 2]):
            raise StoreError(f"store log line {n} does not follow line {n - 1} (the digest of the line before it "
                             "differs): a line was edited, removed or inserted", path=path, fix=from_state_fix(path))
        if n > 1 and not seen_chained and entry.op != "checkpoint":
            raise StoreError(f"store log line {n} is chained to lines written before the chain without a checkpoint",
                             path=path, fix=from_state_fix(path))
        seen_chained = True
    return Chain(entries, lines, legacy=bool(entries) and not seen_chained)


def from_state_fix(log: Path) -> str:
    return (f"if state.json beside it is right, `{repair_command(log.parent, '--from-state')}` starts a new log "
            "from it (the damaged log is kept beside it); otherwise restore log.jsonl from a backup")


def replay(chain: Chain, name: str) -> st.NameState:
    """The state the log describes (from its last checkpoint on)."""
    start = max((i for i, e in enumerate(chain.entries) if e.op == "checkpoint"), default=0)
    state = st.NameState(name=name)
    for entry in chain.entries[start:]:
        if entry.op == "checkpoint" and entry.state is not None:
            state = msgspec.json.decode(_ENCODER.encode(entry.state), type=st.NameState)
        elif entry.op == "push" and entry.record is not None:
            state.versions[entry.version] = entry.record
        elif entry.pointer is not None and entry.after is not None:
            state.pointers[entry.pointer] = entry.after
    return state


def legacy_problems(state: st.NameState, entries: list[st.LogEntry]) -> list[str]:
    """Where ``state`` disagrees with what a log written before the chain can tell."""
    problems = []
    pushed = {e.version: e.manifest_sha256 for e in entries if e.op == "push"}
    held = {v: r.manifest_sha256 for v, r in state.versions.items()}
    if pushed != held:
        problems.append(f"versions {_versions(held)} in state.json, {_versions(pushed)} pushed in the log")
    last: dict[str, int] = {}
    highest: dict[str, int] = {}
    for e in entries:
        if e.pointer is not None:
            last[e.pointer] = e.version
            if e.op in ("promote", "tag"):
                highest[e.pointer] = max(highest.get(e.pointer, 0), e.version)
    for pointer in sorted(set(last) | set(state.pointers)):
        have = state.pointers.get(pointer)
        if have is None or pointer not in last or have.version != last[pointer] \
                or have.high_water < highest.get(pointer, 0):
            problems.append(f"pointer {pointer}: {_pointer(have)} in state.json, v{last.get(pointer, '-')} "
                            f"(high-water at least v{highest.get(pointer, '-')}) in the log")
    return problems


def differences(expected: st.NameState, actual: st.NameState) -> list[str]:
    """What ``actual`` (state.json) says that the log (``expected``) does not."""
    out = []
    if set(expected.versions) != set(actual.versions):
        out.append(f"versions {_versions(actual.versions)} in state.json, {_versions(expected.versions)} in the log")
    for v in sorted(set(expected.versions) & set(actual.versions)):
        if expected.versions[v] != actual.versions[v]:
            out.append(f"the record of v{v} differs")
    for pointer in sorted(set(expected.pointers) | set(actual.pointers)):
        want, have = expected.pointers.get(pointer), actual.pointers.get(pointer)
        if want != have:
            out.append(f"pointer {pointer}: {_pointer(have)} in state.json, {_pointer(want)} in the log")
    return out


def _versions(versions) -> str:
    return "[" + ", ".join(str(v) for v in sorted(versions)) + "]"


def _pointer(p: st.Pointer | None) -> str:
    return "none" if p is None else f"v{p.version} (high-water v{p.high_water}, history {p.history})"


def checked_state(directory: Path, name: str) -> tuple[st.NameState, Chain]:
    """state.json and the log, verified against each other (call under the name's lock).

    A legacy log that agrees with the state gets its migration checkpoint here."""
    state_path, log_path = directory / "state.json", directory / "log.jsonl"
    state = st.read_state(state_path, name)
    if not os.path.lexists(log_path):
        if os.path.lexists(state_path):
            raise StoreError("store log is missing (state.json exists, so the history was deleted)", path=log_path,
                             fix=from_state_fix(log_path))
        return state, Chain([], [])
    chain = read_chain(log_path)
    if chain.legacy:
        problems = legacy_problems(state, chain.entries)
        if problems:
            raise StoreError(f"state.json disagrees with the log: {'; '.join(problems)}", path=state_path,
                             fix=f"check both; `{repair_command(directory, '--from-state')}` accepts state.json "
                                 "as it is")
        append(log_path, chain, st.log_entry("checkpoint", name, 0, reason="migrated to a chained log",
                                             state=state))
        return state, read_chain(log_path)
    problems = differences(replay(chain, name), state)
    if problems:
        raise StoreError(f"state.json disagrees with the log: {'; '.join(problems)}", path=state_path,
                         fix=f"the log is the source of truth: `{repair_command(directory)}` rewrites state.json "
                             "from it")
    return state, chain


def append(path: Path, chain: Chain, entry: st.LogEntry) -> None:
    """Append ``entry`` chained to the log's last line, with O_APPEND, fsynced; updates ``chain``."""
    entry.prev = chain.last_digest
    line = _ENCODER.encode(entry)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o644)
    try:
        os.write(fd, line + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    chain.entries.append(entry)
    chain.lines.append(line)


def repair(directory: Path, name: str, *, from_state: bool = False) -> list[str]:
    """Make state.json and the log agree again (see module docstring); returns what was done."""
    state_path, log_path = directory / "state.json", directory / "log.jsonl"
    done: list[str] = []
    if from_state:
        state = st.read_state(state_path, name)
        if not os.path.lexists(state_path):
            raise StoreError("there is no state.json to start a new log from", path=state_path,
                             fix="restore log.jsonl or state.json from a backup")
        if os.path.lexists(log_path):
            done.append(f"kept the old log as {_set_aside(log_path).name}")
        chain = Chain([], [])
        append(log_path, chain, st.log_entry("checkpoint", name, 0, reason="repair --from-state", state=state))
        done.append("started a new log from state.json")
        return done
    chain = read_chain(log_path)
    if not chain.entries:
        raise StoreError("the store log is missing or empty: there is nothing to rebuild state.json from",
                         path=log_path, fix=from_state_fix(log_path))
    if chain.legacy:
        checked_state(directory, name)          # migrates when the state agrees, refuses otherwise
        return ["migrated the log: it is chained from now on"]
    expected = replay(chain, name)
    try:
        current = st.read_state(state_path, name)
    except StoreError:
        current = None
    if current == expected:
        return ["state.json already agrees with the log; nothing changed"]
    if os.path.lexists(state_path):
        done += [f"state.json said: {d}" for d in (differences(expected, current) if current else [])]
        done.append(f"kept the old state as {_set_aside(state_path).name}")
    st.write_state(state_path, expected)
    done.append("rewrote state.json from the log")
    return done


def _set_aside(path: Path) -> Path:
    target = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}")
    n = 1
    while os.path.lexists(target):
        target = target.with_name(f"{target.name.split('~')[0]}~{n}")
        n += 1
    os.replace(path, target)
    return target
