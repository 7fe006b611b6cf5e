"""The report page skeleton, escaping of user data, and the Content-Security-Policy.

Contract: every string that comes from a trace, a build or the command line reaches the page
through one of three doors, and only them:

- :func:`text` for HTML markup (bidi and control characters made visible, then HTML-escaped);
- :func:`plot_text` for strings plotly draws (names, hover text, titles): plotly renders a subset
  of HTML in them, so they are escaped the same way and shown literally;
- :func:`script_json` for data embedded in ``<script type="application/json">``: JSON whose
  ``<``, ``>``, ``&``, U+2028 and U+2029 are ``\\uXXXX`` escapes, so no data can end the element.

:func:`page` assembles the document: plotly.js once (inline, or the CDN with an SRI hash), the
figures as one JSON block, and one script of ours that calls ``Plotly.newPlot`` for each figure
div. The CSP admits exactly those scripts by their sha256 (no inline handlers, no other source),
so even a string that escaped the escaping could not run. ``'unsafe-eval'`` stays: plotly's WebGL
traces (regl) build their draw commands with ``Function``; without it ``scattergl`` silently shows
"WebGL is not supported". No data reaches ``eval``: the figures are read with ``JSON.parse``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import re
from importlib import resources
from typing import Any

import orjson

from cuvil_pgc.analyze import vocabulary

PLOTLY_MODES = ("inline", "cdn")
# Bidi controls (Trojan-source style reordering) and C0/C1 controls other than tab and newline.
_INVISIBLE = re.compile("[\u202a-\u202e\u2066-\u2069\u200e\u200f\u061c\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_SCRIPT_UNSAFE = re.compile("[<>&\u2028\u2029]")


def visible(value: Any) -> str:
    """``str(value)`` with bidi overrides and control characters shown as ``<U+XXXX>``."""
    return _INVISIBLE.sub(lambda m: f"<U+{ord(m.group()):04X}>", "" if value is None else str(value))


def text(value: Any) -> str:
    """A user string for HTML text or a quoted attribute value."""
    return html.escape(visible(value), quote=True)


def plot_text(value: Any, limit: int | None = None) -> str:
    """A user string for plotly text (legend names, hover text, titles), shown literally; cut to
    ``limit`` characters keeping the end (region paths differ most in their last components)."""
    s = visible(value)
    if limit is not None and len(s) > limit:
        s = "…" + s[len(s) - limit + 1:]
    return html.escape(s, quote=False)


def script_json(obj: Any) -> str:
    """JSON that is safe inside a ``<script>`` element (see the module docstring)."""
    raw = orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS).decode()
    return _SCRIPT_UNSAFE.sub(lambda m: _SCRIPT_ESCAPES[m.group()], raw)


def asset(name: str) -> str:
    """Text of ``cuvil_pgc/viewer/assets/<name>`` (package data)."""
    return resources.files("cuvil_pgc.viewer").joinpath("assets", name).read_text(encoding="utf-8")


def _sha256(source: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode() + "'"


def plotly_tags(mode: str) -> tuple[str, list[str]]:
    """The ``<script>`` that brings plotly.js, and the CSP script sources that admit it."""
    from plotly.offline import get_plotlyjs

    source = get_plotlyjs()
    if mode == "inline":
        return f"<script>{source}</script>", [_sha256(source)]
    from plotly.io._utils import plotly_cdn_url

    url = plotly_cdn_url()
    sri = "sha256-" + base64.b64encode(hashlib.sha256(source.encode("utf-8")).digest()).decode()
    origin = "/".join(url.split("/")[:3])
    return (f'<script src="{html.escape(url)}" integrity="{sri}" crossorigin="anonymous"></script>',
            [origin])


def csp(script_sources: list[str]) -> str:
    return ("default-src 'none'; script-src " + " ".join(script_sources) + " 'unsafe-eval'; "
            "style-src 'unsafe-inline'; img-src data: blob:; font-src data:; connect-src 'none'; "
            "worker-src blob:; base-uri 'none'; form-action 'none'; object-src 'none'")


def page(*, title: str, header: str, nav: str, body: str, figures: dict[str, Any], plotly_js: str) -> str:
    """The whole document. ``header``, ``nav`` and ``body`` are markup built with :func:`text`."""
    plotly_tag, sources = plotly_tags(plotly_js)
    script = asset("report.js")
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{csp([*sources, _sha256(script)])}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<meta name="referrer" content="no-referrer">',
        f"<title>{text(title)}</title>",
        f"<style>{asset('report.css')}\n{vocabulary.css()}</style>",
        "</head><body>",
        header, nav, f"<main>{body}</main>",
        f'<script type="application/json" id="cuvil-figures">{script_json(figures)}</script>',
        plotly_tag,
        f"<script>{script}</script>",
        "</body></html>",
    ])
