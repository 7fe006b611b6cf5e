"""The plan space: which configurations are worth trying for each region, steered by the profile.

A :class:`Candidate` is one configuration of one *scope* — a submodule matched to a hot region
(the region compiled alone) or the whole model (every region merged into one compile boundary).
Configurations combine a backend (eager, torch.compile, AOTInductor package, CUDA graphs via
``reduce-overhead``, or an inference runtime the region is exported to: ONNX Runtime, OpenVINO,
Torch-TensorRT, see :mod:`.runtimes`), its options (mode, max-autotune for AOTInductor packages too; Inductor
freezing; ``cpp_wrapper``), module rewrites, memory layout (channels_last) and precision (bf16/fp16
autocast).

:func:`generate_space` builds the candidates from the bottleneck labels the analyzer gave the
regions: launch-overhead and host-bound regions get the options that remove per-op or per-call
cost (rewrites, AOTInductor, cpp_wrapper, CUDA graphs); memory-bandwidth regions the fusing and
layout options; compute-bound regions autotuning, freezing, layout and reduced precision; idle
regions nothing. Every scope with work also gets the runtimes usable here, at their defaults and
with the knobs that matter on this machine (:func:`_runtime_configs`). The cost models then rank
them (see :mod:`.cost_models`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from cuvil_pgc.analyze import vocabulary
from cuvil_pgc.errors import ConfigError
from cuvil_pgc.recompile.runtimes import ORT_PROVIDERS, RUNTIME_BACKENDS, RUNTIMES

BACKENDS = ("eager", "compile", "aoti", "cudagraphs", *RUNTIME_BACKENDS)
PRECISIONS = ("fp32", "bf16", "fp16")
OVERHEAD_LABELS = tuple(sorted(vocabulary.with_remedy("overhead")))   # launch_overhead, host_bound, ...
WORK_LABELS = vocabulary.with_remedy("work")                            # memory_bandwidth, compute
NO_REMEDY_LABELS = vocabulary.with_remedy("none")                       # idle, communication, setup
MAX_SUBSCOPES = 3
MIN_SCOPE_SHARE = 0.3
#: runtime knobs that change how the work is scheduled (threads, spinning, execution mode, the
#: performance hint, pinning), never which arithmetic runs: see :attr:`Candidate.arithmetic_key`
SCHEDULING_KNOBS = frozenset({"threads", "spin", "exec", "hint", "pin"})


@dataclass(frozen=True)
class Candidate:
    scope: str                       # submodule qualname; "" = the whole model
    backend: str = "eager"           # one of BACKENDS
    mode: str = "default"            # torch.compile mode: default | max-autotune-no-cudagraphs | reduce-overhead
    freezing: bool = False
    cpp_wrapper: bool = False
    rewrite: bool = False
    channels_last: bool = False
    precision: str = "fp32"          # fp32 | bf16 | fp16
    #: a runtime backend's own options, sorted (name, value) pairs: see :mod:`.runtime_region`
    knobs: tuple[tuple[str, str], ...] = ()
    #: fields of a newer cuvil-pgc this version does not know, sorted (name, JSON text) pairs: kept
    #: so a round trip through this version does not drop them (a loader refuses to run them)
    extra: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        # a backend this version does not know would realize as torch.compile (apply's last case):
        # a pinned plan naming one, or a newer cuvil-pgc's plan.json, is refused here instead
        if self.backend not in BACKENDS:
            titles = ", ".join(f"{r.title} is {name!r}" for name, r in RUNTIMES.items())
            raise ConfigError(f"unknown backend {self.backend!r} for {self.scope or '<model>'}",
                              fix=f"use one of {', '.join(BACKENDS)} ({titles}); a plan from a newer cuvil-pgc "
                                  "needs that version")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"unknown precision {self.precision!r} for {self.scope or '<model>'}",
                              fix=f"use one of {', '.join(PRECISIONS)}")

    @property
    def config(self) -> str:
        """The configuration without the scope, e.g. ``aoti+freezing+rewrite`` or ``ort+opt=basic``."""
        parts = [self.backend]
        if self.backend in ("compile", "aoti") and self.mode != "default":
            parts.append(self.mode)
        parts += [f"{name}={value}" for name, value in self.knobs]
        parts += [f"{name}={value}" for name, value in self.extra]
        parts += [name for name, on in (("freezing", self.freezing), ("cpp_wrapper", self.cpp_wrapper),
                                        ("rewrite", self.rewrite), ("channels_last", self.channels_last)) if on]
        if self.reduced:
            parts.append(self.precision)
        return "+".join(parts)

    @property
    def reduced(self) -> bool:
        """Computes in bf16 or fp16 (the accuracy guard holds it to its outputs' scale)."""
        return self.precision != "fp32"

    @property
    def is_baseline(self) -> bool:
        """The scope's own eager module, unchanged: what every other candidate must beat."""
        return self.backend == "eager" and not self.rewrite

    @property
    def key(self) -> str:
        return f"{self.scope or '<model>'}::{self.config}"

    @property
    def arithmetic_key(self) -> str:
        """The key without the :data:`SCHEDULING_KNOBS`: candidates that share it run the same
        arithmetic, so what fails the accuracy guard decisively for one fails it for all."""
        return replace(self, knobs=tuple(k for k in self.knobs if k[0] not in SCHEDULING_KNOBS)).key

    @property
    def unknown(self) -> list[str]:
        """The fields of a newer cuvil-pgc this candidate carries (see ``extra``)."""
        return [name for name, _ in self.extra]

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        del doc["extra"]
        doc["knobs"] = [list(k) for k in self.knobs]
        return {**{name: json.loads(value) for name, value in self.extra}, **doc}

    @classmethod
    def unknown_fields(cls, doc: dict[str, Any]) -> list[str]:
        """Fields of a candidate document this version does not know (a newer cuvil-pgc's knobs):
        :func:`from_json` keeps them in ``extra``; a loader refuses to run such a candidate."""
        return sorted(set(doc) - (set(cls.__dataclass_fields__) - {"extra"}))

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Candidate:
        fields = {k: v for k, v in doc.items() if k in cls.__dataclass_fields__ and k != "extra"}
        fields["knobs"] = tuple(sorted((str(k), str(v)) for k, v in fields.get("knobs") or ()))
        fields["extra"] = tuple(sorted((k, json.dumps(doc[k], sort_keys=True)) for k in cls.unknown_fields(doc)))
        return cls(**fields)


@dataclass
class ScopeFeatures:
    """What the cost models know about one scope, from the Analysis and the model's structure."""

    scope: str
    path: str                        # region path in the profile ("" when not profiled)
    bottleneck: str
    eager_us: float                  # per forward of the whole model
    calls: float = 1.0               # calls of this scope per forward of the model
    ops: float = 0.0                 # aten ops per forward
    pointwise_ops: float = 0.0
    gemms: float = 0.0               # addmm/mm calls per forward (what freezing prepacks)
    flops: float = 0.0
    bytes: float = 0.0
    has_conv: bool = False
    rewrites: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)   # bottlenecks of the regions inside the scope
    evidence: dict[str, Any] = field(default_factory=dict)

    @property
    def label_set(self) -> set[str]:
        """The scope's labels; its bottleneck alone where the profile gave none."""
        return set(self.labels or [self.bottleneck])


