"""Progress on long work: recompile's stages and candidates, the live display, --quiet."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from cuvil_pgc.viewer.progress import search_progress


class Recorder:
    """A progress listener: what a display would show."""

    def __init__(self) -> None:
        self.stages: list[str] = []
        self.updates: list[tuple[int, int, str]] = []

    def stage(self, name: str) -> None:
        self.stages.append(name)

    def __call__(self, done: int, total: int, message: str) -> None:
        self.updates.append((done, total, message))


def _faked_search(monkeypatch, progress, budget: int) -> None:
    """A search of the test chain model reporting to ``progress``, with building and timing faked
    at their seams: every candidate twice as fast as eager."""
    import cuvil_pgc.recompile.search as search_mod
    from cuvil_pgc.recompile.measure import Samples
    from cuvil_pgc.recompile.realized import Realized
    from cuvil_pgc.recompile.search import search
    from cuvil_pgc.recompile.trials import SearchOptions
    from tests.test_recompile import Analysis, chain, stats

    def fake_time(fns, rounds):
        return {k: Samples(k, [1e-3 if k == "eager" else 5e-4]) for k in fns}

    monkeypatch.setattr("cuvil_pgc.recompile.checked_build.realize", lambda module, cand, inputs, **kw: Realized(module))
    monkeypatch.setattr(search_mod, "time_interleaved", fake_time)
    model, inputs = chain()
    # (labeled compute: its space has three torch.compile candidates, enough for the batches below)
    search(model, inputs, Analysis(regions=[stats("model", "compute", module="Chain")]),
           machine_key="m", progress=progress, options=SearchOptions(budget=budget, backends=("compile",), rounds=5,
                                                                                 deployed_race=False))


@pytest.mark.slow
def test_search_reports_stages_candidates_and_the_incumbents_speedup(monkeypatch):
    progress = Recorder()
    _faked_search(monkeypatch, progress, budget=4)
    assert progress.stages == ["searching", "racing the plan against eager"]
    building = [m for _, _, m in progress.updates if "building" in m]
    assert building and building[0].startswith("candidate 2 of 4: building ")   # 1 is eager
    assert any(m.startswith("model: best ") and m.endswith("2.00x") for _, _, m in progress.updates)
    assert all(done <= total for done, total, _ in progress.updates)


class KeepsBest(Recorder):
    """A listener with a field for the incumbent's speedup, as the CLI's display has."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[tuple[str, str]] = []

    def best(self, text: str) -> None:
        self.events.append(("best", text))

    def __call__(self, done: int, total: int, message: str) -> None:
        super().__call__(done, total, message)
        self.events.append(("message", message))


@pytest.mark.slow
def test_the_incumbents_speedup_stays_in_view_while_a_candidate_builds(monkeypatch):
    progress = KeepsBest()
    _faked_search(monkeypatch, progress, budget=6)
    kinds = [kind for kind, _ in progress.events]
    assert "best" in kinds
    first_best = kinds.index("best")
    assert progress.events[first_best][1].startswith("model: best ") and progress.events[first_best][1].endswith("2.00x")
    # a later candidate builds with the best still shown: its message does not replace it
    assert any(kind == "message" and "building" in text for kind, text in progress.events[first_best:])
    assert not any(text.startswith("model: best") for _, _, text in progress.updates)


def test_display_shows_the_best_beside_the_building_candidate():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160, color_system=None)
    with search_progress(console=console) as display:
        display.stage("searching")
        display.best("model: best compile 2.92x")
        display(3, 8, "candidate 4 of 8: building aoti")
        display._progress.refresh()
    text = out.getvalue()
    assert "candidate 4 of 8: building aoti · model: best compile 2.92x" in text


def test_display_shows_stage_step_and_message_on_a_terminal():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    with search_progress(console=console) as display:
        assert display is not None
        display.stage("searching")
        display(3, 10, "candidate 4 of 10: building compile+cpp_wrapper")
        console.file.flush()
        display._progress.refresh()
    text = out.getvalue()
    assert "searching" in text and "3/10" in text and "compile+cpp_wrapper" in text and "eta" in text


def test_display_is_off_when_piped_or_quiet():
    piped = Console(file=io.StringIO())
    with search_progress(console=piped) as display:
        assert display is None
    terminal = Console(file=io.StringIO(), force_terminal=True)
    with search_progress(console=terminal, quiet=True) as display:
        assert display is None


def test_profile_model_reports_iterations(tmp_path):
    from cuvil_pgc.instrument import runner as _runner
    from cuvil_pgc.instrument.factory import profile

    progress = Recorder()
    session = profile(str(tmp_path / "m.trace.json"), ops=False, gpu="off", sample_hz=0)
    _runner.run_model(session, "cuvil_pgc.zoo:mlp", iters=3, warmup=1, depth=1, progress=progress)
    assert progress.stages == ["loading the model", "warming up", "recording"]
    assert progress.updates[-1] == (3, 3, "iteration 3 of 3")
