"""What the search measures next and when it stops (see :mod:`.search`).

- The budget: by default a quarter of the space, at least eager and the top-ranked candidate, one
  more when every candidate measured so far failed (:func:`budget_cap`).
- The stop rule: once a few measurements are in, a candidate is tried only while its prediction,
  made optimistic by how far off the predictions are on this model (:func:`prediction_spread`),
  beats the best measured of its scope by :data:`MIN_GAIN`.
- A batch: the cost models' favourite and, second, the best-ranked candidate of a backend not yet
  tried in the scope, else the best-ranked one-knob neighbour of the incumbent (:func:`batch_order`).
- CUDA graphs on a scope the profile calls launch-bound stay worth trying, whatever the prediction,
  until one is measured there (:func:`untried_remedy`).
- The time budget (``recompile --time-budget``): once it is spent no candidate's build begins; the
  one being built is finished (:class:`TimeBudget`).

Functions of the search's trials (anything with ``candidate``, ``status``, ``measured_us``,
``predicted_us`` and ``reused``), so each rule is tested on its own.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from cuvil_pgc.recompile.candidates import OVERHEAD_LABELS, Candidate, ScopeFeatures
from cuvil_pgc.recompile.measure import median

BATCH = 2
MIN_EXPLORE = 3      # measurements (new or from records) before the cost model may stop the search
MIN_GAIN = 0.02      # a candidate must be predicted this much faster than the best measured to be tried
#: the fewest measurements a default budget allows: eager and the top-ranked candidate (one more
#: when that one fails, see :func:`budget_cap`)
MIN_BUDGET = 2
#: a candidate's configuration knobs (its scope aside); a runtime's own options (``knobs``: ONNX
#: Runtime's optimization level, OpenVINO's hint, ...) count as one, so that ``ort+opt=basic`` is a
#: neighbour of ``ort``, not of ``openvino``
KNOBS = ("backend", "mode", "freezing", "cpp_wrapper", "rewrite", "channels_last", "precision", "knobs")

Ranked = list[tuple[Candidate, float]]

#: the clock a :class:`TimeBudget` reads (tests replace it)
clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class TimeBudget:
    """Wall-clock seconds a recompile may spend measuring candidates, counted from when it began
    (its analysis and the machine's calibration included). A runtime's baselines are measured
    whatever it says: they are what the build is raced against."""

    seconds: float
    start: float = field(default_factory=lambda: clock())

    @property
    def spent(self) -> bool:
        return clock() - self.start >= self.seconds

    def reason(self) -> str:
        """The reason given to the candidates left unmeasured."""
        return f"not measured: the search's time budget ({duration_text(self.seconds)}) was spent"

    def stopped_after(self, measured: int) -> str:
        """Why the search stopped, once it has (:attr:`~.trials.SearchResult.stopped`)."""
        return f"the search's time budget ({duration_text(self.seconds)}) is spent after {measured} measurement(s)"


def duration_text(seconds: float) -> str:
    """``250 s``, ``20 min``, ``2 h``: the largest unit that gives a whole number."""
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def default_budget(space_size: int, sizes_vary: bool = False) -> int:
    """A quarter of the space, at least :data:`MIN_BUDGET` measurements; half for a call whose
    sizes vary (a decoding step's, a prefill's, an encoder's: :attr:`~.trials.SearchOptions.sizes_vary`). Such a
    call's whole is its one scope (its layers change the cache they are given), its build runs once
    per token of every generation, and with a quarter of GPT-2's step's 17 candidates the search
    measured ONNX Runtime and AOTInductor at their defaults and never AOTInductor's max-autotune,
    whose step ran 1.55x faster than ONNX Runtime's (0.52 against 0.81 ms)."""
    return max(MIN_BUDGET, space_size // (2 if sizes_vary else 4))


def budget_cap(budget: int, stretchable: bool, trials: Iterable[Any]) -> int:
    """The most measurements now: ``budget``, one more when it is ``stretchable`` (a default
    budget) and every candidate measured so far failed to build or failed the accuracy guard (one
    failure must not leave eager as the only plan)."""
    if not stretchable:
        return budget
    tried = [t for t in trials if not t.candidate.is_baseline and t.status != "not_measured"]
    return budget + (bool(tried) and all(t.status in ("compile_error", "accuracy_error") for t in tried))


def batch_order(ranked: Ranked, best: Candidate | None, trials: Iterable[Any]) -> Ranked:
    """``ranked`` (one scope's candidates still worth trying, best predicted first) with what a
    batch measures after the models' favourite moved to second place: the best-ranked candidate of
    a backend no candidate of the scope was tried on yet (nor the favourite's), else the incumbent's
    neighbour (:func:`with_neighbour`).

    The models' learned corrections are kept per backend, so what the measured backends showed
    about a scope does not move an unmeasured backend's prediction: in the zoo MLP's search both
    runtimes at their defaults ran in 60 % of their predicted time, their option variants were then
    predicted from that and AOTInductor from its prior, so the budget went to ``ort+opt=basic`` and
    ``ort+opt=extended`` (within 5 % of ``ort``), and AOTInductor, whose max-autotune package ran in
    two thirds of the runtimes' time in the exhaustive search, was measured in one of four traced
    searches. One measurement per backend corrects that backend's predictions; options are mutated
    after."""
    if not ranked:
        return ranked
    favourite = ranked[0][0]
    tried = {"eager", favourite.backend} | {t.candidate.backend for t in trials
                                            if t.candidate.scope == favourite.scope and t.status != "not_measured"}
    fresh = next((item for item in ranked[1:] if item[0].backend not in tried), None)
    if fresh is None:
        return with_neighbour(ranked, best, trials)
    return _second(ranked, fresh)


def untried_remedy(cand: Candidate, feats: ScopeFeatures, trials: Iterable[Any]) -> bool:
    """Whether ``cand`` is CUDA graphs on a scope whose profile says launch-bound (an overhead
    label), and no CUDA graphs candidate of that scope was measured yet: the stop rule keeps it,
    whatever the cost models predict. A graph replay's prior is a guess until this GPU's records
    correct it: on an H200 the models predicted a launch-bound model's CUDA graphs 15 % slower
    than eager (0.733 against 0.637 ms), the stop rule never measured them, and torch.compile's
    CUDA graphs ran the model 2.31x faster than eager."""
    if cand.backend != "cudagraphs" or not feats.label_set & set(OVERHEAD_LABELS):
        return False
    return not any(t.candidate.scope == cand.scope and t.candidate.backend == "cudagraphs"
                   and t.status != "not_measured" for t in trials)


def with_neighbour(ranked: Ranked, best: Candidate | None, trials: Iterable[Any]) -> Ranked:
    """``ranked`` (one scope's candidates, best predicted first) with the best-ranked one-knob
    neighbour of ``best``, the scope's incumbent, moved to second place: a batch measures the cost
    models' favourite and a mutation of the best measured (TVM MetaSchedule's evolutionary search
    mutates its best too). The models cannot tell near-identical configurations apart
    (max-autotune or not, freezing or not) until both are measured, and their priors would
    otherwise always pick the same sibling. A neighbour that sets its knob to a value no measured
    candidate of the incumbent's backend in this scope has comes first (on the GRU tagger the
    priors mutated max-autotune packages into one another and never measured the default mode,
    whose plain package won the exhaustive search). A runtime's options are one knob (:data:`KNOBS`):
    ``ort+opt=basic`` is a neighbour of ``ort``, not of ``openvino``."""
    if best is None:
        return ranked
    neighbours = [item for item in ranked[1:] if _knobs_apart(item[0], best) == 1]
    if not neighbours:
        return ranked
    tried = [t.candidate for t in trials if t.candidate.scope == best.scope
             and t.candidate.backend == best.backend and t.status != "not_measured"]
    neighbour = next((item for item in neighbours if _new_knob_value(item[0], best, tried)), neighbours[0])
    return _second(ranked, neighbour)


def _second(ranked: Ranked, item: tuple[Candidate, float]) -> Ranked:
    """``ranked`` with ``item`` (one of ``ranked[1:]``) moved to second place."""
    return [ranked[0], item, *(other for other in ranked[1:] if other is not item)]


def prediction_spread(trials: Iterable[Any], predict_now: Callable[[Any], float]) -> float:
    """How far off the predictions are on this model: exp(median |log(measured / predicted)|)
    over its measured compiled candidates (1 before any): a new measurement against what was
    predicted before it was measured; a reused record against ``predict_now``, what the refitted
    models predict for it now (a record they cannot fit says as much as a new miss; its stored
    prediction, made before the refit, would say more). A candidate stays worth trying while its
    prediction, optimistic by that factor, beats the best measured: the less the refitted models
    can be trusted on this model, the more of the budget the search spends; a search whose
    predictions hold stops early."""
    errors = []
    for t in trials:
        if t.status != "ok" or t.candidate.backend == "eager" or not t.measured_us:
            continue
        predicted = predict_now(t) if t.reused else t.predicted_us
        if predicted and predicted > 0:
            errors.append(abs(math.log(t.measured_us / predicted)))
    return math.exp(median(errors)) if errors else 1.0


def _knobs_apart(a: Candidate, b: Candidate) -> int:
    """How many configuration knobs (backend, mode, freezing, ...) two candidates differ in."""
    return sum(getattr(a, k) != getattr(b, k) for k in KNOBS)


def _new_knob_value(cand: Candidate, best: Candidate, tried: list[Candidate]) -> bool:
    """Whether ``cand`` sets the knob it differs from ``best`` in to a value none of ``tried`` has."""
    knob = next(k for k in KNOBS if getattr(cand, k) != getattr(best, k))
    return all(getattr(t, knob) != getattr(cand, knob) for t in tried)
