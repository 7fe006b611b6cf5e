"""cuvil_pgc.viewer: present an Analysis — the HTML report (``render_html``, ``write_report``) and
the rich console renderers (:mod:`.console`). Nothing here analyses (DESIGN.md).

Attributes load lazily so that importing the package (the CLI does, to register commands) does
not import plotly.
"""

from __future__ import annotations

from cuvil_pgc._lazy import lazy_getattr

_LAZY = {
    "render_html": ("cuvil_pgc.viewer.html", "render_html"),
    "write_report": ("cuvil_pgc.viewer.html", "write_report"),
}

__all__ = list(_LAZY)


__getattr__ = lazy_getattr(__name__, _LAZY)
