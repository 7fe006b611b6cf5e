"""How far a program for other sizes stays faster than the original module
(recompile/size_speed.py): a range ends where its program times slower, and a decoding step whose
cache is longer than its build runs goes straight to the model's own forward."""

from __future__ import annotations

import logging
import time
import types

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import other_shapes, size_probes, size_speed
from cuvil_pgc.recompile.candidates import Candidate

#: the real timer (conftest's programs_time_faster replaces it in every test)
TIMER = size_speed.timer


def _times(crossover: float, log: list[int] | None = None):
    """``timed(size)``: the original takes ``size`` seconds, the program 0.5 s plus half of it up to
    ``crossover`` and twice it beyond."""
    def timed(size: int) -> tuple[float, float]:
        if log is not None:
            log.append(size)
        return (0.5 + size / 2 if size <= crossover else 2.0 * size), float(size)
    return timed


def test_a_program_faster_all_the_way_is_timed_once_at_the_top():
    seen: list[int] = []
    assert size_speed.faster_up_to(32, 8192, _times(1e9, seen)) == (8192, None)
    assert seen == [8192]


def test_sizes_near_the_captured_one_are_not_timed():
    seen: list[int] = []
    assert size_speed.faster_up_to(32, 100, _times(0, seen)) == (100, None)      # below 4 x 32
    assert seen == []


def test_the_range_ends_near_where_the_program_turns_slower_and_says_why():
    seen: list[int] = []
    top, why = size_speed.faster_up_to(32, 8192, _times(3000, seen))
    assert 3000 * 7 / 8 <= top <= 3000
    assert why.startswith(f"its program ran slower than the original module above {top} (")
    assert seen[:4] == [8192, 128, 256, 512] and len(seen) < 14      # the top, doubling, then bisection


def test_a_program_slower_from_the_first_size_timed_keeps_the_sizes_below_it():
    assert size_speed.faster_up_to(8, 1000, _times(0))[0] == 31


def test_a_program_level_with_the_original_stays_and_one_slower_by_any_margin_does_not():
    assert size_speed.faster_up_to(8, 1000, lambda size: (float(size), float(size))) == (1000, None)
    assert size_speed.faster_up_to(8, 1000, lambda size: (size * 1.01, float(size)))[0] == 31


