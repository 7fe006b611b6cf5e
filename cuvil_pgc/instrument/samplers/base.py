"""The sampler plug-in point: a small base class with no-op defaults.

A session starts each configured sampler, calls ``flush`` from its writer thread at every flush
interval, and ``stop`` at the end. Samplers hand finished events (already on the trace clock,
Chrome-trace dicts as in DESIGN.md) to ``ctx.emit``. They never raise into the user's program:
the session catches what escapes, logs it once and records the sampler as failed with the reason;
a sampler that cannot run here says so through ``unavailable`` and is recorded as such;
``probe`` says more, with the fix (``cuvil-pgc doctor`` asks every backend's sampler).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cuvil_pgc.trace.schema import STATUS_OK

if TYPE_CHECKING:
    from cuvil_pgc.instrument.clock import SessionClock
    from cuvil_pgc.instrument.config import SessionConfig
    from cuvil_pgc.trace.attribution import RegionIndex


GPU_EXTRA_FIX = "pip install 'cuvil-pgc[gpu]' (cupti-python and nvidia-ml-py)"


@dataclass(frozen=True)
class Probe:
    """Whether a sampler's backend works on this machine: ``ok``, what was found (``detail``), and
    if not ok, ``reason`` and ``fix`` (what ``cuvil-pgc doctor`` shows for it)."""

    ok: bool
    detail: str = ""
    reason: str | None = None
    fix: str | None = None


@dataclass
class SamplerContext:
    """What a session gives its samplers."""

    clock: SessionClock
    config: SessionConfig
    emit: Callable[[Iterable[dict[str, Any]]], None]
    count_dropped: Callable[[str, int], None]
    # Regions completed so far as (index, ids): index over (native tid, start µs, end µs), ids the
    # regions' ids in this trace file (events name their region by ``args.region_id``).
    region_index: Callable[[], tuple[RegionIndex, Sequence[int]]]
    pid: int = 0
    devices: list[dict[str, Any]] = field(default_factory=list)


class Sampler:
    """Base sampler: override what you need. ``name`` keys its status in ``cuvil.samplers``."""

    name = "sampler"

    def __init__(self) -> None:
        self.status: dict[str, Any] = {"status": STATUS_OK}

    def unavailable(self) -> str | None:
        """Why this sampler cannot run on this machine, or None if it can. Must not raise."""
        return None

    def probe(self) -> Probe:
        """A closer look at the backend than :meth:`unavailable`, for ``cuvil-pgc doctor``: it may
        try more (claiming and releasing the backend) and says what to do. Leaves nothing running."""
        why = self.unavailable()
        return Probe(True) if why is None else Probe(False, reason=why)

    def start(self, ctx: SamplerContext) -> None:
        """Begin collecting. Called once, before the user's code runs."""

    def flush(self) -> None:
        """Hand what was collected so far to ``ctx.emit``. Called from the writer thread."""

    def stop(self) -> None:
        """Stop collecting and emit everything left. Called once, after the user's code."""
