"""cuvil_pgc.recompile: profile-guided plan search, verified builds, the build store and compare.

``recompile(model, example_inputs, traces, budget=...) -> Build`` (see :mod:`.build`),
``load_build(path_or_ref, model, fallback=...)``, ``compare`` (see :mod:`.compare`),
``generate_step_call(model, input_ids, ...)`` (a decoding step's or a prefill's example call, see :mod:`.generate_calls`),
``generate_encoder_call(model, input_ids, ...)`` (an encoder-decoder's encoder's). Attributes load
lazily so that importing the package stays cheap (no torch until a function is used).
"""

from __future__ import annotations

from cuvil_pgc._lazy import lazy_getattr

_LAZY = {
    "recompile": ("cuvil_pgc.recompile.build", "recompile"),
    "load_build": ("cuvil_pgc.recompile.load", "load_build"),
    "Build": ("cuvil_pgc.recompile.build", "Build"),
    "LoadReport": ("cuvil_pgc.recompile.load", "LoadReport"),
    "Plan": ("cuvil_pgc.recompile.plan_doc", "Plan"),
    "compare": ("cuvil_pgc.recompile.compare", "compare"),
    "generate_step_call": ("cuvil_pgc.recompile.generate_calls", "generate_step_call"),
    "generate_encoder_call": ("cuvil_pgc.recompile.generate_calls", "generate_encoder_call"),
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
