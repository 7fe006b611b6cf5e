"""Analysis: the analyzer's result, pure data consumed by the viewer and the recompiler.

An Analysis never holds raw trace events: it holds per-region statistics with their evidence,
fusion candidates, the compile summary, the machine model used, trace facts, and the compact
timeline the viewer draws (region spans and utilization counters, already reduced to what a
report needs). ``to_json()`` gives the ``analyze --json`` document (DESIGN.md; extend, never
rename); ``from_json`` reads it back (the recompiler and ``report --build`` use saved analyses).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from cuvil_pgc.analyze.vocabulary import NAMES

BOTTLENECKS = NAMES          # the class names, from the one table (analyze.vocabulary)
#: the pseudo-region of the ops and kernels outside every region
OUTSIDE = "(outside regions)"


@dataclass
class RegionStats:
    """One region path aggregated over all its calls (and all merged sources)."""

    path: str
    calls: int
    total_us: float
    self_us: float
    mean_us: float
    p50_us: float
    p95_us: float
    p99_us: float
    share: float                      # total_us / run duration (0..1; can exceed 1 over threads)
    hotness: float                    # what recompiling could save, in µs (see hot_regions docs)
    bottleneck: str                   # one of BOTTLENECKS
    confidence: float                 # 0..1
    evidence: dict[str, Any] = field(default_factory=dict)
    parent: str | None = None         # parent region path (call tree)
    depth: int = 0
    histogram: dict[str, list[float]] = field(default_factory=dict)   # {"edges_us": [...], "counts": [...]}
    top_ops: list[dict[str, Any]] = field(default_factory=list)        # [{"name", "calls", "total_us", "flops", "bytes"}]


@dataclass
class FusionCandidate:
    """A frequent consecutive op/kernel sequence inside a hot region."""

    region: str
    ops: list[str]
    occurrences: int
    total_us: float
    bytes_saved: float                # intermediate bytes a fusion would not write and re-read
    est_saving_us: float = 0.0


@dataclass
class Timeline:
    """What the viewer draws on the time axis (µs from trace start)."""

    spans: dict[str, list] = field(default_factory=dict)      # columns: path, lane, ts_us, dur_us, depth, bottleneck
    counters: dict[str, dict[str, list]] = field(default_factory=dict)  # name -> {"ts_us": [...], "value": [...]}
    compile_spans: dict[str, list] = field(default_factory=dict)   # columns: graph, phase, ts_us, dur_us, cache, reason


@dataclass
class Analysis:
    regions: list[RegionStats]
    fusion_candidates: list[FusionCandidate] = field(default_factory=list)
    compile: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)     # sources, duration_us, events, dropped, samplers, devices, warnings
    timeline: Timeline = field(default_factory=Timeline)
    ranks: dict[str, Any] = field(default_factory=dict)     # per-region cross-rank skew (multi-rank runs)
    operators: list[dict[str, Any]] = field(default_factory=list)   # top OperatorStats rows (analyze.operators)

    def region(self, path: str) -> RegionStats | None:
        return next((r for r in self.regions if r.path == path), None)

    def regionless(self) -> bool:
        """Whether the trace had no regions: its only "region" is the time outside every region."""
        return all(r.path == OUTSIDE for r in self.regions)

    def to_json(self, include_timeline: bool = False) -> dict[str, Any]:
        """The ``analyze --json`` document."""
        doc = {
            "regions": [asdict(r) for r in self.regions],
            "fusion_candidates": [asdict(f) for f in self.fusion_candidates],
            "compile": self.compile,
            "machine": self.machine,
            "trace": self.trace,
        }
        if self.ranks:
            doc["ranks"] = self.ranks
        if self.operators:
            doc["operators"] = self.operators
        if include_timeline:
            doc["timeline"] = asdict(self.timeline)
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Analysis:
        return cls(
            regions=[RegionStats(**r) for r in doc.get("regions", [])],
            fusion_candidates=[FusionCandidate(**f) for f in doc.get("fusion_candidates", [])],
            compile=doc.get("compile", {}),
            machine=doc.get("machine", {}),
            trace=doc.get("trace", {}),
            timeline=Timeline(**doc["timeline"]) if "timeline" in doc else Timeline(),
            ranks=doc.get("ranks", {}),
            operators=doc.get("operators", []),
        )
