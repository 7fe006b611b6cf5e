"""cuvil-pgc: profiling and profile-guided recompilation for PyTorch inference.

Public API re-exports only. ``ProfileRegion`` and ``profile`` import nothing heavy; the rest
(numpy, torch) loads on first use.
"""

from __future__ import annotations

from cuvil_pgc._lazy import lazy_getattr
from cuvil_pgc._version import __version__ as __version__
from cuvil_pgc.errors import CuvilError
from cuvil_pgc.instrument import ProfileRegion, Session, SessionConfig, profile
from cuvil_pgc.instrument.on_demand import start_from_env as _start_on_demand

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

_start_on_demand()   # CUVIL_PGC_ON_DEMAND=1: always-on aggregates, capture windows on request

__all__ = ["CuvilError", "ProfileRegion", "Session", "SessionConfig", "profile", *_LAZY]


__getattr__ = lazy_getattr(__name__, _LAZY)
