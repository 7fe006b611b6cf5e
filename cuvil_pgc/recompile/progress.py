"""How a recompile reports progress: ``progress(done, total, message)``, and optionally stages.

Any callable taking (measured so far, candidates to measure, a message) works. An object that
also has ``stage(name)`` hears of the stages (analysing, calibrating, searching, racing the plan,
building); :class:`cuvil_pgc.viewer.progress.SearchDisplay` is the CLI's one (rich, on stderr).
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
