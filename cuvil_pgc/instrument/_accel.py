"""The optional C accelerator of regions, the trace writer and aggregate folds.

``fastregion`` is the extension built from ``_fastregion.c`` at install (setup.py), or None where
it was not built (no compiler, free-threaded Python) or ``CUVIL_PGC_PURE_PYTHON`` is set; every
user has a pure-Python version of what it speeds up.
"""

from __future__ import annotations

import os
from types import ModuleType

fastregion: ModuleType | None
try:
    if os.environ.get("CUVIL_PGC_PURE_PYTHON"):
        raise ImportError("CUVIL_PGC_PURE_PYTHON is set")
    from cuvil_pgc.instrument import _fastregion as fastregion
except ImportError:
    fastregion = None
