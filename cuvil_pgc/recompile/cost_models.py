"""Cost models: predict a candidate's time per forward from the profile and the machine model.

Each model is a small class with one signature, ``predict(cand, feats) -> float`` (µs, or a
factor for the multiplicative ones), and ``refit(samples)`` from measured records. The
:class:`PlanCostModel` composes them:

    t = overhead(backend) + ops_after × per_op(backend) [+ GEMMs × prepacked cost] + work × fusion × layout × precision

where the eager time of a scope splits into dispatch (ops × the machine's per-op cost, at most
80 %) and work. On a GPU (the profile holds the scope's kernels: ``evidence["gpu_us"]``, their time
per forward) the work is the kernels' time and the rest of eager's is the host's: dispatch, launch
and Python, which compiled programs cut and CUDA graphs remove. There every kernel a non-graph
backend runs is launched from the host (the machine's launch latency on top of ``per_op``). On the
H200 (``tests/data/h200``) the CPU rule counted 0.59 ms of a host-bound model's 0.65 as work,
which no backend removes, and after the probe's refit put its CUDA graphs at 0.73 ms and its
AOTInductor package at 0.59; with the kernels' 0.064 ms as work, 0.25 and 0.24. Both ran 0.22.

The starting figures (``PRIORS``) are fixed costs above eager measured with the calibration probe
(:mod:`.calibrate`) on a 2-core CPU with torch 2.13 and one thread (eager 16.7 µs, torch.compile
58, cpp_wrapper 50, AOTInductor 8.9 through the direct runner call of
:class:`~.apply.CompiledRegion`; minus the probe's own predicted variable part); CUDA graphs' 15 µs
is a placeholder until the probe runs on a GPU (on the H200 it measured them at 204.7 µs a call
against eager's 79.1, a cost of CUDA graph trees' Python on that host). The refit replaces them
with this machine's probe records (the probe is measured once per machine); other measurements
never move a fixed cost. Freezing without autotuning routes each GEMM to a prepacked vendor linear kernel whose extra
per-call cost the search measures on the machine (27-42 µs per call over MKL's addmm on the
reference AMD EPYC, where it made AOTInductor with freezing 3.5x slower than without on the GRU
tagger). Its convolutions are prepacked oneDNN ones too, and channels_last changes which
convolution kernels run: both scale the convolutions' share of the work by kernel ratios the
search measures on the CPU (:func:`~.measure.conv_kernel_ratios`; there, freezing's convolutions
are 19-32 % slower, NHWC ones 21-24 % faster). A cell rewrite removes the RNN op but unrolls every
step: each step costs its GEMM, timed on the machine for the scope's shapes
(:func:`~.measure.gemm_us`), and its gate math. After the component refits, a log-ratio
correction per configuration and op family (recurrent / conv / dense; an unmeasured configuration
borrows that of its program kind — backend, rewritten or not; shrunk towards zero by the record
count) absorbs what the models miss, as TVM MetaSchedule's measured records correct its cost model.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from cuvil_pgc.analyze import vocabulary
from cuvil_pgc.recompile.candidates import OVERHEAD_LABELS, RUNTIME_BACKENDS, Candidate, ScopeFeatures
from cuvil_pgc.recompile.measure import conv_kernel_ratios, median, prepacked_gemm_overhead_us
from cuvil_pgc.recompile.rewrites.cells import CELL_REWRITES

#: µs per call of each backend variant on top of eager (measured, see module docstring)
PRIORS = {
    "fixed_us": {"eager": 0.0, "compile": 53.0, "compile+cpp_wrapper": 45.0, "aoti": 5.0,
                 "cudagraphs": 15.0, "ort": 12.0, "openvino": 15.0, "tensorrt": 20.0},
    "per_op_us": {"eager": None, "compile": 1.0, "aoti": 0.5, "cudagraphs": 0.3, "ort": 0.6, "openvino": 0.5,
                  "tensorrt": 0.3},
    "rnn_rewrite_saving": 0.8,          # share of an RNN op's time a cell rewrite removes (0.35 → 0.064 ms)
    "rnn_op_us": 250.0,                 # nn.LSTM step cost when the profile has no top_ops
    "cell_step_ops": 12.0,              # aten ops of one rewritten LSTM/GRU step (addmm, chunk, gates)
    "cell_step_kernels": 2.0,           # compiled: the step's GEMM and its fused pointwise gates
    # compiled attention as matmul + softmax instead of the fused CPU kernel: µs saved per call, less
    # µs per attention score (batch x heads x queries x keys); a fit to two measured AOTInductor
    # packages: 16 tokens x 4 heads saved 23.5 µs per call, 32 tokens x 4 heads (causal) lost 14
    "attention_kernel_us": 36.0,
    "attention_math_us_per_score": 0.0122,
    # µs a compiled transposed convolution saves as GEMM + col2im instead of oneDNN's deconvolution
    # (AOTInductor packages of five small ones, frozen or not: 6-136 µs, median ~25)
    "deconv_call_us": 25.0,
    # µs added per GEMM call when Inductor freezing prepacks its weight for a vendor linear kernel
    # (oneDNN / MKL packed) instead of the plain BLAS call; machine-specific: the search measures
    # it (measure.prepacked_gemm_overhead_us); 30 is the figure of the 2-core AMD EPYC, one thread
    "prepacked_gemm_us": 30.0,
    # convolution kernels relative to the plain NCHW aten one (see MachineFigures.conv_ratios); on
    # the CPU the search measures them (measure.conv_kernel_ratios), these are guesses for elsewhere
    "conv_ratios": {"channels_last": 0.85, "prepacked": 0.85, "prepacked_channels_last": 0.85},
}


#: how many of this machine's probe measurements a fixed-cost prior counts as (see BackendOverheadModel.refit)
PRIOR_WEIGHT = 0.25


@dataclass
class MachineFigures:
    dispatch_us: float = 4.0
    prepacked_gemm_us: float = PRIORS["prepacked_gemm_us"]
    peak_flops: float = 100e9
    peak_low_flops: float | None = None     # bf16/fp16 FLOP/s when measured
    mem_bw: float = 8e9
    launch_us: float = 5.0                   # a GPU kernel's launch from the host
    #: convolution kernels' time ratios: "channels_last" (NHWC over NCHW), "prepacked" (freezing's
    #: prepacked kernel over the plain one, NCHW) and "prepacked_channels_last" (the same in NHWC)
    conv_ratios: dict[str, float] = field(default_factory=lambda: dict(PRIORS["conv_ratios"]))

    @classmethod
    def of_this_machine(cls, machine: dict[str, Any], device: str) -> MachineFigures:
        """The analysis' machine figures plus what the search measures on the CPU itself, once per
        process: the prepacked GEMM's extra cost per call and the convolution kernel ratios (the
        priors elsewhere)."""
        figures = cls.from_analysis_machine(machine)
        if device.startswith("cpu"):
            figures.prepacked_gemm_us, figures.conv_ratios = _cpu_probes()
        else:
            figures.prepacked_gemm_us = 0.0
        return figures

    @classmethod
    def from_analysis_machine(cls, machine: dict[str, Any]) -> MachineFigures:
        cpu = machine.get("cuda") or machine.get("cpu") or machine
        peaks = cpu.get("peak_flops") or {}
        low = peaks.get("bf16") or peaks.get("fp16")
        dispatch = cpu.get("dispatch_overhead_s")
        launch = cpu.get("launch_latency_s")
        return cls(dispatch_us=(dispatch * 1e6) if dispatch else 4.0, launch_us=(launch * 1e6) if launch else 5.0,
                   peak_flops=float(peaks.get("fp32", 100e9)), peak_low_flops=float(low) if low else None,
                   mem_bw=float(cpu.get("mem_bw", 8e9)))


@functools.cache
def _cpu_probes() -> tuple[float, dict[str, float]]:
    gemm, conv = prepacked_gemm_overhead_us(), conv_kernel_ratios()
    return (PRIORS["prepacked_gemm_us"] if gemm is None else gemm,
            dict(PRIORS["conv_ratios"] if conv is None else conv))


def backend_variant(cand: Candidate) -> str:
    if cand.backend == "compile" and cand.cpp_wrapper:
        return "compile+cpp_wrapper"
    return cand.backend


def split_eager(feats: ScopeFeatures, machine: MachineFigures) -> tuple[float, float]:
    """(dispatch µs, work µs) of the scope's eager time per forward: on a GPU, work is the
    kernels' time (:func:`on_gpu`) and dispatch the rest."""
    if on_gpu(feats):
        work = min(float(feats.evidence["gpu_us"]), feats.eager_us)
        return feats.eager_us - work, work
    dispatch = min(feats.ops * machine.dispatch_us, 0.8 * feats.eager_us)
    return dispatch, max(feats.eager_us - dispatch, 0.0)


