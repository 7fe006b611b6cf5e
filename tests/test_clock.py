"""The session's (monotonic, wall) clock pair: the narrowest bracket of a few tries, faked at the clocks."""

from __future__ import annotations

import itertools

from cuvil_pgc.instrument import clock


def _fake(monkeypatch, brackets: list[int]) -> None:
    """Each try reads perf_counter before and after time_ns; ``brackets`` are the gaps (ns)."""
    mono = iter(itertools.chain.from_iterable((1_000_000 * i, 1_000_000 * i + gap) for i, gap in enumerate(brackets)))
    walls = iter(range(10**18, 10**18 + 10 * len(brackets), 10))
    monkeypatch.setattr(clock.time, "perf_counter_ns", lambda: next(mono))
    monkeypatch.setattr(clock.time, "time_ns", lambda: next(walls))


def test_a_preempted_pairing_is_not_the_one_kept(monkeypatch):
    # the first try was preempted for 3 ms between its reads, the third was quick
    _fake(monkeypatch, [3_000_000, 50_000, 800, 900])
    pair = clock.SessionClock.now()
    assert pair.start_mono_ns == 2_000_000 + 400 and pair.start_unix_ns == 10**18 + 20


def test_without_a_quick_try_the_narrowest_bracket_wins(monkeypatch):
    brackets = [3_000_000] * clock.PAIRING_TRIES
    brackets[5] = 40_000
    _fake(monkeypatch, brackets)
    pair = clock.SessionClock.now()
    assert pair.start_mono_ns == 5_000_000 + 20_000 and pair.start_unix_ns == 10**18 + 50