def generate_space(scopes: list[ScopeFeatures], device: str = "cpu",
                   backends: tuple[str, ...] | None = None,
                   runtimes: RuntimeSpace | None = None) -> list[Candidate]:
    """All candidates for all scopes (eager of every scope included, deduplicated, stable order).

    ``backends`` restricts the space to those backends (eager, and eager with rewrites, always stay).
    ``runtimes`` says which runtime backends can run here (default: :func:`RuntimeSpace.here`).
    """
    if runtimes is None:
        runtimes = RuntimeSpace.here(device) if backends is None or set(backends) & set(RUNTIME_BACKENDS) \
            else RuntimeSpace()
    seen: dict[str, Candidate] = {}
    for feats in scopes:
        for cand in scope_candidates(feats, device, runtimes):
            if backends is None or cand.backend == "eager" or cand.backend in backends:
                seen.setdefault(cand.key, cand)
    return list(seen.values())


@dataclass(frozen=True)
class RuntimeSpace:
    """What the runtime candidates depend on in this process: the runtime backends usable here,
    whether the CPU runs bf16 natively (AVX512-BF16 / AMX, as OpenVINO reports it), the
    deployment's thread count (torch's intra-op threads) and ONNX Runtime's execution providers
    (:data:`~.runtimes.ORT_PROVIDERS`: a GPU machine with the CPU package has none for CUDA
    tensors, so no ONNX Runtime candidate there)."""

    backends: tuple[str, ...] = ()
    native_bf16: bool = False
    threads: int = 1
    ort_eps: tuple[str, ...] = tuple(ORT_PROVIDERS)

    @classmethod
    def here(cls, device: str = "cpu") -> RuntimeSpace:
        import torch

        from cuvil_pgc.recompile import runtimes

        usable = runtimes.available(device)
        return cls(usable, "openvino" in usable and runtimes.openvino_native_bf16(), torch.get_num_threads(),
                   runtimes.ort_eps())


