"""Shared fixtures: no test may leave a session or sampler thread running; tests marked ``cuda``
are skipped where torch sees no CUDA device."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

import pytest

from cuvil_pgc.instrument import region as _region
from cuvil_pgc.instrument import session as _session


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_configure(config):
    """Each xdist worker compiles into an Inductor cache of its own. Inductor keys an AOTInductor
    build's directory by the graph's code, so two workers packaging the same model at once shared
    one directory, and one zipped the other's half-written files: a CI run failed once loading such
    a package ("json parse error ... empty input"). A cache set by the environment is kept."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        config._inductor_cache = os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(
            prefix=f"cuvil-inductor-{worker}-")


def pytest_unconfigure(config):
    made = getattr(config, "_inductor_cache", None)
    if made:
        shutil.rmtree(made, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    """The ``cuda`` marker alone is enough: without CUDA those tests are skipped with the reason."""
    cuda_tests = [item for item in items if item.get_closest_marker("cuda")]
    if cuda_tests and not _cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA GPU")
        for item in cuda_tests:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_leftover_session():
    """Fail a test that leaves a session recording or a cuvil-pgc thread alive."""
    before = {t.ident for t in threading.enumerate()}
    yield
    leaked = _session.active_session()
    if leaked is not None:
        leaked.stop()
        pytest.fail(f"test left a session recording to {leaked.path}")
    if _region.recording():
        _region.set_recorder(None)
        pytest.fail("test left a region recorder installed")
    for thread in threading.enumerate():
        if thread.ident not in before and thread.name.startswith("cuvil-pgc"):
            thread.join(timeout=2.0)
            if thread.is_alive():
                pytest.fail(f"test left thread {thread.name!r} running")


@pytest.fixture
def build_env(tmp_path, monkeypatch):
    """A cache of the test's own and no trust configured by the environment (a developer's
    $CUVIL_TRUSTED_KEY or $CUVIL_ALLOW_UNSIGNED must not decide what a build test sees)."""
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CUVIL_TRUSTED_KEY", raising=False)
    monkeypatch.delenv("CUVIL_ALLOW_UNSIGNED", raising=False)


@pytest.fixture
def keys(tmp_path):
    """(private key path, public key path) of a signer the test trusts."""
    from cuvil_pgc.recompile.signing import generate_keypair

    return generate_keypair(tmp_path / "release.key")


@pytest.fixture(autouse=True)
def programs_time_faster(monkeypatch):
    """A program for other sizes times faster than its original module at every size (the timing
    seam of recompile/size_speed.py): which sizes a build's programs keep must not depend on how
    loaded the machine running the tests is. tests/test_size_speed.py times them otherwise."""
    from cuvil_pgc.recompile import size_speed

    monkeypatch.setattr(size_speed, "timer", lambda program, original, args_at, rounds=size_speed.ROUNDS:
                        lambda size: (0.0, 1.0))


@pytest.fixture(autouse=True)
def short_final_race(monkeypatch):
    """The final race times the plans in 200 rounds, so that a descheduled sample cannot flip a near
    tie; no test asserts a timing (and those that decide a race fake its clock), so the tests race
    in 10: the final race took two thirds of a recompile test's time. Returns the real count, for
    the test of it."""
    from cuvil_pgc.recompile import plan

    real = plan.FINAL_RACE_ROUNDS
    monkeypatch.setattr(plan, "FINAL_RACE_ROUNDS", 10)
    return real
