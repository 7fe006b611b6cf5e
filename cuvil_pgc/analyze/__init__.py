"""cuvil_pgc.analyze: hot regions, bottleneck attribution, fusion candidates, rank skew and diff.

``analyze(trace, machine=None, filter=None) -> Analysis`` (see :mod:`.analyzer`); the trace diff is
``cuvil_pgc.analyze.diff.diff(a, b) -> dict`` (not re-exported here: the name is its module's).
Attributes load lazily so that importing the package stays cheap.

``cuvil_pgc.analyze`` names both this package and the public function (``from cuvil_pgc import
analyze``). Whichever of the two Python's import system leaves on ``cuvil_pgc`` (the package, once
a submodule was imported first), ``analyze(trace, ...)`` works: the package is callable and calls
the function.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from cuvil_pgc._lazy import lazy_getattr

_LAZY = {
    "analyze": ("cuvil_pgc.analyze.analyzer", "analyze"),
    "Analysis": ("cuvil_pgc.analyze.analysis", "Analysis"),
    "merge_traces": ("cuvil_pgc.trace.merge", "merge_traces"),   # the trace data's merge, re-exported
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`cuvil_pgc.analyze.analyzer.analyze`."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from cuvil_pgc.analyze.analyzer import analyze as run

        return run(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
