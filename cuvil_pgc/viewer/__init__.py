"""cuvil_pgc.viewer: present an Analysis, a plan and the CLI's results — the HTML report
(``render_html``, ``write_report``), renderers by name (:mod:`.renderers`), every console table
(:mod:`.console` and the ``console_*`` modules) and progress displays. Nothing here analyses
(DESIGN.md).

Attributes load lazily so that importing the package does not import plotly.
"""

from __future__ import annotations

from cuvil_pgc._lazy import lazy_getattr

_LAZY = {
    "render_html": ("cuvil_pgc.viewer.html", "render_html"),
    "write_report": ("cuvil_pgc.viewer.html", "write_report"),
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