def on_gpu(feats: ScopeFeatures) -> bool:
    """Whether the scope runs on a GPU as the profile saw it: its features carry its kernels' time
    per forward (``evidence["gpu_us"]``, :func:`~.features.gpu_kernel_us`; the calibration probe
    on CUDA says 0, its three tiny kernels)."""
    return "gpu_us" in feats.evidence


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


@dataclass
class LaunchCostModel:
    """Per-op cost after the backend: dispatch (eager) or kernel calls; rewrites remove RNN cost."""

    machine: MachineFigures
    per_op_us: dict[str, float] = field(default_factory=lambda: {k: v for k, v in PRIORS["per_op_us"].items()
                                                                 if v is not None})
    rnn_saving: float = PRIORS["rnn_rewrite_saving"]

    def predict(self, cand: Candidate, feats: ScopeFeatures) -> float:
        if cand.backend == "eager":
            return split_eager(feats, self.machine)[0]
        kernels = max(feats.ops - feats.pointwise_ops * 0.8, 1.0)    # pointwise ops fuse into neighbours
        per_kernel = self.per_op_us.get(cand.backend, 1.0)
        if on_gpu(feats) and cand.backend != "cudagraphs":       # a graph replays its kernels in one launch
            per_kernel += self.machine.launch_us
        return kernels * per_kernel + self.prepacked_gemm_us(cand, feats)

    def prepacked_gemm_us(self, cand: Candidate, feats: ScopeFeatures) -> float:
        """Freezing without autotuning hands every GEMM with a constant weight to a prepacked vendor
        linear kernel, whose per-call cost is the machine's; max-autotune benchmarks it against
        Inductor's GEMM templates and keeps the faster, so it is not charged. A rewrite's unrolled
        steps are GEMMs too (one per step plus each call's input projection)."""
        if not cand.freezing or cand.mode != "default" or cand.backend not in ("aoti", "compile"):
            return 0.0
        gemms = feats.gemms
        if cand.rewrite:
            gemms = max(gemms, sum(rnn_steps_and_calls(feats)))
        return gemms * self.machine.prepacked_gemm_us

    def rewrite_saving(self, cand: Candidate, feats: ScopeFeatures) -> float:
        """µs a rewrite removes (negative: it adds): :meth:`cell_saving`, :meth:`attention_saving`
        and :meth:`deconv_saving`."""
        if not cand.rewrite:
            return 0.0
        return self.cell_saving(cand, feats) + self.attention_saving(cand, feats) + self.deconv_saving(cand, feats)

    def cell_saving(self, cand: Candidate, feats: ScopeFeatures) -> float:
        """µs a cell rewrite removes: the RNN op's time less what its unrolled cells cost. Where the
        features carry the cells' GEMMs as measured on this machine (``cell_gemm_us``), the cells
        cost those plus each step's gate math (:meth:`gate_us`): a long sequence's op is mostly
        per-step matrix-vector work, which the cells do too. Otherwise the prior: the op is 80 %
        fixed cost, and each step beyond the first of each call costs its ops or kernels. Where the
        RNN has no fused kernel on this device (a CPU ``nn.GRU`` runs as cell ops), a compiled graph
        of the original unrolls cells too, projecting each step's input alone: the rewrite saves it
        those GEMMs less its one projection of all steps (``stepwise_gemm_us - cell_gemm_us``)."""
        if "stepwise_gemm_us" in feats.evidence and "cell_gemm_us" in feats.evidence and cand.backend != "eager":
            return float(feats.evidence["stepwise_gemm_us"]) - float(feats.evidence["cell_gemm_us"])
        rnn_us = min(float(feats.evidence.get("rnn_us", 0.0)) or PRIORS["rnn_op_us"] * sum(
            1 for r in feats.rewrites if r.startswith(CELL_REWRITES)) * feats.calls, feats.eager_us)
        steps, calls = rnn_steps_and_calls(feats)
        if "cell_gemm_us" in feats.evidence:
            return rnn_us - float(feats.evidence["cell_gemm_us"]) - steps * self.gate_us(cand)
        return self.rnn_saving * rnn_us - max(steps - calls, 0.0) * self.step_us(cand)

    def gate_us(self, cand: Candidate) -> float:
        """One cell step's gate math after its GEMM: its pointwise ops one by one (eager), or one
        fused kernel (compiled)."""
        if cand.backend == "eager":
            return (PRIORS["cell_step_ops"] - 1) * self.machine.dispatch_us
        return (PRIORS["cell_step_kernels"] - 1) * self.per_op_us.get(cand.backend, 1.0)

    @staticmethod
    def deconv_saving(cand: Candidate, feats: ScopeFeatures) -> float:
        """µs the transposed-convolution rewrite saves a compiled program (eager keeps oneDNN's)."""
        if cand.backend == "eager":
            return 0.0
        return float(feats.evidence.get("deconv_calls", 0.0)) * PRIORS["deconv_call_us"]

    @staticmethod
    def attention_saving(cand: Candidate, feats: ScopeFeatures) -> float:
        """µs the attention rewrite saves a compiled program (negative: costs): the fused kernel's
        fixed cost per call against math that grows with the scores. Eager keeps its fast path."""
        if cand.backend == "eager":
            return 0.0
        calls = float(feats.evidence.get("attention_calls", 0.0))
        scores = float(feats.evidence.get("attention_scores", 0.0))
        return calls * PRIORS["attention_kernel_us"] - scores * PRIORS["attention_math_us_per_score"]

    def step_us(self, cand: Candidate) -> float:
        """Fixed cost of one unrolled cell step: its ops dispatched one by one (eager), or its
        kernels (compiled: the GEMM and one fused pointwise kernel)."""
        if cand.backend == "eager":
            return PRIORS["cell_step_ops"] * self.machine.dispatch_us
        return PRIORS["cell_step_kernels"] * self.per_op_us.get(cand.backend, 1.0)


