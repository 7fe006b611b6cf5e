"""The accuracy guard: a candidate's outputs must match eager's on the example inputs.

Outputs may be tensors, numbers, None, tuples/lists (namedtuples too), dicts, dataclasses and
dataclass-like objects (anything with ``__dict__``, e.g. HuggingFace ``ModelOutput``); they are
walked in parallel and every leaf is compared. Floating tensors are compared as
``|out - ref| <= atol + rtol * |ref|`` in float64 with the tolerance of the *reference* dtype;
integer and bool tensors must be equal; shapes and dtypes must match (a candidate that silently
returns bf16 instead of fp32 is wrong). NaN is equal to NaN at the same place.

Default tolerances (:data:`DEFAULT_TOLERANCES`, ``(rtol, atol)`` per reference dtype): float32
allows 1e-4 so that Inductor's reordered reductions and fused math pass, while bf16/fp16 autocast
of an fp32 model (errors around 1e-2) is rejected unless the caller widens ``rtol``/``atol``. For
such a reduced-precision program (``reduced``) the default atol is taken at the scale of each
output, times its largest magnitude where that is below 1: an absolute 1e-4 is 0.5% of the logits
of a randomly initialized timm FastViT (0.02 at most), and OpenVINO's bf16 passed the float32 guard
there, off by 1e-4, a build no user of a float32 model asked for.

A model that computes in bf16 or fp16 itself (a service's ``model.to(torch.bfloat16)``) rounds
every op's output, and a program that fuses ops rounds less: the two differ by eager's own error,
often more than a point-by-point tolerance of its output dtype allows (one bf16 step of the
largest logit, 0.0078, on a logit of 0.3). Given ``exact``, the same model's outputs computed in
float32 (:func:`float32_references`), such an output that fails the point-by-point test passes
where it is no further from the float32 result than eager's is, within
:data:`LOW_PRECISION_MULTIPLIER`, in root-mean-square and in the largest error: the test PyTorch's
own benchmark harness holds compiled fp16/bf16 models to (``torch._dynamo.utils.same`` with its
fp64 reference). Tolerances the caller gives are kept point by point.

Given ``padding`` (:func:`~.padding.padding_of` the call), values at the positions the call's
attention mask marks as padding are not compared: a model's output there is never used and not
defined (see :mod:`.padding`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from cuvil_pgc.recompile.padding import Padding

log = logging.getLogger(__name__)

DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-7, 1e-7),
    "float32": (1e-4, 1e-4),
    "float16": (1e-3, 1e-3),
    "bfloat16": (1.6e-2, 1e-3),
}


#: bump when the guard accepts other outputs: a recorded accuracy verdict of another version is not
#: reused (2: bf16/fp16 outputs held to the float32 result; 3: padded positions not compared; 4: the
#: atol of reduced-precision programs at the outputs' scale)
GUARD_VERSION = 4
#: reference dtypes held to the float32 result where it is known (see the module docstring)
LOW_PRECISION = ("bfloat16", "float16")
#: how much further from the float32 result than eager a low-precision output may be (PyTorch's
#: benchmark harness allows 3x for fp16/bf16)
LOW_PRECISION_MULTIPLIER = 3.0


@dataclass
class AccuracyResult:
    ok: bool
    reason: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    ref_scale: float = 0.0          # the largest finite magnitude among the reference's float values
    #: the largest error as a multiple of what the tolerance allows at its value (inf: not finite)
    excess: float = 0.0
    uncompared: int = 0             # values left out at padded positions

    @property
    def decisive(self) -> bool:
        """Failed by at least :data:`DECISIVE_EXCESS` times the tolerance: more than running the same
        arithmetic in another order (other thread counts, another schedule) changes, so a sibling
        candidate that differs only in such knobs fails too."""
        return not self.ok and self.excess >= DECISIVE_EXCESS

    @property
    def garbage(self) -> bool:
        """Failed with errors no rounding makes: values that are not finite, or off by more than
        :data:`GARBAGE_FACTOR` times the reference's own range (a runtime fault, such as memory
        read before it was written, more likely than a precision verdict)."""
        return not self.ok and (not math.isfinite(self.max_abs_err)
                                or self.max_abs_err > GARBAGE_FACTOR * (1.0 + self.ref_scale))


#: see :attr:`AccuracyResult.garbage`
GARBAGE_FACTOR = 1e3
#: see :attr:`AccuracyResult.decisive`
DECISIVE_EXCESS = 10.0


def check_outputs(reference: Any, candidate: Any, *, rtol: float | None = None,
                  atol: float | None = None, exact: Any = None, padding: Padding | None = None,
                  reduced: bool = False) -> AccuracyResult:
    """Compare ``candidate`` with ``reference``; ``rtol``/``atol`` override the per-dtype defaults;
    ``exact``: the reference's float32 counterpart, for bf16/fp16 outputs; ``padding``: the
    positions left out; ``reduced``: the candidate computes in a lower precision than the
    reference (see the module docstring)."""
    state = AccuracyResult(ok=True)
    try:
        _walk(reference, candidate, "output", state, rtol, atol, exact if rtol is None and atol is None else None,
              padding, reduced and atol is None)
    except _Mismatch as exc:
        state.ok = False
        state.reason = str(exc)
    return state


def admits_rounding(reference: Any, dtype: Any, *, rtol: float | None = None, atol: float | None = None) -> bool:
    """Whether the guard passes ``reference`` with its floating tensors rounded once to ``dtype``.

    A program computing in ``dtype`` (bf16/fp16 autocast) returns outputs that carry at least that
    rounding, so where the tolerances reject it no such program can pass: the search does not
    build one. Leaves the rounding cannot reach (numbers, objects pytree does not walk) stay as
    they are, which only ever admits more."""
    import torch

    def rounded(t: Any) -> Any:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.dtype != dtype:
            return t.detach().to(dtype).to(t.dtype)
        return t

    return check_outputs(reference, torch.utils._pytree.tree_map(rounded, reference), rtol=rtol, atol=atol,
                         reduced=True).ok


def low_precision_left_out(reference: Any, precision: str, dtype: Any, backend: str, blind: float | None, *,
                           rtol: float | None = None, atol: float | None = None) -> str:
    """Why a program computing in ``precision`` (``dtype``) on ``backend`` cannot pass the guard on
    ``reference``, or could only pass a guard that cannot see ("" when it may): every floating
    output lies within atol of 0 (``blind``, :func:`blind_scale`), or the tolerances reject even
    the outputs rounded once to that precision (:func:`admits_rounding`). That holds for autocast
    programs, whose outputs carry the rounding; not for OpenVINO, whose CPU plugin keeps its
    outputs and the layers it deems sensitive in f32 (unseen dwcnn: bf16 passes the default guard
    that the outputs rounded to bf16 fail), so only the guard can tell."""
    if blind is not None:
        return (f"not built: every floating output of this scope lies within the accuracy guard's atol of 0 "
                f"(the largest is {blind:.2g}), so the guard would pass any answer, zeros too; lower --atol "
                f"below the outputs' scale to let {precision} compete")
    if backend == "openvino" or admits_rounding(reference, dtype, rtol=rtol, atol=atol):
        return ""
    return (f"not built: the accuracy guard's tolerances reject the eager outputs rounded once to "
            f"{precision}; widen --rtol/--atol to try {precision}")


def blind_scale(reference: Any, *, rtol: float | None = None, atol: float | None = None) -> float | None:
    """The largest magnitude among ``reference``'s floating values where the guard would pass
    zeros in their place (every one lies within ``atol`` of 0, so the guard cannot tell any answer
    from the model's: a randomly initialized depth head answered 7.9e-8 at most, and OpenVINO's
    bf16 passed it); None where it would not (it sees the floating outputs)."""
    import torch

    def zeros(t: Any) -> Any:
        return torch.zeros_like(t) if isinstance(t, torch.Tensor) and t.is_floating_point() else t

    if not any(isinstance(t, torch.Tensor) and t.is_floating_point() for t in torch.utils._pytree.tree_leaves(reference)):
        return None
    zeroed = check_outputs(reference, torch.utils._pytree.tree_map(zeros, reference), rtol=rtol, atol=atol)
    return zeroed.ref_scale if zeroed.ok else None       # a walk that passed measured every floating value


def float32_references(model: Any, scope_inputs: dict[str, Any], references: dict[str, Any]) -> dict[str, Any]:
    """Per scope whose reference holds bf16 or fp16 tensors: its outputs from a float32 copy of
    ``model`` on its inputs in float32 (``scope_inputs``: scope -> captured ``args``/``kwargs``);
    scopes where that copy or call fails are left out (their outputs are held point by point)."""
    import copy

    import torch

    low = [s for s, ref in references.items() if any(map(_low_precision, torch.utils._pytree.tree_leaves(ref)))]
    if not low:
        return {}

    def wide(t: Any) -> Any:
        return t.float() if _low_precision(t) else t

    try:
        model32 = copy.deepcopy(model).float()
    except Exception as exc:        # a model that cannot be copied: point by point, as before
        log.debug("no float32 reference: %s", exc)
        return {}
    found = {}
    for scope in low:
        inputs = scope_inputs[scope]
        try:
            args, kwargs = torch.utils._pytree.tree_map(wide, (inputs.args, inputs.kwargs))
            with torch.no_grad():
                found[scope] = model32.get_submodule(scope)(*args, **kwargs)
        except Exception as exc:
            log.debug("no float32 reference for %r: %s", scope, exc)
    return found


def _low_precision(t: Any) -> bool:
    """Whether ``t`` is a tensor of a :data:`LOW_PRECISION` dtype."""
    import torch

    return isinstance(t, torch.Tensor) and str(t.dtype).removeprefix("torch.") in LOW_PRECISION


class _Mismatch(Exception):
    pass


def _walk(ref: Any, out: Any, where: str, state: AccuracyResult, rtol: float | None, atol: float | None,
          exact: Any = None, padding: Padding | None = None, scaled: bool = False) -> None:
    import torch

    if isinstance(ref, torch.Tensor):
        if not isinstance(out, torch.Tensor):
            raise _Mismatch(f"{where}: expected a tensor, got {type(out).__name__}")
        _compare_tensor(ref, out, where, state, rtol, atol, exact if isinstance(exact, torch.Tensor) else None,
                        padding, scaled)
    elif ref is None or isinstance(ref, (bool, int, float, complex, str)):
        _compare_scalar(ref, out, where, rtol, atol)
    elif isinstance(ref, dict):
        if not isinstance(out, dict) or set(ref) != set(out):
            raise _Mismatch(f"{where}: dict keys differ")
        for key in ref:
            _walk(ref[key], out[key], f"{where}[{key!r}]", state, rtol, atol,
                  exact.get(key) if isinstance(exact, dict) else None, padding, scaled)
    elif isinstance(ref, (tuple, list)):
        if not isinstance(out, (tuple, list)) or len(ref) != len(out):
            got = f"a {type(out).__name__} of {len(out)}" if isinstance(out, (tuple, list)) else f"a {type(out).__name__}"
            raise _Mismatch(f"{where}: expected a {type(ref).__name__} of {len(ref)}, got {got}")
        parts = exact if isinstance(exact, (tuple, list)) and len(exact) == len(ref) else [None] * len(ref)
        for i, (r, o, x) in enumerate(zip(ref, out, parts, strict=True)):
            _walk(r, o, f"{where}[{i}]", state, rtol, atol, x, padding, scaled)
    elif _has_fields(ref):
        _walk(_fields(ref, where), _fields(out, where), where, state, rtol, atol,
              _fields(exact, where) if exact is not None and _has_fields(exact) else None, padding, scaled)
    else:
        _compare_value(ref, out, where)


def _fields(obj: Any, where: str) -> dict[str, Any]:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    if hasattr(obj, "__dict__"):
        return {k: v for k, v in vars(obj).items() if not k.startswith("_")}
    raise _Mismatch(f"{where}: cannot compare outputs of type {type(obj).__name__}")


def _has_fields(obj: Any) -> bool:
    return (dataclasses.is_dataclass(obj) and not isinstance(obj, type)) or hasattr(obj, "__dict__")


def _compare_value(ref: Any, out: Any, where: str) -> None:
    """A leaf without fields (torch.device, torch.dtype, an enum) compared by equality."""
    try:
        same = type(out) is type(ref) and bool(out == ref)
    except Exception as exc:        # an __eq__ that raises or returns no bool
        raise _Mismatch(f"{where}: cannot compare outputs of type {type(ref).__name__}") from exc
    if not same:
        raise _Mismatch(f"{where}: {out!r} != {ref!r}")


def _compare_scalar(ref: Any, out: Any, where: str, rtol: float | None, atol: float | None) -> None:
    import torch

    if isinstance(out, torch.Tensor):     # AOTInductor returns a `.item()` as a 0-d tensor
        raise _Mismatch(f"{where}: expected a {type(ref).__name__}, got a tensor")
    if isinstance(ref, float) and isinstance(out, (int, float)):
        r, a = DEFAULT_TOLERANCES["float64"]
        if abs(out - ref) > (atol if atol is not None else a) + (rtol if rtol is not None else r) * abs(ref):
            raise _Mismatch(f"{where}: {out!r} != {ref!r}")
    elif out != ref:
        raise _Mismatch(f"{where}: {out!r} != {ref!r}")


def _compare_tensor(ref: Any, out: Any, where: str, state: AccuracyResult, rtol: float | None,
                    atol: float | None, exact: Any = None, padding: Padding | None = None,
                    scaled: bool = False) -> None:
    import torch

    if tuple(ref.shape) != tuple(out.shape):
        raise _Mismatch(f"{where}: shape {tuple(out.shape)} != {tuple(ref.shape)}")
    if ref.dtype != out.dtype:
        raise _Mismatch(f"{where}: dtype {out.dtype} != {ref.dtype}")
    ref64, out64 = ref.detach().cpu(), out.detach().cpu()
    if padding is not None and (keep := padding.compared(ref.shape)) is not None:
        keep = keep.expand(ref.shape)
        state.uncompared += int((~keep).sum())
        ref64, out64 = ref64[keep], out64[keep]
        exact = exact.detach().cpu()[keep] if isinstance(exact, torch.Tensor) and exact.shape == ref.shape else None
    if not (ref.is_floating_point() or ref.is_complex()):
        if not torch.equal(ref64, out64):
            raise _Mismatch(f"{where}: integer/bool values differ")
        return
    default_rtol, default_atol = DEFAULT_TOLERANCES.get(str(ref.dtype).removeprefix("torch."), (1e-4, 1e-4))
    rt = default_rtol if rtol is None else rtol
    at = default_atol if atol is None else atol
    ref64, out64 = ref64.double(), out64.double()
    both_nan = torch.isnan(ref64) & torch.isnan(out64)
    diff = torch.where(both_nan, torch.zeros_like(ref64), (out64 - ref64).abs())
    finite = ref64[torch.isfinite(ref64)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    if scaled and not _low_precision(ref):      # a reduced-precision program: atol at the outputs' scale
        at *= min(1.0, scale)
    if ref64.numel():
        state.ref_scale = max(state.ref_scale, scale)
        worst = float(diff.max())
        state.max_abs_err = worst if math.isnan(worst) else max(state.max_abs_err, worst)
        state.max_rel_err = max(state.max_rel_err, float((diff / ref64.abs().clamp_min(1e-12)).max()))
    allowed = at + rt * ref64.abs()
    bad = ~(diff <= allowed) & ~both_nan
    if bool(bad.any()):
        errors = _errors_from(exact, ref64, out64) if _low_precision(ref) and exact is not None else None
        if errors is not None and errors[0] <= LOW_PRECISION_MULTIPLIER * errors[1] + at / 10 \
                and errors[2] <= LOW_PRECISION_MULTIPLIER * errors[3] + at:
            return          # no further from the float32 result than eager's own rounding
        excess = torch.where(bad, diff / allowed, torch.zeros_like(diff))
        state.excess = max(state.excess, float(excess.nan_to_num(math.inf).max()))
        raise _Mismatch(f"{where}: {int(bad.sum())} of {bad.numel()} values off by up to "
                        f"{float(diff.max()):.3g} (rtol={rt:g}, atol={at:g})"
                        + ("" if errors is None else f"; from the float32 result, rms {errors[0]:.3g} and at most "
                           f"{errors[2]:.3g} against eager's {errors[1]:.3g} and {errors[3]:.3g}"))


def _errors_from(exact: Any, ref64: Any, out64: Any) -> tuple[float, float, float, float] | None:
    """(rms of the candidate's error, of eager's, largest of the candidate's, of eager's), measured
    from ``exact`` (the float32 result); None where it is not comparable (another shape, or values
    that are not finite)."""
    import torch

    x = exact.detach().cpu().double()
    if x.shape != ref64.shape or not bool(torch.isfinite(x).all()) or not x.numel():
        return None
    theirs, eager = out64 - x, ref64 - x
    return (float(theirs.pow(2).mean().sqrt()), float(eager.pow(2).mean().sqrt()),
            float(theirs.abs().max()), float(eager.abs().max()))
