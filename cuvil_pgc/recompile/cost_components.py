"""The cost models' components for a candidate's variable part (composed by
:class:`~.cost_models.PlanCostModel`): kernel calls and rewrites (:class:`LaunchCostModel`), and
the work factors of fusion, memory layout and precision.

Freezing without autotuning routes each GEMM to a prepacked vendor linear kernel whose extra
per-call cost the search measures on the machine (27-42 µs per call over MKL's addmm on the
reference AMD EPYC, where it made AOTInductor with freezing 3.5x slower than without on the GRU
tagger). Its convolutions are prepacked oneDNN ones too, and channels_last changes which
convolution kernels run: both scale the convolutions' share of the work by kernel ratios the
search measures on the CPU (:func:`~.measure.conv_kernel_ratios`; there, freezing's convolutions
are 19-32 % slower, NHWC ones 21-24 % faster). A cell rewrite removes the RNN op but unrolls every
step: each step costs its GEMM, timed on the machine for the scope's shapes
(:func:`~.measure.gemm_us`), and its gate math. On a GPU every kernel a non-graph backend runs is
launched from the host (the machine's launch latency on top of the backend's per-kernel cost).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cuvil_pgc.analyze import vocabulary
from cuvil_pgc.recompile.candidates import Candidate, ScopeFeatures
from cuvil_pgc.recompile.cost_figures import PRIORS, MachineFigures, on_gpu, rnn_steps_and_calls, split_eager
from cuvil_pgc.recompile.rewrites.cells import CELL_REWRITES


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
        if not cand.reduced:
            return 1.0
        share = self.memory.memory_share(feats)
        low = self.machine.peak_low_flops
        compute_factor = self.machine.peak_flops / low if low else 2.0   # no fast bf16 path: emulated
        return share * 0.55 + (1.0 - share) * compute_factor + 0.05      # + casts
