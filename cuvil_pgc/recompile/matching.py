"""Regions of a profile ↔ submodules of the model being recompiled.

``instrument_module`` names each region by the module's qualified path with the root prefix
(``model.layer1.0.conv1``; nested regions join names with "/", so the last component is the
module's own name). :func:`match_regions` maps every region path to a submodule by that name and
checks it with a structural hash (module type, parameter and buffer names/shapes/dtypes, the
source of ``forward``, recursively over children) when the profile recorded one
(``evidence["structure"]``) or at least the module class (``evidence["module"]``). A region whose
module is gone, renamed or changed is *stale*: it is listed with the reason and not used, so a
profile of a slightly different model version still steers the unchanged regions. Regions that
are not modules (a user's ``ProfileRegion("preprocess")``) are listed as unmatched.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cuvil_pgc._structure import structural_hash  # noqa: F401  (re-exported: recompile's name for it)
from cuvil_pgc.recompile.profiler_modules import profiled_qualname

if TYPE_CHECKING:
    from cuvil_pgc.analyze.analysis import Analysis


@dataclass
class RegionMatch:
    path: str                 # region path in the profile
    qualname: str             # submodule path in the model ("" = the root)
    module_type: str
    structure: str
    stats: Any                # analyze.analysis.RegionStats


@dataclass
class StaleRegion:
    path: str
    reason: str


@dataclass
class MatchResult:
    matched: list[RegionMatch] = field(default_factory=list)
    stale: list[StaleRegion] = field(default_factory=list)
    unmatched: list[str] = field(default_factory=list)   # regions that are not modules

    def foreign_profile(self) -> str | None:
        """A warning when no module region of the profile fits this model (a trace recorded from
        another model, or before the model changed): the search then runs without its guidance."""
        if self.matched or not self.stale:
            return None
        return (f"cuvil-pgc: none of the profile's {len(self.stale)} module region(s) fit this model (e.g. "
                f"{self.stale[0].path}: {self.stale[0].reason}); was the trace recorded from another model? "
                "The search runs without the profile's guidance: profile this model to recompile it with it")

    def by_qualname(self) -> dict[str, RegionMatch]:
        out: dict[str, RegionMatch] = {}
        for m in self.matched:     # several regions (call sites) may map to one module: keep the hottest
            if m.qualname not in out or m.stats.total_us > out[m.qualname].stats.total_us:
                out[m.qualname] = m
        return out




def input_signature(args: Any) -> str:
    """Shapes, dtypes, devices and layouts of the tensors in ``args`` (nested), as a short hash."""
    import torch
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten(args)
    parts = [str(spec)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            parts.append(f"T{tuple(leaf.shape)}{leaf.dtype}{leaf.device}{leaf.is_contiguous()}")
        else:
            parts.append(f"V{leaf!r}")
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def region_module_name(path: str) -> str:
    """The last component of a region path: the region's own name."""
    return path.rsplit("/", 1)[-1]


def match_regions(analysis: Analysis | None, model: Any, call_names: dict[str, str] | None = None) -> MatchResult:
    """Map the analysis' regions to ``model``'s submodules by module path and structure; a model
    that holds the profiled one at ``model.profiled_path`` (a decoding step's
    :class:`~.cache_step.CacheStep`) is matched from there. ``call_names``
    (:func:`~.profiler_modules.module_call_names`) maps torch.profiler's module regions too."""
    modules = dict(model.named_modules())
    roots = _root_prefixes(analysis)
    inside = getattr(model, "profiled_path", "")
    result = MatchResult()
    for stats in analysis.regions:
        name = region_module_name(stats.path)
        qualname = _qualname(name, roots)
        if qualname is None and call_names:
            qualname = profiled_qualname(stats.path, call_names)
        if qualname is None:
            result.unmatched.append(stats.path)
            continue
        if inside:
            qualname = f"{inside}.{qualname}" if qualname else inside
        module = modules.get(qualname)
        if module is None:
            result.stale.append(StaleRegion(stats.path, f"no submodule {qualname!r} in this model "
                                                        "(renamed or removed since the profile)"))
            continue
        reason = _structure_mismatch(stats, module)
        if reason:
            result.stale.append(StaleRegion(stats.path, reason))
            continue
        result.matched.append(RegionMatch(stats.path, qualname, type(module).__name__,
                                          structural_hash(module), stats))
    return result


def _root_prefixes(analysis: Analysis | None) -> set[str]:
    """Names of root regions: dot-free names whose children are named ``name.child``, and a
    top-level dot-free region that :func:`~cuvil_pgc.instrument.module.instrument_module` recorded
    (its module in the evidence) without children: a TorchScript or ``torch.compile``-d model, whose
    submodules get no regions, or a model without submodules. Without it, such a model's root was
    unmatched and its bottleneck "unknown" to the search."""
    names = {region_module_name(r.path) for r in analysis.regions}
    dotted = {n.split(".", 1)[0] for n in names if "." in n}
    alone = {r.path for r in analysis.regions if "/" not in r.path and "." not in r.path and (r.evidence or {}).get("module")}
    return {n for n in names if "." not in n and n in dotted} | dotted | alone


def _qualname(name: str, roots: set[str]) -> str | None:
    head, _, rest = name.partition(".")
    if head not in roots:
        return None
    return rest


def _structure_mismatch(stats: Any, module: Any) -> str:
    evidence = stats.evidence or {}
    recorded = evidence.get("structure")
    if recorded and not structural_hash(module).startswith(recorded):
        return ("module structure changed since the profile (parameter shapes, type or forward code), or the "
                "profile was recorded by a cuvil-pgc with another structure hash: re-profile to apply it")
    module_type = evidence.get("module")
    if module_type and module_type != type(module).__name__:
        return f"module type changed: profiled {module_type}, now {type(module).__name__}"
    return ""
