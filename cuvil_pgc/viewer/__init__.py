"""cuvil_pgc.viewer: present an Analysis — the HTML report (``render_html``, ``write_report``) and
the rich console renderers (:mod:`.console`). Nothing here analyses (DESIGN.md).

Attributes load lazily so that importing the package (the CLI does, to register commands) does
not import plotly.
"""

from __future__ import annotations

from typing import Any

_LAZY = {
    "render_html": ("cuvil_pgc.viewer.html", "render_html"),
    "write_report": ("cuvil_pgc.viewer.html", "write_report"),
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    try:
        module_name, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'cuvil_pgc.viewer' has no attribute {name!r}") from None
    import importlib

    value = getattr(importlib.import_module(module_name), attr)
    globals()[name] = value
    return value