def test_the_timer_interleaves_the_two_and_takes_medians(monkeypatch):
    """With a clock each call advances (the program 2 s, the original 1 s), the timer reports
    what the calls took, each warmed before the samples."""
    now = [0.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    calls: list[str] = []

    def program(args):
        calls.append("p")
        now[0] += 2.0 * args[0]

    def original(args):
        calls.append("o")
        now[0] += 1.0 * args[0]
    timed = TIMER(program, original, lambda size: (size,), rounds=4)
    assert timed(3) == (6.0, 3.0)
    assert calls == ["p", "o", "p", "o", "o", "p", "p", "o", "o", "p"]


class Doubler(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def test_a_program_for_other_sizes_ends_its_range_where_it_times_slower(monkeypatch, caplog):
    """The build's programs are timed against the original beyond four times the captured size
    (here the fake timing turns slower above 100): the range ends there, and the build says why."""
    from cuvil_pgc.recompile.apply import ScopeInputs

    model, args = Doubler().eval(), (torch.ones(2, 16),)
    monkeypatch.setattr(other_shapes, "runtime_program", lambda *a, **k: (model, "first", [["b", "n"]], {}, {}))
    monkeypatch.setattr(size_speed, "timer", lambda program, original, args_at, rounds=5: _times(100))
    shapes = other_shapes.build_other_shapes(model, model, Candidate("", "ort"), ScopeInputs(args), key="k",
                                             rtol=None, atol=None)
    names = {name for spec in shapes.inputs for name in spec[1] if type(name) is str}
    assert len(names) == 2
    batch, length = sorted(hi for _, hi in shapes.ranges.values())
    assert batch == size_probes.MIN_CEILING and 100 * 7 / 8 <= length <= 100       # the batch stays faster
    assert any("its program ran slower than the original module above" in f for f in shapes.fixed)
    assert shapes.fits((torch.ones(2, length),)) and not shapes.fits((torch.ones(2, length + 1),))


transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("batches", [(1, 64), (3, 8)])
def test_a_step_outside_the_sizes_its_build_runs_goes_to_the_models_forward(caplog, batches):
    """Beyond the cache length (or outside the batches) its program runs, the region would open the
    cache, check and run the original module (6% slower than eager at 900 tokens): the step's
    forward runs the model's own forward at once, counts it and says so once."""
    from cuvil_pgc.recompile.cache_step import CacheStep, around_cache
    from cuvil_pgc.recompile.decoding_forward import decoding_forward
    from tests.test_cache_step import _positional, make, step_call

    model = make()
    layout = around_cache(model, _positional(model, step_call(model)))[2]
    step = CacheStep(model, layout)
    ran: list[int] = []

    class Region(nn.Module):        # a whole step's program: runs caches up to 12 tokens
        other_shapes = types.SimpleNamespace(
            inputs=[(torch.long, ("b", 1)), (torch.long, ("b", "past")), (torch.long, ("b", 1)), (torch.long, ("b", 1))]
            + [(torch.float32, ("b", 1, "past", 16))] * 2, ranges={"b": batches, "past": (1, 12)})

        def forward(self, *tensors):
            ran.append(tensors[-1].shape[-2])
            return step(*tensors)
    forward = decoding_forward(model, step, Region())
    ids = torch.randint(3, 60, (2, 8))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, pad_token_id=0)
    fast = model.__class__.__new__(model.__class__)
    fast.__dict__.update(model.__dict__)
    fast.forward = forward
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="cuvil_pgc.recompile.cache_step"):
        assert torch.equal(fast.generate(ids, **kw), model.generate(ids, **kw))
    # the prefill of 8, then steps with 8 ... 14 cached tokens: those up to 12 ran the region (none at a
    # batch of 2 where the program runs batches of 3 to 8)
    assert (ran, forward.outside_calls) == (([8, 9, 10, 11, 12], 2) if batches[0] == 1 else ([], 7))
    assert sum("runs the model's own forward" in r.getMessage() for r in caplog.records) == 1
    call, fresh = step_call(model), decoding_forward(model, step, Region())
    embeds = model.model.embed_tokens(call.pop("input_ids"))    # in place of the ids: the model's own forward
    with torch.no_grad():
        assert fresh(inputs_embeds=embeds, **call).logits.shape == (2, 1, 60) and fresh.outside_calls == 0


class LongInputs(Doubler):
    """Names how far its input's second dimension is checked (as a decoding step names its cache's
    length: up to the model's positions, or the longest cache its sliding window keeps whole)."""

    ceiling = 1000

    def size_ceilings(self, args):
        return {(0, 1): self.ceiling}


@pytest.mark.parametrize("ceiling", [1000, 20])
def test_a_dimension_the_module_names_is_checked_up_to_its_ceiling(monkeypatch, ceiling):
    from cuvil_pgc.recompile.apply import ScopeInputs

    checked: list[int] = []
    model, args = LongInputs().eval(), (torch.ones(2, 16),)
    model.ceiling = ceiling

    def runner(x):
        checked.append(x.shape[1])
        return model(x)
    monkeypatch.setattr(other_shapes, "runtime_program", lambda *a, **k: (runner, "first", [["b", "n"]], {}, {}))
    shapes = other_shapes.build_other_shapes(model, model, Candidate("", "ort"), ScopeInputs(args), key="k",
                                             rtol=None, atol=None)
    assert sorted(shapes.ranges.values()) == sorted([(1, size_probes.MIN_CEILING), (1, ceiling)])
    assert max(checked) == ceiling


def test_a_decoding_step_names_its_caches_length_up_to_the_models_positions():
    from cuvil_pgc.recompile.cache_step import LONGEST_CHECKED, around_cache
    from tests.test_cache_step import _positional, make, step_call

    model = make()                      # 128 positions
    step, inputs, _ = around_cache(model, _positional(model, step_call(model)))
    # ids, the mask's cached part and its new part, the position ids, then the cache's keys and values (batch,
    # heads, length, size)
    assert step.size_ceilings(inputs) == {(1, 1): 128, (4, 2): 128, (5, 2): 128}
    model.config.max_position_embeddings = 10 ** 6
    assert set(step.size_ceilings(inputs).values()) == {LONGEST_CHECKED}
