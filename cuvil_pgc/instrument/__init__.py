"""Instrumentation: regions, module instrumentation, sessions and samplers."""

from __future__ import annotations

from cuvil_pgc.instrument.config import SessionConfig
from cuvil_pgc.instrument.factory import profile
from cuvil_pgc.instrument.region import ProfileRegion, current_path
from cuvil_pgc.instrument.session import Session, active_session

__all__ = ["ProfileRegion", "Session", "SessionConfig", "active_session", "current_path", "profile"]
