"""Programs of their own for the sizes a service calls often (:mod:`cuvil_pgc.recompile.size_programs`):
the scheduling, with the compile and the check faked at their seam and the jobs run where the test says."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from cuvil_pgc.recompile.size_programs import COMPILE_AFTER, MAX_REFUSED, SizePrograms, compiling_now


class Programs:
    """A fake runtime: ``compile`` records the shapes it was asked for; ``wrong`` shapes fail the check."""

    def __init__(self, wrong=()):
        self.made, self.checked, self.wrong = [], [], set(wrong)

    def compile(self, shapes):
        self.made.append(shapes)
        return ("program", shapes)

    def check(self, runner, args):
        self.checked.append((runner, args))
        if runner[1] in self.wrong:
            raise ValueError("answers differently")


def calls(sizes, *shapes, times=1):
    """Call ``sizes`` ``times`` at each shape; the runners it answered, in order."""
    got = []
    for shape in shapes:
        for _ in range(times):
            x = torch.zeros(shape)
            got.append(sizes.runner((x,), (x, None)))
    return got


def test_a_size_gets_its_program_after_it_was_called_often_and_the_free_size_program_answers_until_then():
    fake, jobs = Programs(), []
    sizes = SizePrograms(fake.compile, fake.check, submit=jobs.append)
    assert calls(sizes, (2, 5), times=COMPILE_AFTER) == [None] * COMPILE_AFTER
    assert len(jobs) == 1 and fake.made == []            # asked for, not made on the caller's thread
    assert calls(sizes, (2, 5)) == [None]                # still being made: the free-size program answers
    assert len(jobs) == 1                                # and it is not asked for twice
    jobs.pop()()
    assert fake.made == [((2, 5),)] and calls(sizes, (2, 5), (2, 6)) == [("program", ((2, 5),)), None]
    runner, args = fake.checked[0]                       # checked at the call's own inputs, Nones included
    assert args[1] is None and args[0].shape == (2, 5) and sizes.compiled == 1 and sizes.sizes() == [((2, 5),)]


def test_the_check_sees_a_copy_of_the_inputs_the_caller_may_reuse():
    fake, jobs = Programs(), []
    sizes = SizePrograms(fake.compile, fake.check, submit=jobs.append)
    x = torch.zeros(3, 4)
    for _ in range(COMPILE_AFTER):
        sizes.runner((x,), (x,))
    x.fill_(7)                                          # the service reuses its buffer before the worker runs
    jobs.pop()()
    assert fake.checked[0][1][0].eq(0).all()


def test_a_size_the_check_refuses_stays_on_the_free_size_program_and_enough_refusals_stop_compiling(caplog):
    wrong = [((1, n),) for n in range(MAX_REFUSED)]
    fake = Programs(wrong=wrong)
    sizes = SizePrograms(fake.compile, fake.check, submit=lambda job: job(), label="tagger")
    with caplog.at_level(logging.WARNING):
        calls(sizes, (1, 0), times=COMPILE_AFTER + 3)
    assert sizes.refused == 1 and len(fake.made) == 1 and sizes.stopped is None    # never asked for again
    assert "tagger" in caplog.text and "(1, 0)" in caplog.text and "answers differently" in caplog.text
    calls(sizes, *[(1, n) for n in range(1, MAX_REFUSED)], times=COMPILE_AFTER)
    assert sizes.stopped is not None and "answers differently" in sizes.stopped
    calls(sizes, (9, 9), times=COMPILE_AFTER)             # a right size, but the region compiles no more
    assert len(fake.made) == MAX_REFUSED and sizes.compiled == 0


def test_a_full_region_replaces_its_least_called_size_only_for_one_called_more_than_twice_as_often():
    fake = Programs()
    sizes = SizePrograms(fake.compile, fake.check, capacity=2, submit=lambda job: job())
    calls(sizes, (1, 1), times=10)
    calls(sizes, (1, 2), times=4)
    assert sorted(sizes.sizes()) == [((1, 1),), ((1, 2),)]
    sizes.leans[((1, 2),)] = "lean of (1, 2)"
    assert calls(sizes, (1, 3), times=8)[-1] is None and len(fake.made) == 2    # 8 calls: not above twice 4
    calls(sizes, (1, 3))                                 # the ninth is: it replaces (1, 2), and its lean call goes
    assert sorted(sizes.sizes()) == [((1, 1),), ((1, 3),)] and sizes.evicted == 1 and sizes.leans == {}
    calls(sizes, (1, 2), times=5)                        # 9 calls, (1, 3)'s 9 make the floor 9: no thrash
    assert sorted(sizes.sizes()) == [((1, 1),), ((1, 3),)] and len(fake.made) == 3


def test_capacity_counts_the_programs_being_made():
    fake, jobs = Programs(), []
    sizes = SizePrograms(fake.compile, fake.check, capacity=1, submit=jobs.append)
    calls(sizes, (1, 1), (1, 2), times=COMPILE_AFTER * 3)
    assert len(jobs) == 1


def test_capacity_zero_compiles_nothing():
    fake = Programs()
    sizes = SizePrograms(fake.compile, fake.check, capacity=0, submit=lambda job: job())
    assert calls(sizes, (2, 2), times=10) == [None] * 10 and fake.made == [] and sizes.stopped


def test_the_caller_never_sees_a_failure_of_its_own_machinery():
    def submit(job):
        raise RuntimeError("can't start new thread")
    fake = Programs()
    sizes = SizePrograms(fake.compile, fake.check, submit=submit)
    assert calls(sizes, (2, 2), times=COMPILE_AFTER + 1) == [None] * (COMPILE_AFTER + 1)
    assert sizes.dropped == 2 and sizes.wait(0)          # asked again on the next call; nothing left pending


def slow_sizes():
    """(sizes, fake, started, release): programs on the background worker whose compile sets
    ``started``, then blocks until ``release`` is set."""
    release, started, fake = threading.Event(), threading.Event(), Programs()

    def slow_compile(shapes):
        started.set()
        release.wait(60)
        return fake.compile(shapes)
    return SizePrograms(slow_compile, fake.check), fake, started, release


def test_the_background_worker_makes_programs_while_the_caller_goes_on():
    sizes, fake, started, release = slow_sizes()
    calls(sizes, (3, 3), times=COMPILE_AFTER)
    assert started.wait(60)
    assert calls(sizes, (3, 3)) == [None] and not sizes.wait(0)     # not waiting for the compile
    release.set()
    assert sizes.wait(60) and calls(sizes, (3, 3)) == [("program", ((3, 3),))]


def test_compiling_now_makes_a_sizes_program_at_its_first_call_on_the_callers_thread():
    fake, jobs = Programs(wrong=[((1, 7),)]), []
    sizes = SizePrograms(fake.compile, fake.check, capacity=2, submit=jobs.append)
    with compiling_now():
        assert calls(sizes, (2, 5)) == [("program", ((2, 5),))]
        assert calls(sizes, (1, 7)) == [None] and sizes.refused == 1       # refused: the free-size program answers
        assert calls(sizes, (3, 3)) == [("program", ((3, 3),))]
        assert calls(sizes, (4, 4)) == [None]                              # full: the rule for replacing holds
    assert jobs == [] and fake.made == [((2, 5),), ((1, 7),), ((3, 3),)]
    x = torch.zeros(2, 5)
    assert fake.checked[0][1][0].shape == x.shape
    sizes.capacity = 4
    calls(sizes, (6, 6), times=COMPILE_AFTER)            # outside it, sizes go to the background again
    assert len(jobs) == 1 and len(fake.made) == 3
    calls(sizes, (7, 7), times=COMPILE_AFTER - 1)
    with compiling_now():                                 # called often before, without a program: made now
        assert calls(sizes, (7, 7)) == [("program", ((7, 7),))] and len(jobs) == 1


def test_compiling_now_waits_for_a_program_the_worker_is_making():
    sizes, fake, started, release = slow_sizes()
    calls(sizes, (3, 3), times=COMPILE_AFTER)
    assert started.wait(60)
    got = []

    def call_now():
        with compiling_now():
            got.extend(calls(sizes, (3, 3)))
    caller = threading.Thread(target=call_now)
    caller.start()
    caller.join(0.1)
    assert caller.is_alive() and got == []               # waiting: the compile cannot end before release
    release.set()
    caller.join(60)
    assert got == [("program", ((3, 3),))] and fake.made == [((3, 3),)]


@pytest.mark.parametrize("bad", [-1, 1.5, "8"])
def test_load_build_refuses_a_size_programs_that_is_not_a_count(bad):
    from cuvil_pgc import load_build
    from cuvil_pgc.errors import BuildError

    with pytest.raises(BuildError, match="size_programs"):
        load_build("missing.cuvilpkg", torch.nn.Linear(2, 2), size_programs=bad)


def test_calls_through_a_sizes_lean_call_count_toward_keeping_it():
    fake = Programs()
    sizes = SizePrograms(fake.compile, fake.check, capacity=1, submit=lambda job: job())
    calls(sizes, (1, 1), times=COMPILE_AFTER)
    sizes.leans[((1, 1),)] = "lean"
    for _ in range(20):                       # the region's lean call answers these, not runner()
        assert sizes.lean(((1, 1),)) == "lean"
    calls(sizes, (1, 2), times=2 * (COMPILE_AFTER + 20))     # not above twice 23 calls: (1, 1) stays
    assert sizes.sizes() == [((1, 1),)] and sizes.lean(((1, 2),)) is None


def test_a_forked_child_asks_again_for_the_programs_its_parent_was_making():
    from cuvil_pgc.recompile import size_programs

    fake, jobs = Programs(), []
    sizes = SizePrograms(fake.compile, fake.check, submit=jobs.append)
    calls(sizes, (2, 2), times=COMPILE_AFTER)
    sizes._idle.acquire()                    # held by the parent's worker thread at the fork
    size_programs._after_fork_in_child()     # what os.fork runs in the child
    assert sizes.wait(0)                     # not waiting for the parent's worker, nor its lock
    calls(sizes, (2, 2))
    assert len(jobs) == 2


def test_by_default_a_region_keeps_no_more_programs_than_copies_of_its_weights_fit_the_budget():
    from cuvil_pgc.recompile.size_programs import CAPACITY, WEIGHTS_BUDGET, default_capacity

    assert default_capacity(2 << 20) == CAPACITY
    assert default_capacity(WEIGHTS_BUDGET // 3) == 3
    assert default_capacity(WEIGHTS_BUDGET + 1) == 0 and default_capacity(0) == CAPACITY
    assert default_capacity(WEIGHTS_BUDGET // 3, kept=1) == 2 and default_capacity(WEIGHTS_BUDGET, kept=1) == 0