@dataclass
class FusionCostModel:
    """Work factor from fusing observed op sequences (intermediate bytes not written and re-read)."""

    machine: MachineFigures

    def predict(self, cand: Candidate, feats: ScopeFeatures) -> float:
        if cand.backend == "eager":
            return 1.0
        memory_share = self.memory_share(feats)
        saved = float(feats.evidence.get("fusion_bytes_saved", 0.0))
        frac = min(saved / feats.bytes, 0.6) if feats.bytes > 0 and saved > 0 else 0.25
        factor = 1.0 - memory_share * frac
        if cand.freezing and feats.has_conv:   # prepacked convolutions
            ratio = self.machine.conv_ratios["prepacked_channels_last" if cand.channels_last else "prepacked"]
            factor *= conv_work_factor(feats, ratio)
        if cand.mode == "max-autotune-no-cudagraphs":
            factor *= 1.0 - 0.1 * (1.0 - memory_share)
        return factor

    def memory_share(self, feats: ScopeFeatures) -> float:
        if feats.flops <= 0 or feats.bytes <= 0:
            known = vocabulary.of(feats.bottleneck)
            return known.memory_share if known else 0.5
        t_mem = feats.bytes / self.machine.mem_bw
        t_cmp = feats.flops / self.machine.peak_flops
        return t_mem / (t_mem + t_cmp)


