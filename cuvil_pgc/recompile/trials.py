"""What a search produces: its options, a :class:`Trial` per candidate, the :class:`SearchResult`
(see :mod:`.search`, which fills them, and :mod:`.plan`, which chooses from them)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cuvil_pgc.recompile.apply import ScopeInputs
from cuvil_pgc.recompile.candidates import Candidate, ScopeFeatures
from cuvil_pgc.recompile.matching import MatchResult
from cuvil_pgc.recompile.realized import Realized

if TYPE_CHECKING:
    from cuvil_pgc.recompile.search_policy import TimeBudget


@dataclass
class SearchOptions:
    budget: int | None = None
    exhaustive: bool = False
    rtol: float | None = None
    atol: float | None = None
    device: str = "cpu"
    rounds: int = 25
    max_subscopes: int = 3
    use_records: bool = True
    backends: tuple[str, ...] | None = None     # restrict the plan space (None: all of BACKENDS)
    fixed: dict[str, Candidate] | None = None   # a pinned plan: skip the search, build and time this
    #: decide between whole-model plans again in processes of their own, as deployed (.standalone)
    deployed_race: bool = True
    #: the MODULE:FACTORY the model came from: that race then runs eager too (see build.recompile)
    model_ref: str | None = None
    #: the call's sizes change from call to call (a decoding step's cache, a prefill's prompt, an
    #: encoder's source: :class:`~cuvil_pgc._example_inputs.SizesVary`): a
    #: candidate whose region runs only its captured sizes is not built (see search_rejections)
    sizes_vary: bool = False
    #: once spent, no candidate's build begins (see search_policy)
    time_budget: TimeBudget | None = None
    #: modules kept eager, with no scope of their own: their calls change the model's buffers (see
    #: stateless.HeldState; "" the whole model)
    eager_scopes: frozenset[str] = frozenset()


@dataclass
class Trial:
    candidate: Candidate
    predicted_us: float
    status: str = "not_measured"        # ok | compile_error | accuracy_error | not_measured
    measured_us: float | None = None    # per forward of the model
    reason: str = ""
    reused: bool = False
    ratio: float | None = None          # time / the scope's eager time (via the incumbent of its run)
    fault: bool = False                 # rejected for garbage outputs (accuracy.garbage): not reused from records

    def to_json(self) -> dict[str, Any]:
        return {"config": self.candidate.config, "scope": self.candidate.scope,
                "predicted_ms": _ms(self.predicted_us), "measured_ms": _ms(self.measured_us),
                "status": self.status, "reason": self.reason, "reused_record": self.reused}


@dataclass
class SearchResult:
    trials: dict[str, Trial]
    features: dict[str, ScopeFeatures]
    matches: MatchResult
    scope_inputs: dict[str, ScopeInputs]
    choices: dict[str, Candidate] = field(default_factory=dict)
    structures: dict[str, str] = field(default_factory=dict)
    weights: dict[str, str] = field(default_factory=dict)       # scope -> weights_digest
    settings: dict[str, str] = field(default_factory=dict)      # scope -> settings_digest
    #: scope -> the attributes its digest leaves out (a call's scratch values, see _structure.recorded_writes)
    settings_skip: dict[str, list[str]] = field(default_factory=dict)
    measured: int = 0
    reused: int = 0
    space_size: int = 0
    baseline_us: float = math.nan
    plan_us: float = math.nan
    machine: str = ""
    realized: dict[str, Realized] = field(default_factory=dict)
    module: Any = None
    final_medians_us: dict[str, float] = field(default_factory=dict)
    #: the whole-model plans raced in processes of their own (empty: no such race)
    deployed_medians_us: dict[str, float] = field(default_factory=dict)
    #: the whole model on each runtime at its defaults: baselines measured outside the budget
    runtime_defaults: list[Trial] = field(default_factory=list)
    baselines_measured: int = 0
    #: plans that won a race but did not ship: why a fresh process could not load and run them
    unloadable: dict[str, str] = field(default_factory=dict)
    #: why the search stopped before its budget of measurements ("": it did not)
    stopped: str = ""

    @property
    def speedup(self) -> float:
        return self.baseline_us / self.plan_us if self.plan_us > 0 else math.nan


def _ms(us: float | None) -> float | None:
    return None if us is None or math.isnan(us) else round(us / 1e3, 6)
