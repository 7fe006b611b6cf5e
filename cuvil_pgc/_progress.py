"""How long work reports progress: ``progress(done, total, message)``, and optionally stages.

Any callable taking (steps done, steps in all, a message) works: a recompile's measured candidates,
``cuvil-pgc profile --model``'s iterations. An object that also has ``stage(name)`` hears of the
stages (loading, analysing, searching, racing the plan, building), and one with ``best(text)``
hears of the incumbent's measured speedup as a field of its own, so it stays in view while the next
candidate builds (a plain callable gets it as a message);
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
