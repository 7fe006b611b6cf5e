"""Progress of long CLI work (loading big traces, analysing, rendering, recompiling, the demo): a
rich progress display on interactive terminals only.

``stage_progress(stages)`` yields a :class:`StageProgress`; ``with progress.stage("loading"):``
wraps each step. On a terminal (stderr) it shows one bar over the steps with the current step's
description and elapsed time, removed when done; anywhere else (pipes, files, CI logs, ``--json``
runs) it prints nothing at all. Nothing is ever written to stdout. ``search_progress()`` yields a
:class:`SearchDisplay` for jobs of many steps (recompile: stage, candidate i of N with its
configuration, elapsed and estimated time, the incumbent's measured speedup); ``quiet`` turns it off.
``count_progress()`` counts items done out of a total (the traces of ``analyze --engine``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from cuvil_pgc._pool import pausable_thread


class StageProgress:
    """Steps of one command; a no-op unless a rich ``Progress`` is attached."""

    def __init__(self, progress: Any = None, total: int = 0) -> None:
        self._progress = progress
        self._task = progress.add_task("starting", total=total) if progress is not None else None

    @property
    def shown(self) -> bool:
        return self._progress is not None

    @contextlib.contextmanager
    def stage(self, description: str) -> Iterator[None]:
        """Show ``description`` while the block runs, then advance the bar by one step."""
        if self._progress is not None:
            self._progress.update(self._task, description=description)
        yield
        if self._progress is not None:
            self._progress.advance(self._task)


def interactive(console: Any) -> bool:
    """Whether ``console`` writes to a terminal a person is looking at."""
    return bool(console.is_terminal and not console.is_dumb_terminal)


@contextlib.contextmanager
def _shown(console: Any, enabled: bool | None, columns: Callable[[Any], tuple[Any, ...]]) -> Iterator[Any]:
    """A transient rich ``Progress`` with ``columns(rich.progress)`` on ``console`` (default:
    stderr), or None where nothing may show (not an interactive terminal, unless ``enabled``)."""
    from rich.console import Console

    console = console or Console(stderr=True)
    if not (interactive(console) if enabled is None else enabled):
        yield None
        return
    import rich.progress

    with rich.progress.Progress(*columns(rich.progress), console=console, transient=True) as progress, \
            pausable_thread(lambda: _stop_refreshing(progress), progress.start):   # a fork for a large trace
        yield progress


def _stop_refreshing(progress: Any) -> None:
    """Stop the display and wait for its refresh thread to end (rich's ``stop`` only signals it)."""
    thread = getattr(progress.live, "_refresh_thread", None)
    progress.stop()
    if thread is not None:
        thread.join(timeout=2)


def _stage_columns(rp: Any) -> tuple[Any, ...]:
    return (rp.SpinnerColumn(), rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(),
            rp.TimeElapsedColumn())


def _count_columns(rp: Any) -> tuple[Any, ...]:
    return rp.TextColumn("{task.description}"), rp.BarColumn(), rp.MofNCompleteColumn(), rp.TimeElapsedColumn()


def _search_columns(rp: Any) -> tuple[Any, ...]:
    return (rp.SpinnerColumn(), rp.TextColumn("[bold]{task.fields[stage]}"), rp.BarColumn(bar_width=20),
            rp.MofNCompleteColumn(), rp.TimeElapsedColumn(), rp.TextColumn("eta"), rp.TimeRemainingColumn(),
            rp.TextColumn("{task.description}"), rp.TextColumn("{task.fields[best]}"))


@contextlib.contextmanager
def stage_progress(total: int, *, console: Any = None, enabled: bool | None = None) -> Iterator[StageProgress]:
    """A progress display over ``total`` steps, on stderr, shown only on interactive terminals.

    Args:
        total: number of ``stage`` blocks the command will run.
        console: a rich Console (default: one on stderr).
        enabled: force on or off (default: :func:`interactive`).
    """
    with _shown(console, enabled, _stage_columns) as progress:
        yield StageProgress(progress, total)


@contextlib.contextmanager
def count_progress(description: str, *, console: Any = None,
                   enabled: bool | None = None) -> Iterator[Callable[[int, int, str], None] | None]:
    """A bar of items done out of a total (``analyze --engine``: traces analysed), on stderr.

    Yields ``advance(done, total, item)`` on interactive terminals, None anywhere else."""
    with _shown(console, enabled, _count_columns) as bar:
        if bar is None:
            yield None
            return
        task = bar.add_task(description, total=None)

        def advance(done: int, total: int, item: str) -> None:
            bar.update(task, completed=done, total=total)

        yield advance


class SearchDisplay:
    """Progress of a long job with steps (recompile's candidates, a demo's models, profiling
    iterations): the stage, step i of N with what it is doing, elapsed and estimated time.

    Called as ``display(done, total, message)`` (:data:`cuvil_pgc._progress.Progress`),
    ``display.stage(name)`` when a stage begins and ``display.best(text)`` when the incumbent's
    speedup changes (a field of its own: "candidate 4 of 8: building aoti · model: best compile 2.92x").
    """

    def __init__(self, progress: Any) -> None:
        self._progress = progress
        self._task = progress.add_task("", total=None, stage="starting", best="")

    def stage(self, name: str) -> None:
        self._progress.update(self._task, stage=name)

    def best(self, text: str) -> None:
        """The incumbent's measured speedup, kept beside the step's message until the next one."""
        self._progress.update(self._task, best=f"· {text}" if text else "")

    def __call__(self, done: int, total: int, message: str) -> None:
        self._progress.update(self._task, completed=done, total=total or None, description=message)


@contextlib.contextmanager
def search_progress(*, quiet: bool = False, console: Any = None,
                    enabled: bool | None = None) -> Iterator[SearchDisplay | None]:
    """A :class:`SearchDisplay` on stderr, or None when not on a terminal or ``quiet``."""
    with _shown(console, False if quiet else enabled, _search_columns) as progress:
        yield None if progress is None else SearchDisplay(progress)
