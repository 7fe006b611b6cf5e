"""Probing a program for other sizes: the sizes it is checked at and the ranges it runs.

A region's program exported with its sizes left free (:mod:`.other_shapes`) ships for the sizes it
passed the accuracy guard at: each size the exporter named is checked down to 1 and up to a ceiling
(:data:`GROWTH` times the captured size, at least :data:`MIN_CEILING`, or the one the module names:
:meth:`~.cache_step.CacheStep.size_ceilings`), doubling, with the boundary bisected
(:func:`checked_sizes`), and each range ends where the program stops being faster than the
original module (:func:`faster_ranges`, timed by :mod:`.size_speed`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from cuvil_pgc.recompile import size_speed
from cuvil_pgc.recompile._stderr import first_line, native_stderr
from cuvil_pgc.recompile.accuracy import check_outputs, float32_references
from cuvil_pgc.recompile.apply import ScopeInputs
from cuvil_pgc.recompile.padding import padding_of


class OtherShapesError(RuntimeError):
    """Why a region has no program for other sizes (the build ships without it)."""


#: how far above its captured size a dimension is checked (the larger of the two): calls above the
#: largest size checked run the original module. A module may name the largest size a dimension is
#: checked at instead (``size_ceilings(args)``: a decoding step's cache length, up to the model's
#: positions or, below them, the longest cache its sliding window keeps whole)
GROWTH, MIN_CEILING = 16, 64


def faster_ranges(runner: Any, module: nn.Module, args: tuple[Any, ...], names: list[list[str]],
                   ranges: dict[str, tuple[int, int]]) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """``ranges`` each ending where the program stops being faster than ``module`` (see
    :mod:`.size_speed`), and why those that end early do."""
    captured = {name: n for a, dims in zip(args, names, strict=True) if isinstance(a, torch.Tensor)
                for name, n in zip(dims, a.shape, strict=True) if name}
    out, why = {}, []
    for name, (lo, hi) in ranges.items():
        timed = size_speed.timer(lambda a: runner(*a), lambda a: module(*a),
                                 lambda size, name=name: resized(args, names, {name: size}))
        top, reason = size_speed.faster_up_to(captured[name], hi, timed)
        out[name] = (lo, top)
        if reason is not None:
            why.append(f"{where_named(names, name)} takes {lo} to {top}: {reason}")
    return out, why


def ceilings_of(module: nn.Module, args: tuple[Any, ...]) -> dict[tuple[int, int], int]:
    """(input, dimension) -> the largest size to check it at, where ``module`` names one in place of
    the default (``size_ceilings``: see :meth:`~.cache_step.CacheStep.size_ceilings`)."""
    named = getattr(module, "size_ceilings", None)
    return dict(named(args)) if callable(named) else {}


def checked_sizes(runner: Any, module: nn.Module, args: tuple[torch.Tensor, ...], free: list[list[str]],
           rtol: float | None, atol: float | None, alone_probes: bool = True,
           ceilings: dict[tuple[int, int], int] | None = None) -> tuple[list[list[str]], dict[str, tuple[int, int]], list[str]]:
    """The accuracy guard at the captured inputs and at other sizes: (each input's dimensions as the
    name of a size that varies, "" where it stays fixed; each name's range of sizes checked; why
    the sizes that stay fixed do).

    The exporter names some free dimensions apart where the model needs them equal (token ids and
    their attention mask): a named size that cannot change alone (the model refuses it, or the
    program answers differently) varies together with the others of its captured size that cannot
    either, as one. Each is then checked: down to 1 and up to :data:`GROWTH` times its captured size
    (at least :data:`MIN_CEILING`; for a size one of whose dimensions ``ceilings`` names, up to the
    largest it names there where that is larger), doubling, with the boundary of the sizes the original module
    takes found by bisection; the range the program passed at is the range it runs (a size the
    model refuses, more positions than it has or an assertion, never reaches the program, whose
    runtime may answer it anyway or be left in a broken state). Checking both ends catches a
    forward that branches on the size. A named size at which the program fails or answers
    differently stays fixed; then all that vary change together once. The captured values are
    tiled or cropped, so token ids stay valid ids. Without ``alone_probes`` the sizes captured
    equal always vary together."""
    compare(runner, module, args, rtol, atol, quiet=True)
    captured = {name: n for a, dims in zip(args, free, strict=True) if isinstance(a, torch.Tensor)
                for name, n in zip(dims, a.shape, strict=True) if name}

    def alone(name: str) -> bool:
        try:
            return compare(runner, module, resized(args, free, {name: captured[name] + 1}), rtol, atol, quiet=True)
        except OtherShapesError:
            return False
    # a size that cannot change alone varies with the others of its captured size that cannot
    # either. Sizes captured at 1 (a batch of one request; free in torch.onnx.export's programs)
    # vary together, never alone: in eager a batch-1 attention mask broadcasts over ids of any
    # batch, so the mask's batch could change alone, the ids' had no partner and stayed fixed, and
    # every batched call of a Hugging Face encoder ran the original module.
    # A size that cannot change alone ties every size captured equal to it, those that could
    # change alone too: a Llama took a mask longer than its ids but not ids longer than their mask,
    # and with only the ids' size tied (to nothing) neither varied with the other, so every call at
    # another length ran the original module.
    # A size that changed alone by one but fails further out, where a partner of its captured size
    # exists, is tried again tied to it: a BERT took ids of batch 6 beside a mask of batch 2 (its
    # all-ones mask dropped), its program answered that call otherwise, and the ids' batch stayed
    # fixed for a service that never sends such a call.
    solo = {name: n != 1 and alone_probes and alone(name) for name, n in captured.items()}
    named, ranges, refused, retry = _ranges(runner, module, args, free, captured, solo, rtol, atol, ceilings or {})
    if retry:
        again = _ranges(runner, module, args, free, captured, {**solo, **dict.fromkeys(retry, False)}, rtol, atol,
                        ceilings or {})
        if _widest(free, again[0], again[1], retry) > _widest(free, named, ranges, retry):
            named, ranges, refused, _ = again
    if not ranges:
        raise OtherShapesError("; ".join(refused) or "the original module takes no other size in any "
                                                     "dimension the exporter left free")
    if len(ranges) > 1:
        compare(runner, module, resized(args, named, {name: min(captured[name] + 1, hi)
                                                        for name, (_, hi) in ranges.items()}), rtol, atol,
             quiet=True)
    return [[name if name in ranges else "" for name in dims] for dims in named], ranges, refused


def _ranges(runner: Any, module: nn.Module, args: tuple[torch.Tensor, ...], free: list[list[str]],
            captured: dict[str, int], solo: dict[str, bool], rtol: float | None, atol: float | None,
            ceilings: dict[tuple[int, int], int]) -> tuple[list[list[str]], dict[str, tuple[int, int]], list[str],
                                                           dict[str, int]]:
    """For :func:`checked_sizes`: the names each input's dimensions vary as (those not ``solo`` tied to
    every name of their captured size), the range each passed at, why the others failed, and the
    ``solo`` names that failed where a name of their captured size exists (name -> size)."""
    tied = {n for name, n in captured.items() if not solo[name]}
    by_size: dict[int, str] = {}
    group = {name: by_size.setdefault(n, name) if n in tied else name for name, n in captured.items()}
    named = [[group[name] if name else "" for name in dims] for dims in free]
    ranges: dict[str, tuple[int, int]] = {}
    refused, retry = [], {}
    for name in dict.fromkeys(group.values()):
        def check(size: int, name: str = name) -> bool:
            return compare(runner, module, resized(args, named, {name: size}), rtol, atol, quiet=True)
        n = captured[name]
        named_ceilings = [c for (i, j), c in ceilings.items()
                          if i < len(named) and j < len(named[i]) and named[i][j] == name]
        ceiling = min(named_ceilings) if named_ceilings else max(GROWTH * n, MIN_CEILING)
        try:
            lo, hi, failed = probe_range(check, n, ceiling)
        except OtherShapesError as exc:
            refused.append(str(exc))               # fixed at its captured size
        else:
            if lo < hi:
                ranges[name] = (lo, hi)
            if failed is None:
                continue
            refused.append(f"{where_named(named, name)} takes {lo} to {hi} only: {failed}")
        if solo[name] and any(o != name and n == captured[name] for o, n in captured.items()):
            retry[name] = captured[name]
    return named, ranges, refused, retry


def _widest(free: list[list[str]], named: list[list[str]], ranges: dict[str, tuple[int, int]],
            names: Iterable[str]) -> int:
    """The widest range ``names`` (the exporter's) vary in, where ``named`` groups them (-1: none varies)."""
    wanted = set(names)
    return max((ranges[group][1] - ranges[group][0] for dims, groups in zip(free, named, strict=True)
                for name, group in zip(dims, groups, strict=True) if name in wanted and group in ranges), default=-1)


def where_named(named: list[list[str]], name: str) -> str:
    """"dimension 1 of input 2": the first dimension varying as ``name``."""
    return next(f"dimension {d} of input {i}" for i, dims in enumerate(named) for d, n in enumerate(dims) if n == name)


def probe_range(raw_check: Any, n: int, ceiling: int) -> tuple[int, int, str | None]:
    """The smallest and largest size around the captured ``n`` (up to ``ceiling``) at which
    ``check`` passed, probing both ends (see :func:`checked_sizes`), and why a size beyond them failed on the program (None: the
    original module refused it); ``check(size)`` is False where the original module refuses the
    size, and raises where the program fails or answers differently. A size the program fails at
    bounds the range as one the model refuses does (a Speech2Text's program took decoder ids up to
    its position table's 64, where eager grows the table: every other length stayed fixed); one
    failing on both sides of ``n`` keeps the size fixed, and raises."""
    failed: list[str] = []

    def check(size: int) -> bool:
        try:
            return raw_check(size)
        except OtherShapesError as exc:
            failed.append(str(exc))
            return False

    lo = n
    if n > 1:
        if check(n - 1):
            lo = n - 1
            if n - 1 > 1:
                lo = 1 if check(1) else _bisect(check, ok=n - 1, refused=1)
    hi, size = n, n + 1
    while size <= ceiling:
        if not check(size):
            hi = _bisect(check, ok=hi, refused=size)
            break
        hi = size
        size = ceiling if size < ceiling < 2 * size else 2 * size
    if failed and lo == hi == n:
        raise OtherShapesError(failed[0])
    return lo, hi, failed[0] if failed else None


def _bisect(check: Any, ok: int, refused: int) -> int:
    """The size nearest ``refused`` (from ``ok``'s side) that ``check`` passes."""
    while abs(refused - ok) > 1:
        mid = (ok + refused) // 2
        if check(mid):
            ok = mid
        else:
            refused = mid
    return ok


def compare(runner: Any, module: nn.Module, args: tuple[torch.Tensor, ...], rtol: float | None,
             atol: float | None, quiet: bool = False) -> bool:
    """Whether the original module takes ``args``; raises :class:`OtherShapesError` where the
    program fails or answers differently. ``quiet`` (the build's probes, offline): what the
    runtime writes to stderr as it fails stays off the terminal, its exception says it (ONNX
    Runtime logs each failed run in red: GPT-2's program at batch 2, where the build then keeps
    the batch fixed)."""
    with torch.no_grad():
        try:
            reference = module(*args)
        except Exception:
            return False
        try:
            with native_stderr() if quiet else contextlib.nullcontext():
                result = runner(*args)
        except Exception as exc:
            raise OtherShapesError(f"it failed at sizes {shapes_text(args)}: {type(exc).__name__}: "
                                   f"{first_line(str(exc), 200)}") from exc
    padding = padding_of(module, args)
    verdict = check_outputs(reference, result, rtol=rtol, atol=atol, padding=padding)
    if not verdict.ok and rtol is None and atol is None:      # a bf16/fp16 model: its float32 result decides
        exact = float32_references(module, {"": ScopeInputs(args)}, {"": reference}).get("")
        if exact is not None:
            verdict = check_outputs(reference, result, exact=exact, padding=padding)
    if not verdict.ok:
        raise OtherShapesError(f"it failed the accuracy guard at sizes {shapes_text(args)}: {verdict.reason}")
    return True


def within_limits(runner: Any, free: list[list[str]], limits: dict[str, tuple[int, int | None]]) -> Any:
    """``runner`` refusing, before it runs, inputs with a size (named in ``free``) outside the
    sizes ``limits`` says its program was exported for: an AOTInductor package does not check them,
    and its kernels run outside them index past their buffers or divide by zero, which ends the
    process (a MobileViT's program, exported for images of 57-144 pixels, ended the recompile with
    "Floating point exception" at a probe of a smaller one, and with "double free or corruption"
    at 32). The probes take such a size as one the program fails at, which bounds its range."""
    if not limits:
        return runner

    def run(*args: Any) -> Any:
        for t, names in zip(args, free, strict=True):
            if not isinstance(t, torch.Tensor):
                continue
            for name, n in zip(names, t.shape, strict=True):
                lo, hi = limits.get(name, (0, None))
                if n < lo or hi is not None and n > hi:
                    raise OtherShapesError(f"size {n} is outside the sizes {lo}-{'' if hi is None else hi} its "
                                           "program was exported for")
        return runner(*args)
    return run


def resized(args: tuple[torch.Tensor, ...], free: list[list[str]], new: dict[str, int]) -> tuple[torch.Tensor, ...]:
    """``args`` with the dimensions of the symbols in ``new`` at those sizes, values tiled or cropped."""
    out = []
    for t, names in zip(args, free, strict=True):
        if not isinstance(t, torch.Tensor) or t.dim() == 0:   # None, a constant or a scalar: as captured
            out.append(t)
            continue
        shape = [new.get(name, n) if name else n for name, n in zip(names, t.shape, strict=True)]
        reps = [-(-s // n) if n else 1 for s, n in zip(shape, t.shape, strict=True)]
        out.append(t.repeat(*reps)[tuple(slice(0, s) for s in shape)].contiguous())
    return tuple(out)


def shapes_text(args: tuple[torch.Tensor | None, ...]) -> str:
    return ", ".join(str(tuple(a.shape)) if isinstance(a, torch.Tensor) else repr(a) for a in args)
