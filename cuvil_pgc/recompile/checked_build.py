"""Build one candidate's program of a scope and check its first call against eager's outputs.

The search's contract is that a bad candidate never crashes it, so :func:`build_checked` raises
nothing a backend raises: a build or a first call that fails is a ``compile_error`` with its reason
(and the first line native code wrote to stderr meanwhile: AOTInductor's runtime reports a failing
kernel call there, then raises); outputs beyond the guard's tolerances are an ``accuracy_error``; a
build whose region runs the original module here (:func:`~.realized.first_fallback`) is
``runs_original``, since its time and its accuracy would be eager's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from cuvil_pgc.recompile._stderr import Captured, exception_line, first_line, native_stderr
from cuvil_pgc.recompile.accuracy import AccuracyResult, check_outputs
from cuvil_pgc.recompile.apply import ScopeInputs, realize
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.dispatch_state import kept
from cuvil_pgc.recompile.export_error import ExportError
from cuvil_pgc.recompile.realized import first_fallback

if TYPE_CHECKING:
    from cuvil_pgc.recompile.padding import Padding
    from cuvil_pgc.recompile.trials import SearchOptions

log = logging.getLogger(__name__)


@dataclass
class CheckedBuild:
    status: str                                  # ok | compile_error | accuracy_error | runs_original
    call: Callable[[], Any] | None = None        # ok: the program called with the scope's inputs
    reason: str = ""
    check: AccuracyResult | None = None          # the guard's verdict, once the program ran
    export_failed: bool = False                  # an exporter failed (reason names it)

    @property
    def fault(self) -> bool:
        """Outputs no rounding makes (:attr:`~.accuracy.AccuracyResult.garbage`): a later search checks again."""
        return self.check is not None and self.check.garbage


def build_checked(cand: Candidate, module: Any, inputs: ScopeInputs, ref: Any, opt: SearchOptions, *,
                  exact: Any, padding: Padding | None, machine: str, weights: str) -> CheckedBuild:
    """Build ``cand``'s program of ``module``, call it once with ``inputs`` and compare with ``ref``
    (eager's outputs; ``exact``: their float32 form for a model computing in bf16/fp16)."""
    native = Captured()
    try:
        with kept(f"candidate {cand.key}"):
            realized = realize(module, cand, inputs, device=opt.device, machine=machine, weights=weights)
            with native_stderr(native), torch.no_grad():
                out = realized.module(*inputs.args, **inputs.kwargs)
    except Exception as exc:    # any backend failure rejects the candidate, never the search
        said = first_line(native.text)
        # an ExportError's message is composed already (the exporter, the cause cuvil-pgc names, the
        # exporter's own first line, cut): not cut again, where the named cause took the room
        reason = exception_line(exc, 800 if isinstance(exc, ExportError) else 300) + (f" (native: {said})" if said else "")
        log.info("candidate %s rejected: %s", cand.key, reason)
        return CheckedBuild("compile_error", reason=reason, export_failed=isinstance(exc, ExportError))
    if native.text.strip():
        log.debug("candidate %s wrote to stderr: %s", cand.key, native.text.strip()[:2000])
    check = check_outputs(ref, out, rtol=opt.rtol, atol=opt.atol, exact=exact, padding=padding,
                          reduced=cand.reduced)
    if not check.ok:
        reason = check.reason
        if check.garbage:
            reason += (" (far outside the reference's range: a runtime fault more likely than rounding; "
                       "a later search checks it again)")
        return CheckedBuild("accuracy_error", reason=reason, check=check)
    ran_eager = first_fallback(realized.module)
    if ran_eager is not None:       # its figure would be eager's, its accuracy eager's
        reason = f"the build runs the original module here: {ran_eager}"
        log.info("candidate %s rejected: %s", cand.key, reason)
        return CheckedBuild("runs_original", reason=reason, check=check)
    fn = realized.module
    return CheckedBuild("ok", call=lambda: fn(*inputs.args, **inputs.kwargs), check=check)
