"""cuvil-pgc: profiling and profile-guided recompilation for PyTorch inference.

Public API re-exports. ``ProfileRegion`` and ``profile`` import nothing heavy; the rest
(numpy, torch) loads on first use.

Importing ``cuvil_pgc`` (or any of its modules, which imports this package first) has one side
effect, and only when the environment asks for it: with ``CUVIL_PGC_ON_DEMAND=1`` it starts the
on-demand controller (:func:`cuvil_pgc.instrument.on_demand.start_from_env`: always-on aggregates
and capture windows on request, see ``cuvil-pgc capture``), so a server gets it without a code
change. Without that variable, importing starts no thread, installs no signal handler and writes
nothing.
"""

from __future__ import annotations

from cuvil_pgc._lazy import lazy_getattr
from cuvil_pgc._version import __version__
from cuvil_pgc.errors import CuvilError
from cuvil_pgc.instrument import ProfileRegion, Session, SessionConfig, profile
from cuvil_pgc.instrument.config import on_demand_requested

_LAZY = {
    "instrument_module": ("cuvil_pgc.instrument.module", "instrument_module"),
    "schedule": ("cuvil_pgc.instrument.schedule", "schedule"),
    "active_session": ("cuvil_pgc.instrument.session", "active_session"),
    "load_trace": ("cuvil_pgc.trace", "load_trace"),
    "Trace": ("cuvil_pgc.trace", "Trace"),
    "analyze": ("cuvil_pgc.analyze", "analyze"),
    "analyze_many": ("cuvil_pgc.analyze.engine", "analyze_many"),
    "sql": ("cuvil_pgc.analyze.sql", "sql"),
    "recompile": ("cuvil_pgc.recompile", "recompile"),
    "load_build": ("cuvil_pgc.recompile", "load_build"),
}

__all__ = ["CuvilError", "ProfileRegion", "Session", "SessionConfig", "__version__", "profile", *_LAZY]


__getattr__ = lazy_getattr(__name__, _LAZY)


def _start_on_demand_if_asked() -> None:
    """The import-time side effect named in the module docstring (nothing unless asked)."""
    if not on_demand_requested():
        return
    from cuvil_pgc.instrument.on_demand import start_from_env

    start_from_env()


_start_on_demand_if_asked()
