"""A/B comparison of two ways to run one model: builds, store refs, ``eager`` or ``compile``.

Both contenders are warmed up, then timed in interleaved rounds (ABAB…, order rotating every
round; see :mod:`.measure`). The result follows DESIGN.md's ``compare --json`` shape:
``{"a": {"name", "median_ms", "ci95_ms"}, "b": {...}, "speedup", "speedup_ci95": [lo, hi], "verdict"}``
where ``speedup`` = median(A) / median(B) (above 1: B is faster) and ``verdict`` is ``faster``,
``slower`` or ``same`` for B relative to A: ``same`` when the bootstrap 95 % CI of the ratio
contains 1 (no significant difference). The table of a result is the viewer's
(:mod:`cuvil_pgc.viewer.console_recompile`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cuvil_pgc._eval_mode import eval_mode
from cuvil_pgc._example_inputs import positional_inputs
from cuvil_pgc.recompile.measure import ratio_ci, time_interleaved, verdict

DEFAULT_ROUNDS = 30
KEYWORDS = ("eager", "compile")


def resolve_contender(spec: str, model: Any, *, store: Any = None, pubkey: Any = None,
                      allow_unsigned: bool | None = None,
                      example_inputs: tuple[Any, ...] | None = None) -> Callable[..., Any]:
    """``eager`` → the model; ``compile`` → torch.compile(model); else a build path or store ref.

    A build is loaded by :func:`load_build` with its defaults: refused unless a trusted key signed
    it (or ``allow_unsigned``), and refused when it was made for another model or when every region
    it optimizes changed since (the comparison would time the eager model against itself).
    """
    if spec == "eager":
        return model
    if spec == "compile":
        import torch

        return torch.compile(model)
    from cuvil_pgc.errors import BuildError
    from cuvil_pgc.recompile.load import load_build

    loaded = load_build(spec, model, store=store, pubkey=pubkey, allow_unsigned=allow_unsigned,
                        example_inputs=example_inputs)
    report = loaded.cuvil_load_report
    if report.skipped and not report.applied:
        raise BuildError(f"none of the build's {len(report.skipped)} optimized region(s) applies to this model, "
                         f"all changed since the build ({report.skipped[0]}"
                         f"{', ...' if len(report.skipped) > 1 else ''}): comparing it would time the eager "
                         f"model against itself", path=report.path,
                         fix="recompile this version of the model with `cuvil-pgc recompile`")
    return loaded


def compare_runnables(a: Callable[..., Any], b: Callable[..., Any], example_inputs: tuple[Any, ...], *,
                      names: tuple[str, str] = ("A", "B"), rounds: int = DEFAULT_ROUNDS,
                      warmup: int = 5, seed: int = 0) -> dict[str, Any]:
    """Time ``a`` and ``b`` interleaved on the same inputs; the compare --json document."""
    import torch

    with torch.no_grad():
        samples = time_interleaved({"a": lambda: a(*example_inputs), "b": lambda: b(*example_inputs)},
                                   rounds=rounds, warmup=warmup)
    sa, sb = samples["a"], samples["b"]
    lo, hi = ratio_ci(sa.seconds, sb.seconds, seed=seed)
    return {
        "a": _side(names[0], sa, seed),
        "b": _side(names[1], sb, seed),
        "speedup": round(sa.median_s / sb.median_s, 4),
        "speedup_ci95": [round(lo, 4), round(hi, 4)],
        "verdict": verdict((lo, hi)),
        "rounds": rounds,
        "threads": torch.get_num_threads(),     # what both sides ran at
    }


def _side(name: str, samples: Any, seed: int) -> dict[str, Any]:
    lo, hi = samples.ci95_s(seed=seed)
    return {"name": name, "median_ms": round(samples.median_ms, 6), "ci95_ms": [round(lo * 1e3, 6), round(hi * 1e3, 6)]}


def compare(model: Any, example_inputs: tuple[Any, ...], a: str, b: str, *, store: Any = None,
            pubkey: Any = None, allow_unsigned: bool | None = None, rounds: int = DEFAULT_ROUNDS) -> dict[str, Any]:
    """Compare two contender specs (build path, ``store://`` ref, ``eager``, ``compile``) on ``model``."""
    model = eval_mode(model)
    example_inputs = positional_inputs(model, example_inputs)
    run_a = resolve_contender(a, model, store=store, pubkey=pubkey, allow_unsigned=allow_unsigned)
    run_b = resolve_contender(b, model, store=store, pubkey=pubkey, allow_unsigned=allow_unsigned)
    return compare_runnables(run_a, run_b, example_inputs, names=(a, b), rounds=rounds)
