"""What a search has shown will fail, so that it rejects a candidate without building it.

Three memories, each filled by a build that failed (:meth:`Rejections.learn`):

- an exporter (torch.export, torch.onnx.export, openvino.convert_model, ...) that failed on a
  scope's module, rewritten or not, fails the same way for every candidate of the scope through
  it: its backend's options cannot change what the exporter sees;
- a program that failed the accuracy guard decisively (:attr:`~.accuracy.AccuracyResult.decisive`)
  fails it with every knob that only schedules the work (:attr:`~.candidates.Candidate.arithmetic_key`);
- a scope whose build ran its original module (a hook inside it, which no program calls) runs it
  in every build.

A decoding call's candidates whose regions run only their captured sizes are not built either.
A candidate so rejected is not counted against the budget, which is left for candidates that may
pass (a rewrite, another precision or backend).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cuvil_pgc.recompile.accuracy import AccuracyResult
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.checked_build import CheckedBuild
from cuvil_pgc.recompile.export_error import exporter_of_reason
from cuvil_pgc.recompile.other_shapes import BACKENDS as OTHER_SIZE_BACKENDS


@dataclass
class Rejections:
    #: the call's sizes change from call to call (a decoding step's cache, a prompt's length)
    sizes_vary: bool = False
    unexportable: dict[tuple[str, bool, str], str] = field(default_factory=dict)  # (scope, rewritten, exporter) -> why
    inaccurate: dict[str, str] = field(default_factory=dict)      # Candidate.arithmetic_key -> why
    runs_original: dict[str, str] = field(default_factory=dict)   # scope -> why its builds run its original module

    def learn(self, cand: Candidate, built: CheckedBuild) -> None:
        """Remember what ``cand``'s failed build showed of its siblings."""
        if built.export_failed:
            self.export_failed(cand, built.reason)
        elif built.check is not None and built.check.decisive and not built.check.garbage:
            self.inaccurate_arithmetic(cand, built.check)
        elif built.status == "runs_original":
            self.original_runs(cand.scope, built.reason)

    def export_failed(self, cand: Candidate, reason: str) -> None:
        """An exporter failed on ``cand``'s module (``reason`` names it): remember why, once per scope."""
        self.unexportable.setdefault((cand.scope, cand.rewrite, exporter_of_reason(reason)),
                                     f"{cand.config} showed that {reason}")

    def inaccurate_arithmetic(self, cand: Candidate, check: AccuracyResult) -> None:
        """``cand`` failed the guard decisively: so would each candidate computing as it does."""
        self.inaccurate.setdefault(cand.arithmetic_key, f"{cand.config} failed the accuracy guard by "
                                   f"{check.excess:.3g}x its tolerance ({check.reason}), and the knobs "
                                   "between them only schedule the work")

    def original_runs(self, scope: str, why: str) -> None:
        """Every build of ``scope`` runs its original module here, for ``why``."""
        self.runs_original.setdefault(scope, why)

    def why_not_built(self, cand: Candidate) -> tuple[str, str] | None:
        """``(status, why)`` when this search already showed that ``cand`` would fail; None when it may pass."""
        from cuvil_pgc.recompile.runtime_build import exporters

        why = next((self.unexportable[k] for k in ((cand.scope, cand.rewrite, e) for e in exporters(cand.backend))
                    if k in self.unexportable), None)
        if why is not None:
            return "compile_error", why
        if cand.arithmetic_key in self.inaccurate:
            return "accuracy_error", self.inaccurate[cand.arithmetic_key]
        if cand.scope in self.runs_original:
            return "runs_original", self.runs_original[cand.scope]
        if self.sizes_vary and cand.backend not in ("eager", *OTHER_SIZE_BACKENDS):
            # one call of a generation at most: a prefill's torch.compile build ran none of a
            # service's prompts. Its place in the space still counts for the budget, which the
            # AOTInductor variants a decoding step wins with need (max-autotune: 1.4-1.7x ONNX Runtime)
            return "not_measured", (f"a {cand.backend} region runs only its captured sizes, and this call's sizes "
                                    "change from call to call (a decoding step's cache, a prompt's or a source's length)")
        return None
