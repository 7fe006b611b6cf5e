"""How a recompile reports progress: ``progress(done, total, message)``, and optionally stages.

Any callable taking (measured so far, candidates to measure, a message) works. An object that
also has ``stage(name)`` hears of the stages (analysing, calibrating, searching, racing the plan,
building), and one with ``best(text)`` hears of the incumbent's measured speedup as a field of its
own, so it stays in view while the next candidate builds (a plain callable gets it as a message);
:class:`cuvil_pgc.viewer.progress.SearchDisplay` is the CLI's one (rich, on stderr).
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


def show_best(progress: Any, text: str) -> bool:
    """Tell ``progress`` the incumbent's speedup (``model: best aoti 1.84x``) if it keeps one;
    whether it does. Never raises."""
    keep = getattr(progress, "best", None)
    if keep is None:
        return False
    try:
        keep(text)
    except Exception:   # a display must not stop a recompile
        pass
    return True