def scope_candidates(feats: ScopeFeatures, device: str = "cpu",
                     runtimes: RuntimeSpace | None = None) -> list[Candidate]:
    labels = feats.label_set
    out = [Candidate(feats.scope)]
    if labels <= NO_REMEDY_LABELS:
        return out
    out += _runtime_configs(feats, device, runtimes or RuntimeSpace(), labels)
    rewrites = [False, True] if feats.rewrites else [False]
    for rw in rewrites:
        out += _overhead_configs(feats.scope, rw, device) if labels & set(OVERHEAD_LABELS) else []
        out += _fusion_configs(feats.scope, rw) if labels & WORK_LABELS else []
    if labels & WORK_LABELS:
        out += _layout_precision_configs(feats, device, labels)
    if not labels & (set(OVERHEAD_LABELS) | WORK_LABELS):
        out.append(Candidate(feats.scope, "compile"))
    return out


def _overhead_configs(scope: str, rw: bool, device: str) -> list[Candidate]:
    out = [Candidate(scope, rewrite=True)] if rw else []
    out += [Candidate(scope, "aoti", rewrite=rw), Candidate(scope, "aoti", freezing=True, rewrite=rw),
            *_aoti_autotune_configs(scope, rw),
            Candidate(scope, "compile", cpp_wrapper=True, rewrite=rw), Candidate(scope, "compile", rewrite=rw)]
    if device.startswith("cuda"):
        out.append(Candidate(scope, "cudagraphs", mode="reduce-overhead", rewrite=rw))
    return out


def _fusion_configs(scope: str, rw: bool) -> list[Candidate]:
    mat = "max-autotune-no-cudagraphs"
    return [Candidate(scope, "compile", rewrite=rw), Candidate(scope, "compile", mode=mat, rewrite=rw),
            Candidate(scope, "compile", mode=mat, freezing=True, rewrite=rw),
            Candidate(scope, "aoti", rewrite=rw), Candidate(scope, "aoti", freezing=True, rewrite=rw),
            *_aoti_autotune_configs(scope, rw)]


def _aoti_autotune_configs(scope: str, rw: bool) -> list[Candidate]:
    """AOTInductor with max-autotune: GEMMs benchmarked against Inductor's own templates, which
    fuse their epilogues (bias, activation) — fewer kernels per call and faster small GEMMs, with
    the package's low per-call cost; with and without freezing (prepacked weights)."""
    mat = "max-autotune-no-cudagraphs"
    return [Candidate(scope, "aoti", mode=mat, rewrite=rw), Candidate(scope, "aoti", mode=mat, freezing=True, rewrite=rw)]


def _layout_precision_configs(feats: ScopeFeatures, device: str, labels: set[str]) -> list[Candidate]:
    mat = "max-autotune-no-cudagraphs"
    out = []
    if feats.has_conv:
        for rw in ([False, True] if feats.rewrites else [False]):
            out += [Candidate(feats.scope, "compile", mode=mat, freezing=True, channels_last=True, rewrite=rw),
                    Candidate(feats.scope, "aoti", channels_last=True, rewrite=rw),
                    Candidate(feats.scope, "aoti", freezing=True, channels_last=True, rewrite=rw),
                    Candidate(feats.scope, "aoti", mode=mat, freezing=True, channels_last=True, rewrite=rw)]
    low = "fp16" if device.startswith("cuda") else "bf16"
    out += [Candidate(feats.scope, "aoti", freezing=True, precision=low)]
    if "compute" in labels:
        out.append(Candidate(feats.scope, "compile", mode=mat, freezing=True, precision=low))
    return out


