"""Analysis passes and what each needs: the analyzer's plug-in point.

A pass is a plain function ``pass_(prep, analysis) -> None`` that fills its part of the
:class:`~cuvil_pgc.analyze.analysis.Analysis` from the :class:`~cuvil_pgc.analyze._prepare.Prepared`
view of a trace. A pass that reads what other passes write names them with ``@requires(...)``
(HolisticTraceAnalysis' rule that each analysis can run alone): ``analyze(trace, passes=[p])``
runs ``p``'s prerequisites first, so a subset gives the same figures as the whole list.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from cuvil_pgc.errors import ConfigError

Pass = Callable[[Any, Any], None]        # (Prepared, Analysis) -> None


def requires(*needed: Pass) -> Callable[[Pass], Pass]:
    """Decorator: the passes that must have run before the decorated one (none: ``@requires()``)."""

    def declare(pass_: Pass) -> Pass:
        pass_.requires = tuple(needed)    # type: ignore[attr-defined]
        return pass_
    return declare


def prerequisites(pass_: Pass) -> tuple[Pass, ...]:
    """What ``pass_`` declared with :func:`requires` (nothing for an undecorated function)."""
    return tuple(getattr(pass_, "requires", ()))


def with_prerequisites(passes: Sequence[Pass]) -> list[Pass]:
    """``passes`` in their order, each preceded by the prerequisites not run yet; each pass once."""
    ordered: list[Pass] = []

    def add(pass_: Pass, chain: tuple[Pass, ...]) -> None:
        if pass_ in ordered:
            return
        if pass_ in chain:
            names = " -> ".join(p.__name__ for p in (*chain, pass_))
            raise ConfigError(f"analysis passes require each other in a circle: {names}")
        for needed in prerequisites(pass_):
            add(needed, (*chain, pass_))
        ordered.append(pass_)

    for pass_ in passes:
        add(pass_, ())
    return ordered
