"""Cost models: predict a candidate's time per forward from the profile and the machine model.

Each model is a small class with one signature, ``predict(cand, feats) -> float`` (µs, or a
factor for the multiplicative ones), and ``refit(samples)`` from measured records. The
:class:`PlanCostModel` composes them:

    t = overhead(backend) + ops_after × per_op(backend) [+ GEMMs × prepacked cost] + work × fusion × layout × precision

where the eager time of a scope splits into dispatch and work (:func:`~.cost_figures.split_eager`;
on a GPU the work is the scope's kernel time from the profile). The backends' fixed costs start
from measured priors (:mod:`.cost_figures`) and are refit from this machine's calibration probe
records (the probe is measured once per machine); other measurements never move a fixed cost. The
variable part's components are in :mod:`.cost_components`. After the component refits, a
log-ratio correction per configuration and op family (recurrent / conv / dense; an unmeasured
configuration borrows that of its program kind — backend, rewritten or not; shrunk towards zero by
the record count) absorbs what the models miss, as TVM MetaSchedule's measured records correct its
cost model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from cuvil_pgc.recompile.candidates import OVERHEAD_LABELS, RUNTIME_BACKENDS, Candidate, ScopeFeatures
from cuvil_pgc.recompile.cost_components import (
    FusionCostModel,
    LaunchCostModel,
    LayoutCostModel,
    PrecisionCostModel,
)
from cuvil_pgc.recompile.cost_figures import (
    PRIORS,
    MachineFigures,
    has_cell_rewrite,
    rnn_steps_and_calls,
    split_eager,
)
from cuvil_pgc.recompile.measure import median

__all__ = ["PRIORS", "PRIOR_WEIGHT", "BackendOverheadModel", "MachineFigures", "PlanCostModel", "backend_variant",
           "correction_keys", "op_family", "split_eager"]

#: how many of this machine's probe measurements a fixed-cost prior counts as (see BackendOverheadModel.refit)
PRIOR_WEIGHT = 0.25


def backend_variant(cand: Candidate) -> str:
    if cand.backend == "compile" and cand.cpp_wrapper:
        return "compile+cpp_wrapper"
    return cand.backend


@dataclass
class BackendOverheadModel:
    """Fixed cost per call of a backend variant (Python wrapper, package runner, graph replay)."""

    fixed_us: dict[str, float] = field(default_factory=lambda: dict(PRIORS["fixed_us"]))

    def predict(self, cand: Candidate, feats: ScopeFeatures) -> float:
        return self.fixed_us.get(backend_variant(cand), 0.0) * feats.calls

    def refit(self, samples: list[tuple[Candidate, ScopeFeatures, float, float]]) -> None:
        """samples: (candidate, features, measured µs, predicted µs without the fixed cost).

        Only the calibration probe's samples (``evidence["probe"]``, see :mod:`.calibrate`) count:
        there the variable part is two pointwise ops, so what a measurement leaves over is the
        backend's fixed cost. Anywhere else a misprediction of the variable part would pass for a
        fixed cost and be charged to every model (one GRU tagger's records once made AOTInductor's
        383 µs a call, and a BERT's search stopped trying it); those errors go to the corrections.

        The prior counts as :data:`PRIOR_WEIGHT` of one probe measurement: the probe measures this
        machine, the priors another (CUDA graphs' 15 µs prior against 204.7 µs measured on the H200,
        where an even blend left 110)."""
        implied: dict[str, list[float]] = {}
        for cand, feats, measured, variable in samples:
            if cand.backend != "eager" and feats.evidence.get("probe"):
                implied.setdefault(backend_variant(cand), []).append(max(measured - variable, 0.0) / feats.calls)
        for variant, values in implied.items():
            prior, n = self.fixed_us.get(variant, 0.0), len(values)
            self.fixed_us[variant] = (PRIOR_WEIGHT * prior + n * median(values)) / (PRIOR_WEIGHT + n)



class PlanCostModel:
    """Composes the component models; ``predict(cand, feats)`` gives µs per forward."""

    def __init__(self, machine: MachineFigures) -> None:
        self.machine = machine
        self.overhead = BackendOverheadModel()
        self.launch = LaunchCostModel(machine)
        self.fusion = FusionCostModel(machine)
        self.layout = LayoutCostModel(machine)
        self.precision = PrecisionCostModel(machine, self.fusion)
        # (config or backend, op family or "") -> shrunk median log(measured / predicted)
        self.correction: dict[tuple[str, str], float] = {}
        self.refit_count = 0

    def variable_us(self, cand: Candidate, feats: ScopeFeatures) -> float:
        if cand.backend == "eager":
            return max(feats.eager_us - self.launch.rewrite_saving(cand, feats), 0.05 * feats.eager_us)
        _, work = split_eager(feats, self.machine)
        if cand.rewrite:   # the RNN op's fixed cost sits in "work" (one aten op, many internal steps)
            work = max(work - self.launch.rewrite_saving(cand, feats), 0.05 * work)
        layout_factor, layout_us = self.layout.predict(cand, feats)
        factor = self.fusion.predict(cand, feats) * layout_factor * self.precision.predict(cand, feats)
        return self.launch.predict(cand, feats) + work * factor + layout_us

    def predict_raw(self, cand: Candidate, feats: ScopeFeatures) -> float:
        return self.overhead.predict(cand, feats) + self.variable_us(cand, feats)

    def predict(self, cand: Candidate, feats: ScopeFeatures) -> float:
        return self.predict_raw(cand, feats) * math.exp(self._correction(cand, feats))

    def _correction(self, cand: Candidate, feats: ScopeFeatures) -> float:
        """The most specific learned correction: (config, family), else (program, family), else program."""
        for key in correction_keys(cand, feats):
            if key in self.correction:
                return self.correction[key]
        return 0.0

    def refit(self, samples: list[tuple[Candidate, ScopeFeatures, float]]) -> None:
        """Refit from (candidate, features, measured µs per forward) of this machine."""
        self.overhead = BackendOverheadModel()
        self.overhead.refit([(c, f, m, self.variable_us(c, f)) for c, f, m in samples])
        logs: dict[tuple[str, str], list[float]] = {}
        for cand, feats, measured in samples:
            predicted = self.predict_raw(cand, feats)
            if measured > 0 and predicted > 0 and cand.backend != "eager":
                err = math.log(measured / predicted)
                for key in correction_keys(cand, feats):
                    logs.setdefault(key, []).append(err)
        self.correction = {key: median(v) * len(v) / (len(v) + 1) for key, v in logs.items()}
        self.refit_count += 1

    def rank(self, cands: list[Candidate], feats: dict[str, ScopeFeatures]) -> list[tuple[Candidate, float]]:
        """Candidates with predicted µs, best predicted saving first (label-preferred on ties)."""
        scored = []
        for cand in cands:
            f = feats[cand.scope]
            predicted = self.predict(cand, f)
            saving = f.eager_us - predicted
            scored.append((cand, predicted, (-saving, _label_preference(cand, f))))
        scored.sort(key=lambda t: t[2])
        return [(c, p) for c, p, _ in scored]


def correction_keys(cand: Candidate, feats: ScopeFeatures) -> tuple[tuple[str, str], ...]:
    """Keys of the learned corrections, most specific first: the configuration and op family, the
    program kind (backend, plus ``+rewrite`` for RNN cell rewrites: an unrolled recurrence is another
    program, so its measured error says nothing about the original's) and family, the program kind
    alone (not for cell rewrites, whose effect depends on the family). Attention and conv+BN
    rewrites change a few ops of the same program: they share the original's program keys."""
    family = op_family(feats)
    if cand.rewrite and has_cell_rewrite(feats):   # stepwise vs sequence: no global key
        program = cand.backend + "+rewrite"
        return (cand.config, family), (program, family)
    return (cand.config, family), (cand.backend, family), (cand.backend, "")


#: most cell steps per RNN call that still count as stepwise decoding (see :func:`op_family`)
STEPWISE_MAX_STEPS = 2


def op_family(feats: ScopeFeatures) -> str:
    """Coarse kind of work in a scope: backends handle recurrent, convolutional and dense ops differently,
    so a configuration's measured error on one family does not correct predictions for another.

    Recurrent work splits by steps per call: a stepwise decoder (an RNN op per step) and a sequence
    model (one op over many steps) respond oppositely to a cell rewrite, which removes the op's fixed
    cost but unrolls every step."""
    if has_cell_rewrite(feats):
        steps, calls = rnn_steps_and_calls(feats)
        return "recurrent_seq" if calls and steps / calls > STEPWISE_MAX_STEPS else "recurrent"
    return "conv" if feats.has_conv else "dense"


def _label_preference(cand: Candidate, feats: ScopeFeatures) -> int:
    """0 when the candidate's main lever fits the scope's bottleneck label, 1 otherwise."""
    labels = feats.label_set
    if labels & set(OVERHEAD_LABELS):
        return 0 if cand.backend in ("aoti", "cudagraphs", *RUNTIME_BACKENDS) or cand.rewrite or cand.cpp_wrapper else 1
    if "compute" in labels:
        return 0 if cand.mode != "default" or cand.freezing or cand.reduced else 1
    return 0 if cand.backend != "eager" else 1