def _runtime_configs(feats: ScopeFeatures, device: str, space: RuntimeSpace, labels: set[str]) -> list[Candidate]:
    """The runtimes at their defaults (ONNX Runtime with all graph optimizations, OpenVINO with the
    latency hint, both at the deployment's threads), on the rewritten module too where rewrites
    apply, and the knobs worth a measurement here: ONNX Runtime's extended level (no NCHWc layout
    transformation, which loses on small convolutions and matrix-vector work); without spinning
    and with the parallel executor where there are threads to spin or share; ONNX Runtime's
    transformer optimizer fusions where the scope holds attention (``fuse``); OpenVINO in bf16
    where the CPU runs it natively and the scope computes, and for the whole model always (bf16 is
    the CPU plugin's default precision there; the accuracy guard still decides); CUDA and TensorRT execution providers
    and Torch-TensorRT (fp16 too) on CUDA. The profile steers the rest (:func:`_steered_knobs`)."""
    scope, out = feats.scope, []
    cuda = device.startswith("cuda")
    for rw in ([False, True] if feats.rewrites else [False]):
        if "ort" in space.backends:
            if cuda:
                out += [Candidate(scope, "ort", rewrite=rw, knobs=(("ep", ep),))
                        for ep in ("cuda", "tensorrt") if ep in space.ort_eps]
            else:
                out.append(Candidate(scope, "ort", rewrite=rw))
        if "openvino" in space.backends and not cuda:
            out.append(Candidate(scope, "openvino", rewrite=rw))
        if "tensorrt" in space.backends and cuda:
            out.append(Candidate(scope, "tensorrt", rewrite=rw))
    if "ort" in space.backends and not cuda:
        out.append(Candidate(scope, "ort", knobs=(("opt", "extended"),)))
        attention = feats.evidence.get("attention")
        if isinstance(attention, dict):    # the transformer optimizer's fusions (see .ort_fusion)
            out.append(Candidate(scope, "ort", knobs=(("fuse", str(attention.get("model_type", "bert"))),)))
    if "openvino" in space.backends and not cuda and space.native_bf16 and (labels & WORK_LABELS or not scope):
        out.append(Candidate(scope, "openvino", precision="bf16"))     # the whole model: OpenVINO's own default
    if not cuda:
        out += _steered_knobs(feats, space, labels)
    if "tensorrt" in space.backends and cuda and labels & WORK_LABELS:
        out.append(Candidate(scope, "tensorrt", precision="fp16"))
    return out


def _steered_knobs(feats: ScopeFeatures, space: RuntimeSpace, labels: set[str]) -> list[Candidate]:
    """The CPU runtimes' knobs the profile says are worth one measurement (the cost models do not
    tell a runtime's settings apart, so the space offers only those the bottleneck makes plausible,
    at most three per runtime and scope):

    - overhead-bound scopes (per-call cost, little work per op): ONNX Runtime's basic level (its
      layout and fusion passes add nodes and copies that a small graph does not earn back) and,
      with several threads, each runtime on one thread (waking a pool costs more than it saves);
    - scopes with work and several threads: ONNX Runtime without spinning and with the parallel
      executor;
    - OpenVINO's throughput hint only for batched inputs on several threads (batch-1 inference
      keeps the latency hint, the default).
    """
    scope, out = feats.scope, []
    overhead = bool(labels & set(OVERHEAD_LABELS))
    several = space.threads > 1
    if "ort" in space.backends:
        if overhead:
            out.append(Candidate(scope, "ort", knobs=(("opt", "basic"),)))
        if several and overhead:
            out.append(Candidate(scope, "ort", knobs=(("threads", "1"),)))
        if several and labels & WORK_LABELS:
            out += [Candidate(scope, "ort", knobs=(("spin", "off"),)),
                    Candidate(scope, "ort", knobs=(("exec", "parallel"),))]
    if "openvino" in space.backends:
        if several and overhead:
            out.append(Candidate(scope, "openvino", knobs=(("threads", "1"),)))
        if several and float(feats.evidence.get("batch") or 1) > 1:
            out.append(Candidate(scope, "openvino", knobs=(("hint", "throughput"),)))
    return out


def choose_scopes(root_feats: ScopeFeatures, sub_feats: list[ScopeFeatures],
                  max_subscopes: int = MAX_SUBSCOPES) -> list[ScopeFeatures]:
    """The whole model plus the hottest non-idle submodule regions that hold real work.

    A region becomes a scope of its own only when it takes at least ``MIN_SCOPE_SHARE`` of the
    model's time: compiling a small region alone pays a backend's fixed cost for little work, and
    the whole-model scope already covers it.
    """
    floor = MIN_SCOPE_SHARE * root_feats.eager_us
    ranked = sorted((f for f in sub_feats if f.bottleneck != "idle" and f.eager_us >= floor),
                    key=lambda f: -float(f.evidence.get("hotness", f.eager_us)))
    return [root_feats, *ranked[:max_subscopes]]


def is_runtime_default(cand: Candidate) -> bool:
    """The whole model on a runtime at its default settings (what a user would deploy instead).
    OpenVINO's CPU plugin computes in bf16 by default where the CPU runs bf16 natively (AVX512-BF16,
    AMX), so there its bf16 candidate is a default too; it is in the space only where the accuracy
    guard admits bf16 (``--rtol``/``--atol``), and the fp32 one stays measured beside it."""
    precision_default = cand.precision == "fp32" or (cand.backend == "openvino" and cand.precision == "bf16")
    return (cand.scope == "" and cand.backend in RUNTIME_BACKENDS and not cand.rewrite and precision_default
            and all(name == "ep" for name, _ in cand.knobs))       # on CUDA: each execution provider
