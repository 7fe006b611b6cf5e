"""The figures the cost models start from (:mod:`.cost_models`): the backends' measured priors,
this machine's figures, and how a scope's eager time splits into dispatch and work.

The starting figures (``PRIORS``) are fixed costs above eager measured with the calibration probe
(:mod:`.calibrate`) on a 2-core CPU with torch 2.13 and one thread (eager 16.7 µs, torch.compile
58, cpp_wrapper 50, AOTInductor 8.9 through the direct runner call of
:class:`~.apply.CompiledRegion`; minus the probe's own predicted variable part); CUDA graphs' 15 µs
is a placeholder until the probe runs on a GPU (on the H200 it measured them at 204.7 µs a call
against eager's 79.1, a cost of CUDA graph trees' Python on that host). The refit
(:class:`~.cost_models.BackendOverheadModel`) replaces them with this machine's probe records.

Eager's time splits into dispatch (ops × the machine's per-op cost, at most 80 %) and work. On a
GPU (the profile holds the scope's kernels: ``evidence["gpu_us"]``, their time per forward) the
work is the kernels' time and the rest of eager's is the host's: dispatch, launch and Python,
which compiled programs cut and CUDA graphs remove. On the H200 (``tests/data/h200``) the CPU rule
counted 0.59 ms of a host-bound model's 0.65 as work, which no backend removes; with the kernels'
0.064 ms as work, the models put its CUDA graphs at 0.25 ms and its AOTInductor package at 0.24.
Both ran 0.22.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from cuvil_pgc.recompile.candidates import ScopeFeatures
from cuvil_pgc.recompile.measure import conv_kernel_ratios, prepacked_gemm_overhead_us
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


def has_cell_rewrite(feats: ScopeFeatures) -> bool:
    """Whether the scope's rewrites unroll an LSTM/GRU into cell steps."""
    return any(r.startswith(CELL_REWRITES) for r in feats.rewrites)


def rnn_steps_and_calls(feats: ScopeFeatures) -> tuple[float, float]:
    """Recurrent cell steps and RNN calls per forward of the model (features.op_census; 0, 0 when
    the scope runs no RNN)."""
    return float(feats.evidence.get("rnn_steps", 0.0)), float(feats.evidence.get("rnn_calls", 0.0))

