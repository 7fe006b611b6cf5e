"""Profile-guided plan search: rank candidates with the cost models, measure the best few.

Contract of :func:`search`: it never crashes on a bad candidate. A candidate that fails to
compile or export, or raises at a later call while it is timed, is rejected as ``compile_error``,
one whose outputs differ from eager beyond
the tolerances as ``accuracy_error``, each with its reason; once an exporter (torch.export,
torch.onnx.export, openvino.convert_model, torch_tensorrt.compile) fails on a scope's module, the
scope's other candidates through that exporter (AOTInductor; ONNX Runtime and OpenVINO; ...) are
rejected with that reason without being built or counted against the budget; so are the
candidates differing only in knobs that schedule the work (threads, spinning, the performance
hint: :data:`~.candidates.SCHEDULING_KNOBS`) from one that failed the accuracy guard by 10x its
tolerance or more (:attr:`~.accuracy.AccuracyResult.decisive`), which leaves the budget to a rewrite,
another precision or backend that may pass. Measurements are interleaved with the scope's eager module and with
the fastest candidate of the scope measured so far, the incumbent (same inputs, balanced orders,
medians; see :mod:`.measure`). A candidate's ratio to eager is its ratio to the incumbent of its
own run times the incumbent's ratio (to eager, in the first run), and it is expressed against the
median of all of that scope's eager runs: a challenger is compared with the best so far side by
side, never through eager runs minutes apart. Every measurement goes to
the record database; candidates already recorded for this module structure, machine and inputs
are reused instead of measured (also those this search just measured on a repeated block:
``layers.1`` reuses ``layers.0``'s, except in an exhaustive search), and the cost models are
refitted from all of this machine's records before each batch (on the CPU, the machine's cost per
prepacked GEMM call and its convolution kernel ratios are measured once per process for the cost
models); once a few measurements are in, only candidates predicted to beat the best measured time
of their scope by 2 % are tried, their predictions made optimistic by the spread of this search's
prediction errors so far, and a batch pairs the models' favourite with the best-ranked candidate
of a backend not yet tried in the scope, else with the best-ranked one-knob neighbour of the scope's
incumbent (those rules: :mod:`.search_policy`). Before all that, the whole
model on each runtime backend usable here at its defaults (ONNX Runtime, OpenVINO) is measured as a
baseline, whatever the budget: what a user would deploy instead is always known and in the race.
These baselines are counted apart (``SearchResult.baselines_measured``, the plan's
``runtime_defaults``), not against the budget; a runtime left out of the space is logged with the
reason. ``budget`` caps the other measurements, eager references, the
composite plan and the records of earlier searches reused at the start included, so a second
search of the same model measures only what the first one left (default: a quarter of the space,
half for a decoding call's, at least 2, one more when every candidate measured failed; the
composite goes beyond it only when it is the one plan that beat eager); a decoding call's
candidates whose regions run only their captured sizes (torch.compile's, CUDA graphs') are not
built;
``exhaustive=True`` measures everything (for comparison benchmarks).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from cuvil_pgc._progress import Progress, show_best, stage
from cuvil_pgc._structure import recorded_writes, settings_digest, weights_digest, written_under
from cuvil_pgc.errors import RecompileError
from cuvil_pgc.recompile._stderr import exception_line
from cuvil_pgc.recompile.accuracy import blind_scale, float32_references, low_precision_left_out
from cuvil_pgc.recompile.apply import LOW_PRECISION_DTYPES, capture_scope_inputs
from cuvil_pgc.recompile.call_binding import payload_input
from cuvil_pgc.recompile.candidates import (
    Candidate,
    ScopeFeatures,
    choose_scopes,
    generate_space,
    is_runtime_default,
)
from cuvil_pgc.recompile.checked_build import build_checked
from cuvil_pgc.recompile.cost_models import MachineFigures, PlanCostModel
from cuvil_pgc.recompile.export_error import ExportError
from cuvil_pgc.recompile.features import add_rnn_time, root_labels, scope_features
from cuvil_pgc.recompile.matching import MatchResult, match_regions, structural_hash
from cuvil_pgc.recompile.measure import median, time_interleaved, time_surviving
from cuvil_pgc.recompile.padding import padding_of
from cuvil_pgc.recompile.profiler_modules import module_call_names, numbered_regions
from cuvil_pgc.recompile.records import RecordDB
from cuvil_pgc.recompile.region_hooks import ONE_OF_ITS_OWN, ORIGINAL, hook_reason, hooked_inside
from cuvil_pgc.recompile.search_policy import (
    BATCH,
    MIN_EXPLORE,
    MIN_GAIN,
    batch_order,
    budget_cap,
    default_budget,
    prediction_spread,
    untried_remedy,
)
from cuvil_pgc.recompile.search_records import SearchRecords
from cuvil_pgc.recompile.search_rejections import Rejections
from cuvil_pgc.recompile.trials import SearchOptions, SearchResult, Trial

if TYPE_CHECKING:
    from cuvil_pgc.analyze.analysis import Analysis

log = logging.getLogger(__name__)


class _Search:
    def __init__(self, model: Any, example_inputs: tuple[Any, ...], analysis: Analysis | None, options: SearchOptions,
                 records: RecordDB | None, machine_key: str, progress: Progress | None) -> None:
        self.model, self.inputs, self.analysis, self.opt = model, example_inputs, analysis, options
        self.db = records if options.use_records else None
        self.records: SearchRecords | None = None    # the database keyed for this model, once prepared
        self.machine_key, self.progress = machine_key, progress
        self.cost = PlanCostModel(MachineFigures.of_this_machine(getattr(analysis, "machine", {}) or {},
                                                                 options.device))
        self.modules = dict(model.named_modules())
        self.trials: dict[str, Trial] = {}
        self.eager_runs: dict[str, list[float]] = {}   # scope -> eager medians (µs per call), one per run
        self.incumbents: dict[str, tuple[str, Callable[[], Any]]] = {}   # scope -> (trial key, built callable)
        self.left_out: list[tuple[Candidate, str]] = []   # candidates the guard cannot pass, with the reason
        self.rejections = Rejections(sizes_vary=options.sizes_vary)   # what this search showed would fail
        self.measured = self.reused = 0
        self.baselines_measured = 0          # runtime defaults measured outside the budget
        self.runtime_defaults: list[Candidate] = []
        self.stopped_by_time = False          # the time budget was found spent: no build began after

    # ------------------------------------------------------------------ preparation
    def prepare(self) -> list[Candidate]:
        self.matches = match_regions(self.analysis, self.model, self._call_names()) if self.analysis is not None \
            else MatchResult()
        if (foreign := self.matches.foreign_profile()) is not None:
            warnings.warn(foreign, RuntimeWarning, stacklevel=2)
        by_q = self.matches.by_qualname()
        subs = [q for q in by_q if q and q in self.modules]
        with recorded_writes(self.model) as written:     # a call's scratch values on its modules: no settings
            self.scope_inputs = capture_scope_inputs(self.model, self.inputs, subs)
        self.written = frozenset(written)
        with torch.no_grad():
            self.refs = {s: self._module(s)(*i.args, **i.kwargs) for s, i in self.scope_inputs.items()}
        #: the positions the call's attention mask marks as padding: the guard leaves them out
        self.padding = padding_of(self.model, self.inputs)
        if self.padding is not None:
            log.info("cuvil-pgc: the accuracy guard leaves out the outputs at %s", self.padding.describe())
        #: per scope of a model computing in bf16/fp16, its outputs in float32 (see accuracy)
        self.exact = float32_references(self.model, self.scope_inputs, self.refs)
        #: per scope, the largest floating output where the guard cannot see its outputs (None: it can)
        self.blind = {s: blind_scale(ref, rtol=self.opt.rtol, atol=self.opt.atol) for s, ref in self.refs.items()}
        if (blind := self.blind[""]) is not None:
            log.warning("cuvil-pgc: the accuracy guard cannot see this model's outputs: every floating value lies "
                        "within its atol of 0 (the largest is %.2g), so any program would pass it; reduced precision "
                        "is left out, and --atol below the outputs' scale lets the guard compare them", blind)
        root_us = self._time_root_eager()
        root_match = by_q.get("")
        root_calls = float(root_match.stats.calls) if root_match else 1.0
        profiled_root = root_match.stats.total_us / root_calls if root_match else 0.0
        scale = root_us / profiled_root if profiled_root > 0 else 1.0
        feats = {s: scope_features(s, self._module(s), self.scope_inputs[s], by_q.get(s), self.analysis,
                                   root_calls, scale) for s in self.scope_inputs}
        root = feats[""]
        root.eager_us, root.calls = root_us, 1.0
        root.labels = root_labels(self.analysis, self.matches.matched)
        kept = self.opt.eager_scopes
        chosen = choose_scopes(root, [f for s, f in feats.items() if s and f.eager_us > 0 and s not in kept],
                               self.opt.max_subscopes)
        if "" in kept and len(chosen) == 1:
            log.warning("cuvil-pgc: the model stays eager, and %s: the build runs it as it is",
                        "no submodule that leaves its buffers alone takes enough of its profiled time to be "
                        "searched" if subs else
                        "without a profile no submodule is searched (cuvil-pgc profile times each one)")
        self.features = {f.scope: f for f in chosen}
        add_rnn_time(self.features, feats, self.modules)
        self.structures = {s: structural_hash(self._module(s)) for s in self.features}
        self.weights = {s: weights_digest(self._module(s)) for s in self.features}
        self.settings_skip = {s: written_under(self.written, s) for s in self.features}
        self.settings = {s: settings_digest(self._module(s), self.settings_skip[s]) for s in self.features}
        if self.db is not None:
            self.records = SearchRecords(self.db, self.machine_key, self.structures, self.settings, self.weights,
                                         self.scope_inputs)
        space = [c for c in generate_space(chosen, self.opt.device, self.opt.backends)
                 if c.is_baseline or c.scope not in kept]
        why = {c.key: low_precision_left_out(self.refs[c.scope], c.precision, LOW_PRECISION_DTYPES[c.precision],
                                             c.backend, self.blind[c.scope], rtol=self.opt.rtol, atol=self.opt.atol)
               for c in space if c.reduced}
        self.left_out = [(c, why[c.key]) for c in space if why.get(c.key)]
        return [c for c in space if not why.get(c.key)]

    def _call_names(self) -> dict[str, str] | None:
        """torch.profiler's names of the model's module calls, where the profile has such regions."""
        if not numbered_regions([r.path for r in self.analysis.regions]):
            return None
        return module_call_names(self.model, self.inputs)

    def _module(self, scope: str) -> Any:
        return self.modules[scope] if scope else self.model

    def _time_root_eager(self) -> float:
        args = self.scope_inputs[""].args
        with torch.no_grad():
            samples = time_interleaved({"eager": lambda: self.model(*args)}, rounds=self.opt.rounds)
        self.eager_runs[""] = [samples["eager"].median_s * 1e6]
        return self.eager_runs[""][0]

    # ------------------------------------------------------------------ exploration
    def explore(self, space: list[Candidate]) -> None:
        self.space = space
        for cand in space:
            if cand.is_baseline:
                self._eager_trial(cand)
        pending = [c for c in space if c.key not in self.trials]
        pending = self._reuse_records(pending)
        # records of earlier searches of this model count against the budget: what a search
        # already knows it does not pay for again, so a second search measures only what is left
        self.budget = 10**9 if self.opt.exhaustive else (self.opt.budget or default_budget(len(space), self.opt.sizes_vary)) - self.reused
        total = min(self.budget, len(pending) + self.measured)   # for the progress bar
        self._total = total
        stage(self.progress, "searching")
        pending = self._measure_runtime_defaults(pending)
        while pending and self.measured < self._cap() and not self._out_of_time():
            self._refit()
            ranked = self.cost.rank(pending, self.features)
            if not self.opt.exhaustive and self.measured + self.reused >= MIN_EXPLORE:
                spread = self._prediction_spread()
                ranked = [(c, p) for c, p in ranked if p / spread < self._best_in_scope(c.scope) * (1 - MIN_GAIN)
                          or untried_remedy(c, self.features[c.scope], self.trials.values())]
                if not ranked:
                    break    # nothing left is predicted to beat what was measured
            scope = ranked[0][0].scope
            room = self._cap() - self.measured - (scope not in self.eager_runs)   # the scope's eager reference
            if room < 1:
                pending = [c for c in pending if c.scope != scope]
                continue
            incumbent = self.incumbents.get(scope)
            best = self.trials[incumbent[0]].candidate if incumbent else None
            batch = batch_order([(c, p) for c, p in ranked if c.scope == scope], best,
                                self.trials.values())[:min(BATCH, room)]
            self._measure_batch(scope, batch)
            pending = [c for c in pending if c.key not in self.trials and not self._rejected_unbuilt(c)]
            if not self.opt.exhaustive:   # a scope of the same structure and inputs (layers.1 after
                pending = self._reuse_records(pending)   # layers.0) reuses these now
            if self.progress:
                done, line = min(self.measured, total), self._incumbent_line(scope)
                if show_best(self.progress, line):   # shown beside the next "building ..." message
                    line = f"{done} of {total} candidates measured"
                self.progress(done, total, line)
        unmeasured = (self.opt.time_budget.reason() if self.stopped_by_time
                      else "ranked below the measured candidates (budget)")
        for cand in pending:
            self.trials[cand.key] = Trial(cand, self.cost.predict(cand, self.features[cand.scope]),
                                          reason=unmeasured)
        for cand, reason in self.left_out:
            self.trials[cand.key] = Trial(cand, self.cost.predict(cand, self.features[cand.scope]), reason=reason)

    def _incumbent_line(self, scope: str) -> str:
        """``layer1: best aoti 1.84x`` (the scope's incumbent, measured against its eager run)."""
        label = scope or "model"
        incumbent = self.incumbents.get(scope)
        trial = self.trials.get(incumbent[0]) if incumbent else None
        if trial is None or not trial.ratio:
            return f"{label}: nothing beats eager yet"
        return f"{label}: best {trial.candidate.key} {1 / trial.ratio:.2f}x"

    def _measure_runtime_defaults(self, pending: list[Candidate]) -> list[Candidate]:
        """Measure the whole model on each runtime at its defaults first, whatever the cost models
        predict and whatever the budget: that is what a user would deploy instead of a build, so
        the search always knows it (and the final race can pick it) before spending the budget on
        beating it. They are baselines, counted apart from the budget (an exhaustive search counts
        them as candidates); returns what is still pending."""
        self.runtime_defaults = [c for c in self.space if is_runtime_default(c)]
        self._log_missing_runtime_defaults()
        todo = {c.key for c in self.runtime_defaults} & {c.key for c in pending}
        if not todo:
            return pending
        before = self.measured
        self._measure_batch("", [(c, self.cost.predict(c, self.features[""])) for c in pending if c.key in todo])
        if not self.opt.exhaustive:
            self.baselines_measured += self.measured - before
            self.measured = before
        return [c for c in pending if c.key not in todo and not self._rejected_unbuilt(c)]

    def _log_missing_runtime_defaults(self) -> None:
        """Say which runtime baselines the race will lack, and why (not installed, restricted away)."""
        from cuvil_pgc.recompile import runtimes

        have = {c.backend for c in self.runtime_defaults}
        for backend in ("ort", "openvino"):
            if backend in have:
                continue
            status = runtimes.check(backend, self.opt.device)
            why = (f"restricted away by backends={self.opt.backends}" if status.ok else status.reason)
            log.info("cuvil-pgc: %s at its defaults is not measured as a baseline: %s",
                     runtimes.RUNTIMES[backend].title, why)

    def _out_of_time(self) -> bool:
        """Whether the time budget is spent (it is said once, when it first is)."""
        spent = self.opt.time_budget is not None and self.opt.time_budget.spent
        if spent and not self.stopped_by_time:
            self.stopped_by_time = True
            log.warning("cuvil-pgc: %s: the plan is chosen from what was measured", self.stop_reason())
        return spent

    def stop_reason(self) -> str:
        """Why the search stopped early ("" when it did not)."""
        return self.opt.time_budget.stopped_after(self.measured) if self.stopped_by_time else ""

    def _cap(self) -> int:
        """The most measurements now (:func:`~.search_policy.budget_cap`; a budget the user set is
        never stretched)."""
        stretchable = self.opt.budget is None and not self.opt.exhaustive
        return budget_cap(self.budget, stretchable, self.trials.values())

    def _prediction_spread(self) -> float:
        """:func:`~.search_policy.prediction_spread` of this search's trials."""
        return prediction_spread(self.trials.values(),
                                 lambda t: self.cost.predict(t.candidate, self.features[t.candidate.scope]))

    def _best_in_scope(self, scope: str) -> float:
        times = [t.measured_us for t in self.trials.values()
                 if t.candidate.scope == scope and t.status == "ok" and t.measured_us is not None]
        return min([self.features[scope].eager_us, *times])

    def _eager_trial(self, cand: Candidate) -> None:
        feats = self.features[cand.scope]
        measured = feats.eager_us if cand.scope == "" else None
        self.trials[cand.key] = Trial(cand, feats.eager_us, "ok" if measured else "not_measured", measured)
        if measured:
            self.measured += 1

    def _reuse_records(self, pending: list[Candidate]) -> list[Candidate]:
        if self.records is None:
            return pending
        left = []
        for cand in pending:
            rec = self.records.reusable(cand)
            if rec is None:
                left.append(cand)
                continue
            if rec.status == "compile_error" and rec.reason.startswith(ExportError.__name__):
                self.rejections.export_failed(cand, rec.reason)
            feats = self.features[cand.scope]
            self.records.restamp(rec, feats)
            ratio = rec.median_us / rec.eager_us if rec.status == "ok" and rec.eager_us and rec.median_us else None
            self.trials[cand.key] = Trial(cand, self.cost.predict(cand, feats), rec.status,
                                          ratio * feats.eager_us if ratio else None, rec.reason, reused=True,
                                          ratio=ratio)
            self.reused += 1
        return left

    def _refit(self) -> None:
        """Refit the cost models on this machine's records, which hold this search's trials too
        (:meth:`_record`); without a record database, on this search's trials."""
        if self.records is not None:
            samples = self.records.refit_samples()
        else:
            samples = [(t.candidate, self.features[t.candidate.scope], t.measured_us) for t in self.trials.values()
                       if t.status == "ok" and t.measured_us and not t.reused and t.candidate.backend != "eager"]
        if samples:
            self.cost.refit(samples)

    def _measure_batch(self, scope: str, batch: list[tuple[Candidate, float]]) -> None:
        """Build, check and time ``batch``, each candidate recorded as started until it is built and
        checked, and again while the batch is timed (:meth:`.SearchRecords.started`,
        :meth:`.SearchRecords.timing`): a native fault that ends this process meanwhile leaves that
        record, and the next search rejects the candidate instead of dying on it again. A candidate
        timed beside another when a process ended (:attr:`.SearchRecords.suspects`) is timed alone,
        beside eager only, so that a fault now is its own."""
        suspects = self.records.suspects if self.records is not None else set()
        try:
            for item in batch:
                if item[0].key in suspects:
                    self._build_and_time(scope, [item], alone=True)
            if rest := [item for item in batch if item[0].key not in suspects]:
                self._build_and_time(scope, rest)
        except BaseException:      # an interrupt or an error of the search: no fault of the candidates
            if self.records is not None:
                self.records.leave()
            raise

    def _build_and_time(self, scope: str, batch: list[tuple[Candidate, float]], alone: bool = False) -> None:
        module, inputs, feats = self._module(scope), self.scope_inputs[scope], self.features[scope]
        if scope not in self.rejections.runs_original and (hooked := hooked_inside(module)) is not None:
            self.rejections.original_runs(scope, f"the build runs the original module here: {hook_reason(hooked)}")
            log.warning("cuvil-pgc: %s gets no program: %s; remove the hook before recompile for a build of it "
                        "(a hook on a module outside it leaves it on its program%s)", scope or "<model>",
                        hook_reason(hooked), ONE_OF_ITS_OWN if hooked == ORIGINAL else "")
        if scope not in self.rejections.runs_original and (payload := payload_input(inputs.args, inputs.kwargs)):
            self.rejections.original_runs(scope, f"the build runs the original module here: the region takes {payload}, "
                                          "a request's data in Python values, which a program would hold as constants "
                                          "and answer for the captured request alone")
            log.warning("cuvil-pgc: %s gets no program: it takes %s, which a program would hold as constants "
                        "(pass it as tensors for a program of it; the modules it calls with tensors get theirs)",
                        scope or "<model>", payload)
        torch._dynamo.reset()     # earlier batches' graphs are garbage; keep the recompile limit free
        contenders: dict[str, Callable[[], Any]] = {"eager": lambda: module(*inputs.args, **inputs.kwargs)}
        for cand, predicted in batch:
            if self._rejected_unbuilt(cand):
                continue
            if not is_runtime_default(cand) and self._out_of_time():
                break     # the candidates not built stay pending
            trial = Trial(cand, predicted)
            self.trials[cand.key] = trial
            self.measured += 1
            if self.progress:
                total = max(getattr(self, "_total", 0), self.measured)
                self.progress(self.measured - 1, total, f"candidate {self.measured} of {total}: building {cand.key}")
            if self.records is not None:
                self.records.started(cand)
            built = build_checked(cand, module, inputs, self.refs[scope], self.opt, exact=self.exact.get(scope),
                                  padding=self.padding, machine=self.machine_key, weights=self.weights[scope])
            if built.call is not None:
                contenders[cand.key] = built.call
            else:
                trial.status, trial.reason, trial.fault = built.status, built.reason, built.fault
                self.rejections.learn(cand, built)
                if built.status != "runs_original":     # a state of this process (a hook), not the candidate's
                    self._record(trial, scope, None)
            if self.records is not None:      # built and checked, to be timed; or a state of this process (a hook)
                self.records.leave(cand)
        if len(contenders) == 1:
            return
        new = [key for key in contenders if key != "eager"]
        incumbent = None if alone else self.incumbents.get(scope)
        if self.records is not None:      # a fault from here on is one of these candidates', the incumbent's too
            self.records.timing([self.trials[key].candidate for key in [*new, *([incumbent[0]] if incumbent else [])]])
        if incumbent is not None and (incumbent := self._warm_incumbent(scope)) is not None:
            contenders[incumbent[0]] = incumbent[1]
        with torch.no_grad():
            samples, failed = time_surviving(contenders, timer=time_interleaved, rounds=self.opt.rounds)
        for key, why in failed.items():
            self._failed_timing(scope, key, why)
        new = [key for key in new if key not in failed]
        contenders = {key: fn for key, fn in contenders.items() if key not in failed}
        incumbent = incumbent if incumbent is not None and incumbent[0] not in failed else None
        eager = samples["eager"].median_s * 1e6
        first = scope not in self.eager_runs
        self.eager_runs.setdefault(scope, []).append(eager)
        feats.eager_us = median(self.eager_runs[scope]) * feats.calls
        if first:
            self._measure_scope_eager(scope)
        # the ratio to eager of this run, or, with an incumbent in the run, the ratio to the
        # incumbent times the incumbent's own ratio: new candidates compare with the best so far
        # side by side, not through eager runs minutes apart (eager and compiled code do not slow
        # down alike when the machine's load changes)
        scale = 1.0 / eager
        if incumbent is not None:
            scale = self.trials[incumbent[0]].ratio / (samples[incumbent[0]].median_s * 1e6)
        for key in new:
            trial = self.trials[key]
            trial.status, trial.ratio = "ok", samples[key].median_s * 1e6 * scale
            trial.measured_us = trial.ratio * feats.eager_us
            self._record(trial, scope, feats.eager_us)
        self._rescale(scope)
        if incumbent is not None:    # timed without a fault: its measurement stands again
            self._record(self.trials[incumbent[0]], scope, feats.eager_us)
        if len(contenders) > 1:
            best = min((key for key in contenders if key != "eager"), key=lambda key: self.trials[key].ratio)
            self.incumbents[scope] = (best, contenders[best])    # the fastest built so far, for the next runs

    def _failed_timing(self, scope: str, key: str, why: str) -> None:
        """``key``'s program passed its check call and raised at a later one, while timed: it is
        rejected (the incumbent too, which an earlier batch measured), and the others were timed
        without it (:func:`~.measure.time_surviving`)."""
        trial = self.trials[key]
        trial.status, trial.measured_us, trial.ratio = "compile_error", None, None
        trial.reason = f"raised while it was timed, after its check call passed: {why}"
        log.warning("cuvil-pgc: %s is left out: it %s", key, trial.reason)
        if self.incumbents.get(scope, ("",))[0] == key:
            del self.incumbents[scope]
        self._record(trial, scope, None)

    def _rejected_unbuilt(self, cand: Candidate) -> bool:
        """Reject ``cand`` if this search already showed that it would fail (:class:`.Rejections`):
        it goes into the trials with that reason, not built and not counted against the budget.
        True when rejected."""
        found = self.rejections.why_not_built(cand)
        if found is None:
            return False
        status, why = found
        self.trials[cand.key] = Trial(cand, self.cost.predict(cand, self.features[cand.scope]), status,
                                      reason=f"not built: {why}")
        return True

    def _warm_incumbent(self, scope: str) -> tuple[str, Callable[[], Any]] | None:
        """The scope's incumbent after one call (a torch.compile one recompiles after the batch's
        dynamo reset); one that fails now is dropped and the batch is timed against eager alone."""
        incumbent = self.incumbents.get(scope)
        if incumbent is None:
            return None
        try:
            with torch.no_grad():
                incumbent[1]()
        except Exception as exc:
            log.info("incumbent %s dropped: %s", incumbent[0], exception_line(exc))
            del self.incumbents[scope]
            self._record(self.trials[incumbent[0]], scope, self.features[scope].eager_us)   # its measurement stands
            return None
        return incumbent

    def _rescale(self, scope: str) -> None:
        """Express every measured trial of ``scope`` against the median of all its eager runs."""
        eager_us = self.features[scope].eager_us
        for t in self.trials.values():
            if t.candidate.scope != scope or t.status != "ok":
                continue
            if t.ratio is not None:
                t.measured_us = t.ratio * eager_us
            elif t.candidate.is_baseline:
                t.measured_us = eager_us

    def _measure_scope_eager(self, scope: str) -> None:
        trial = self.trials.get(Candidate(scope).key)
        if trial is not None and trial.status == "not_measured":
            trial.status, trial.measured_us = "ok", self.features[scope].eager_us
            self.measured += 1

    def _record(self, trial: Trial, scope: str, eager_us: float | None) -> None:
        if self.records is not None:
            self.records.add(trial, self.features[scope], eager_us)


def _pinned_features(s: _Search, fixed: dict[str, Candidate]) -> dict[str, ScopeFeatures]:
    """Features (and structures) for pinned scopes the profile did not single out."""
    from cuvil_pgc.recompile.features import scope_features

    out = {}
    for scope, cand in fixed.items():
        if scope in s.opt.eager_scopes and not cand.is_baseline:
            raise RecompileError(f"pinned plan runs {scope or 'the whole model'!r} on {cand.config}, but its call "
                                 "changes the model's buffers (or the numbers its modules hold, a call counter) or "
                                 "draws random numbers, which no program reproduces",
                                 fix="pin the submodules whose calls leave the buffers, those numbers and torch's "
                                     "random generators alone instead")
        if scope not in s.features:
            if scope not in s.modules:
                raise RecompileError(f"pinned plan names {scope!r}, which is not a submodule of the model")
            s.scope_inputs.update(capture_scope_inputs(s.model, s.inputs, [scope]))
            if scope not in s.scope_inputs:
                raise RecompileError(f"pinned plan names {scope!r}, which the example inputs do not call with "
                                     "inputs a program of it alone can be built for (it is not called, or called "
                                     "with nested tensors, under its caller's autocast or changing an object it is "
                                     "given: a warning above says which)",
                                     fix="pin the module that calls it, or the whole model ('')")
            out[scope] = scope_features(scope, s._module(scope), s.scope_inputs[scope], None, None, 1.0, 1.0)
            s.structures[scope] = structural_hash(s._module(scope))
            s.weights[scope] = weights_digest(s._module(scope))
            s.settings_skip[scope] = written_under(s.written, scope)
            s.settings[scope] = settings_digest(s._module(scope), s.settings_skip[scope])
        inputs = s.scope_inputs.get(scope)
        if inputs is not None and not cand.is_baseline and (payload := payload_input(inputs.args, inputs.kwargs)):
            raise RecompileError(f"pinned plan runs {scope or 'the whole model'!r} on {cand.config}, but it takes "
                                 f"{payload}, a request's data in Python values, which its program would hold as "
                                 "constants and answer for the captured request alone",
                                 fix="pin the modules it calls with tensors instead, or pass the data as tensors")
    return out


def search(model: Any, example_inputs: tuple[Any, ...], analysis: Analysis | None, *, options: SearchOptions | None = None,
           records: RecordDB | None = None, machine_key: str = "", progress: Progress | None = None) -> SearchResult:
    """Explore the plan space of ``model`` guided by ``analysis``; returns the trials and the choices."""
    from cuvil_pgc.recompile.plan import choose_plan

    opt = options or SearchOptions()
    s = _Search(model, example_inputs, analysis, opt, records, machine_key, progress)
    with torch._dynamo.config.patch(recompile_limit=64):
        space = s.prepare()
        if opt.fixed is None:
            s.explore(space)
        else:
            s.features.update(_pinned_features(s, opt.fixed))
        result = SearchResult(trials=s.trials, features=s.features, matches=s.matches,
                              scope_inputs=s.scope_inputs, structures=s.structures, settings=s.settings, settings_skip=s.settings_skip,
                              weights=s.weights, measured=s.measured,
                              reused=s.reused, space_size=len(space), machine=machine_key,
                              runtime_defaults=[s.trials[c.key] for c in s.runtime_defaults if c.key in s.trials],
                              baselines_measured=s.baselines_measured, stopped=s.stop_reason())
        torch._dynamo.reset()
        stage(progress, "racing the plan against eager")
        choose_plan(s, result)
    return result
