"""Shared fixtures: no test may leave a session or sampler thread running."""

from __future__ import annotations

import threading

import pytest

from cuvil_pgc.instrument import region as _region
from cuvil_pgc.instrument import session as _session


@pytest.fixture(autouse=True)
def no_leftover_session():
    """Fail a test that leaves a session recording or a cuvil-pgc thread alive."""
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = _session.active_session()
    if leaked is not None:
        leaked.stop()
        pytest.fail(f"test left a session recording to {leaked.path}")
    if _region._recorder is not None:
        _region.set_recorder(None)
        pytest.fail("test left a region recorder installed")
    for thread in threading.enumerate():
        if thread.ident not in before and thread.name.startswith("cuvil-pgc"):
            thread.join(timeout=2.0)
            if thread.is_alive():
                pytest.fail(f"test left thread {thread.name!r} running")