@dataclass
class LayoutCostModel:
    """channels_last: cheaper conv work, plus the NCHW↔NHWC conversion at the region's boundary."""

    machine: MachineFigures

    def predict(self, cand: Candidate, feats: ScopeFeatures) -> tuple[float, float]:
        """(work factor, added µs)."""
        if not cand.channels_last or not feats.has_conv:
            return 1.0, 0.0
        boundary_bytes = float(feats.evidence.get("boundary_bytes", 0.0))
        return (conv_work_factor(feats, self.machine.conv_ratios["channels_last"]),
                2 * boundary_bytes / self.machine.mem_bw * 1e6)


def conv_work_factor(feats: ScopeFeatures, ratio: float) -> float:
    """The scope's work factor when its convolutions take ``ratio`` times as long: weighted by the
    convolutions' share of the FLOPs (all of the work where the census did not split it)."""
    share = float(feats.evidence.get("conv_share", 1.0))
    return 1.0 + share * (ratio - 1.0)


@dataclass
class PrecisionCostModel:
    """bf16/fp16: half the bytes; compute at the low-precision rate where the machine has one."""

    machine: MachineFigures
    memory: FusionCostModel

    def predict(self, cand: Candidate, feats: ScopeFeatures) -> float:
        if cand.precision == "fp32":
            return 1.0
        share = self.memory.memory_share(feats)
        low = self.machine.peak_low_flops
        compute_factor = self.machine.peak_flops / low if low else 2.0   # no fast bf16 path: emulated
        return share * 0.55 + (1.0 - share) * compute_factor + 0.05      # + casts


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


def has_cell_rewrite(feats: ScopeFeatures) -> bool:
    """Whether the scope's rewrites unroll an LSTM/GRU into cell steps."""
    return any(r.startswith(CELL_REWRITES) for r in feats.rewrites)


def rnn_steps_and_calls(feats: ScopeFeatures) -> tuple[float, float]:
    """Recurrent cell steps and RNN calls per forward of the model (features.op_census; 0, 0 when
    the scope runs no RNN)."""
    return float(feats.evidence.get("rnn_steps", 0.0)), float(feats.evidence.get("rnn_calls", 0.0))


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
        return 0 if cand.mode != "default" or cand.freezing or cand.precision != "fp32" else 1
    return 0 if cand.backend != "eager" else 1
