"""Errors raised by cuvil-pgc's offline code (load, analyze, recompile, CLI).

Every message says what is wrong, where (the file, the event, the option) and what to do.
Code on the user's hot path (regions, samplers, exporters) never raises these into the
user's program: it logs once and counts what it dropped instead.
"""

from __future__ import annotations

import os


class CuvilError(Exception):
    """Base class: a problem the user can fix, with a message that says how."""

    def __init__(self, problem: str, *, path: str | os.PathLike[str] | None = None, fix: str | None = None):
        self.problem = problem
        self.path = None if path is None else os.fspath(path)
        self.fix = fix
        super().__init__(self._message())

    def located(self, path: str | os.PathLike[str]) -> CuvilError:
        """This error, named by ``path`` where it names no file yet (raised about a part of the
        file the caller was reading: a member of a build's package)."""
        if self.path is None:
            self.path = os.fspath(path)
            self.args = (self._message(),)
        return self

    def _message(self) -> str:
        where = f"{self.path}: " if self.path else ""
        tail = f" ({self.fix})" if self.fix else ""
        return f"{where}{self.problem}{tail}"


class TraceError(CuvilError):
    """A trace file cannot be read: not JSON, truncated, wrong types, impossible values."""


class RegionError(CuvilError, ValueError):
    """A ProfileRegion was created with an unusable name or attribute (raised at creation)."""


class SessionError(CuvilError):
    """A profiling session cannot start or stop (another one is recording, bad options)."""


class ConfigError(CuvilError, ValueError):
    """An option, environment variable or command-line value is invalid."""


class ModelSpecError(CuvilError):
    """A MODULE:FACTORY reference cannot be imported or does not return (model, example_inputs)."""


class AnalysisError(CuvilError):
    """A trace holds nothing the analyzer can use, or a machine file is unusable."""


class RecompileError(CuvilError):
    """The recompiler cannot build or apply a plan."""


class BuildError(CuvilError):
    """A build package is malformed, incompatible, tampered with or unsigned."""


class StoreError(CuvilError):
    """The build store refuses an operation (anti-rollback, unknown name or version, lock)."""


def one_line(exc: BaseException, limit: int = 500) -> str:
    """An exception's message on one line (whitespace collapsed), its type name where it has none,
    cut to ``limit`` characters: what an error or warning about a failure quotes of it."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."
