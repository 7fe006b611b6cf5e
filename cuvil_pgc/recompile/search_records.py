"""The search's side of the record database: how a measurement becomes a :class:`~.records.Record`,
and how records come back as measurements to reuse and as samples for the cost models' refit.

A record's ``features`` hold the measured candidate, the scope's features as the op census counted
them (stamped with :data:`~.features.CENSUS_VERSION`) and the digest of the weights the accuracy
guard checked; the calibration probe's records (:mod:`.calibrate`) are marked ``probe`` instead,
and the backends' fixed costs are fitted from them alone (see :mod:`.cost_models`).

A candidate is recorded as :data:`~.records.STARTED` before its build begins, as
:data:`~.records.UNFINISHED` once it is built and checked (so a fault building the next one of its
batch is not blamed on it), started again while the batch is timed, and its own record follows.
A started one left by a process that ended rejects the candidate in the next search of the model,
which goes on instead of dying on it again. A fault while a batch is timed cannot be told to be
one candidate's rather than another's (the batch's new ones, or the incumbent timed beside them, which
an earlier batch timed without a fault): the next search times each alone, beside eager only
(:attr:`SearchRecords.suspects`), and leaves out the one that ends the process so. The incumbent's
own record is written again once the batch is timed.

The final race (:mod:`.plan`) rebuilds the chosen plans and times them side by side; it is marked
started too (:meth:`SearchRecords.race_started`). A fault there (a plan's rebuild or its runtime
while timed) cannot be told one plan's either: once a final race of the model ended its process,
its final races on this machine rebuild and time each plan apart, beside eager only, each marked
started (:meth:`SearchRecords.plan_started`), and a plan that ends the process so is left out of
the next (:meth:`SearchRecords.plan_ended`).
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cuvil_pgc.recompile.accuracy import GUARD_VERSION
from cuvil_pgc.recompile.apply import ScopeInputs, measurement_key
from cuvil_pgc.recompile.candidates import Candidate, ScopeFeatures
from cuvil_pgc.recompile.features import CENSUS_VERSION
from cuvil_pgc.recompile.records import STARTED, Journal, Record, RecordDB, ended_its_process

log = logging.getLogger(__name__)

#: the reason a later search gives for a candidate left :data:`~.records.STARTED` by a process that ended
ENDED_PROCESS = ("it ended the process of an earlier search of this model on this machine while it was built "
                 "or checked (a native fault of its runtime, or the process was killed); `cuvil-pgc cache "
                 "clear --kind records` forgets this, with the machine's other measurements")
#: the reason for a candidate left started while it was timed, the batch's one new candidate
ENDED_TIMING = ("it ended the process of an earlier search of this model on this machine while it was timed (a "
                "native fault of its runtime, or the process was killed); `cuvil-pgc cache clear --kind records` "
                "forgets this, with the machine's other measurements")
#: the reason for a plan left started while the final race rebuilt or timed it apart
ENDED_RACE = ("it ended the process of an earlier search of this model on this machine while the final race "
              "rebuilt or timed it (a native fault of its runtime, or the process was killed); `cuvil-pgc cache "
              "clear --kind records` forgets this, with the machine's other measurements")
#: the measurement key of the final race's marks (:meth:`SearchRecords.race_started`)
FINAL_RACE = "final-race"
#: the status of a final race's mark once the race (or a plan's part of it) is over
RACED = "raced"


@dataclass
class SearchRecords:
    """One search's view of the database: records are keyed by the scope's structure, the
    candidate's program, this machine and the scope's inputs. The dicts are the search's own, so
    scopes it adds later (pinned plans) are keyed too."""

    db: RecordDB
    machine: str
    structures: dict[str, str]           # scope -> structural hash
    settings: dict[str, str]             # scope -> settings digest (a record holds for these settings only)
    weights: dict[str, str]              # scope -> weights digest
    inputs: dict[str, ScopeInputs]       # scope -> captured inputs
    #: the candidates started and not yet recorded (:class:`~.records.Journal`)
    journal: Journal = field(init=False)

    #: candidates timed beside another new one when a process ended: each is timed alone next
    suspects: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.journal = Journal(self.db)

    def reusable(self, cand: Candidate) -> Record | None:
        """The record of ``cand`` this search may reuse instead of measuring it; None also for an
        accuracy verdict reached with other weights (it holds for the weights it was checked with)
        or by another version of the guard (:data:`~.accuracy.GUARD_VERSION`; a reduced-precision
        candidate's pass too), for garbage
        outputs (:attr:`~.accuracy.AccuracyResult.garbage`: a fault that may not recur) and for a
        candidate left unfinished or started by a running process. One left started by a process
        that ended comes back as a compile error: :data:`ENDED_PROCESS` (:meth:`.Journal.settled`)."""
        rec = self.db.lookup(*self._key(cand))
        timed = rec is not None and rec.features.get("stage") == "timing"
        if timed and not rec.features.get("alone") and ended_its_process(rec):     # which one ended it?
            self.suspects.add(cand.key)
            return None
        why = ENDED_TIMING if timed else ENDED_PROCESS
        rec = self.journal.settled(rec, why, f"cuvil-pgc: {cand.key} is left out: {why}",
                                   candidate=cand.to_json(), weights=self.weights[cand.scope])
        if rec is not None and rec.status == "accuracy_error" and (
                rec.features.get("weights") != self.weights[cand.scope]
                or rec.features.get("guard", 1) != GUARD_VERSION or rec.features.get("fault")):
            return None
        if rec is not None and rec.status == "ok" and cand.reduced \
                and rec.features.get("guard", 1) != GUARD_VERSION:      # passed a guard that may be laxer
            return None
        return rec

    def _key(self, cand: Candidate) -> tuple[str, str, str, str]:
        """The key of ``cand``'s record (:attr:`~.records.Record.key`)."""
        return (self._structure(cand.scope), measurement_key(cand), self.machine, self.inputs[cand.scope].signature)

    def _structure(self, scope: str) -> str:
        """The key records of ``scope`` are stored under: its structure and its settings (a record
        of the same module with another ``need_weights`` or ``eps`` measured another program)."""
        return f"{self.structures[scope]}|{self.settings[scope]}"

    def restamp(self, rec: Record, feats: ScopeFeatures) -> None:
        """Store a reused measurement again with today's census of its scope, so the refit, which
        leaves out records of an older census, learns from it again."""
        if rec.status == "ok" and rec.features.get("census") != CENSUS_VERSION:
            self.db.add(replace(rec, features={**rec.features, "scope": asdict(feats), "census": CENSUS_VERSION}))

    def add(self, trial: Any, feats: ScopeFeatures, eager_us: float | None) -> None:
        """Record a search trial (:class:`~.search.Trial`) of the scope ``feats`` describes."""
        cand, scope = trial.candidate, feats.scope
        self.journal.done(self._key(cand))
        self.db.add(Record(
            *self._key(cand), status=trial.status, median_us=trial.measured_us,
            eager_us=eager_us, predicted_us=trial.predicted_us, reason=trial.reason,
            features={"candidate": cand.to_json(), "scope": asdict(feats), "weights": self.weights[scope],
                      "census": CENSUS_VERSION, "guard": GUARD_VERSION, **({"fault": True} if trial.fault else {})}))

    def started(self, cand: Candidate) -> None:
        """Record that ``cand``'s build begins (:data:`~.records.STARTED`), before anything runs it."""
        self.journal.started(Record(*self._key(cand), status=STARTED, features={"candidate": cand.to_json()}))

    def leave(self, cand: Candidate | None = None) -> None:
        """Mark ``cand`` (None: every started candidate without its own record)
        :data:`~.records.UNFINISHED`: it was built and checked, or this process stops measuring it
        for a reason of its own (an interrupt, a hook), not a fault of the candidate."""
        self.journal.leave(self._key(cand) if cand is not None else None)

    def timing(self, cands: list[Candidate]) -> None:
        """Record that ``cands``, built and checked (or the incumbent, measured before), are timed
        now, side by side: a fault from here until their own records is one of theirs. The next search times each :attr:`suspects` alone,
        and one that ends the process so is left out (:data:`ENDED_TIMING`)."""
        for cand in cands:
            self.journal.started(Record(*self._key(cand), status=STARTED, features={
                "candidate": cand.to_json(), "stage": "timing", "alone": len(cands) == 1}))

    def races_apart(self) -> bool:
        """Whether the final race times each plan apart: a final race of this model on this machine
        ended its process (said here), or raced apart since because one did."""
        rec = self.db.lookup(*self._race_key())
        if rec is not None and ended_its_process(rec):
            log.warning("cuvil-pgc: a final race of this model on this machine ended its process; its plans are "
                        "rebuilt and timed apart, beside eager only, and one that ends the process is left out")
            return True
        return rec is not None and bool(rec.features.get("apart"))

    def race_started(self) -> None:
        """Record that the final race rebuilds and times its plans side by side now."""
        self.journal.started(Record(*self._race_key(), status=STARTED))

    def race_done(self, apart: bool) -> None:
        """The final race is over; ``apart``: it timed each plan apart, as the model's later races will."""
        self.journal.done(self._race_key())
        self.db.add(Record(*self._race_key(), status=RACED, features={"apart": apart}))

    def plan_ended(self, choices: dict[str, Candidate]) -> bool:
        """Whether the plan of ``choices`` ended the process of an earlier final race that timed it apart."""
        rec = self.db.lookup(*self._race_key(choices))
        return rec is not None and ended_its_process(rec)

    def plan_started(self, choices: dict[str, Candidate]) -> None:
        """Record that the final race rebuilds and times the plan of ``choices`` apart now."""
        self.journal.started(Record(*self._race_key(choices), status=STARTED))

    def plan_done(self, choices: dict[str, Candidate]) -> None:
        """The plan of ``choices`` was rebuilt and timed apart (or failed with an error of its own)."""
        self.journal.done(self._race_key(choices))
        self.db.add(Record(*self._race_key(choices), status=RACED))

    def _race_key(self, choices: dict[str, Candidate] | None = None) -> tuple[str, str, str, str]:
        """The key of the final race's mark, or of one plan's part of a race run apart."""
        name = FINAL_RACE if choices is None else f"{FINAL_RACE}:{','.join(sorted(c.key for c in choices.values()))}"
        return (self._structure(""), name, self.machine, self.inputs[""].signature)

    def refit_samples(self) -> list[tuple[Candidate, ScopeFeatures, float]]:
        """Refit samples from every measurement recorded on this machine."""
        samples = (refit_sample(r) for r in self.db.for_machine(self.machine) if r.status == "ok")
        return [s for s in samples if s is not None]


def probe_features(cand: Candidate, feats: ScopeFeatures) -> dict[str, Any]:
    """The ``features`` of a calibration probe's record (:func:`refit_sample` reads the mark)."""
    return {"candidate": cand.to_json(), "scope": asdict(feats), "probe": True}


def refit_sample(record: Record) -> tuple[Candidate, ScopeFeatures, float] | None:
    """A refit sample from a record; None for a record whose features an older census counted. The
    calibration probe's records are marked with ``evidence["probe"]``: the backends' fixed costs are
    fitted from them."""
    probe = bool(record.features.get("probe"))
    if record.features.get("census") != CENSUS_VERSION and not probe:
        return None
    try:
        cand = Candidate.from_json(record.features["candidate"])
        feats = ScopeFeatures(**record.features["scope"])
    except (KeyError, TypeError, ValueError):   # ValueError: a backend or precision this version does not know
        return None
    if not record.median_us or not record.eager_us:
        return None
    if probe:
        feats.evidence = {**feats.evidence, "probe": True}
    return cand, feats, record.median_us / record.eager_us * feats.eager_us
