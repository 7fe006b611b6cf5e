"""The ``cuvil-pgc`` command: every command of every stage lives in this package.

:func:`main` is the console script (and ``python -m cuvil_pgc``), :data:`app` the Typer app
(:mod:`.app`). One module per command group, named for it: ``profile`` (profile, capture),
``analyze`` (analyze, summary, diff), ``ops``, ``calibrate``, ``fleet`` (export, sql),
``report``, ``recompile`` (recompile, compare), ``builds`` (keygen, verify, builds ...),
``demo``, ``cache``, ``doctor``. The commands import the stages (trace, instrument, analyze,
recompile) and present with the viewer; no stage imports this package.
"""

from __future__ import annotations

from cuvil_pgc.cli.app import app, main
from cuvil_pgc.cli.output import emit_json

__all__ = ["app", "emit_json", "main"]
