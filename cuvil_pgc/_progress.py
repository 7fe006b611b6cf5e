"""How long work reports progress: ``progress(done, total, message)``, and optionally stages.

Any callable taking (steps done, steps in all, a message) works: a recompile's measured candidates,
``cuvil-pgc profile --model``'s iterations. An object that also has ``stage(name)`` hears of the
stages (loading, analysing, searching, racing the plan, building);
:class:`cuvil_pgc.viewer.progress.SearchDisplay` is the CLI's one (rich, on stderr). Foundation
code: the stages that report progress import it, the viewer implements it, neither knows the other.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Progress = Callable[[int, int, str], None]


def stage(progress: Any, name: str) -> None:
    """Tell ``progress`` that a new stage begins, if it listens for stages; never raises."""
    announce = getattr(progress, "stage", None)
    if announce is not None:
        try:
            announce(name)
        except Exception:   # a display must not stop a recompile
            pass
