"""The report in a real browser: headless Chromium (Debian's ``chromium``) driven over the DevTools
protocol with a tiny websocket client. Asserts zero console errors, every figure drawn, the hot-region
table sorting and filtering, zoom shared by the timeline panels, and that no hostile string's
script ever runs (``alert`` is hooked before the page loads). Screenshots go to the test's tmp dir.

Needs ``/usr/bin/chromium`` (``apt-get install -y chromium``; .ci/run installs it) and
``websocket-client`` (dev extra); skipped with that reason when Chromium is absent.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from cuvil_pgc.analyze.analyzer import analyze
from cuvil_pgc.recompile.plan_doc import Plan
from cuvil_pgc.trace.reader import load_trace
from cuvil_pgc.viewer.html import SECTIONS, write_report
from tests._report_traces import plan_doc, write_trace
from tests.test_report import MACHINE

pytestmark = pytest.mark.slow

CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and os.path.exists(p)), None)
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         # WebGL (plotly's scattergl) on the software rasterizer, without the deprecation warning
         "--enable-unsafe-swiftshader", "--window-size=1400,1000"]
HOOK = """window.__alerts = []; window.__csp = [];
window.alert = window.confirm = window.prompt = function (m) { window.__alerts.push(String(m)); };
document.addEventListener('securitypolicyviolation', function (e) {
  window.__csp.push(e.violatedDirective + ' ' + e.blockedURI);
});"""
# plotly draws this instead of a WebGL figure when regl cannot run (no WebGL, or eval refused)
NO_WEBGL = "WebGL is not supported"
GL_READY = """(function () { var gl = document.getElementById('plot-timeline')._fullLayout._glcanvas;
  return !!gl && gl.data().some(function (c) { return !!c.regl; }); })()"""


class Browser:
    """One headless Chromium page, driven over the DevTools protocol."""

    def __init__(self, user_data_dir: Path) -> None:
        import websocket

        self.proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={user_data_dir}",
                                      "--remote-debugging-port=0", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port = self._port(user_data_dir / "DevToolsActivePort")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            page = next(t for t in json.load(resp) if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], suppress_origin=True, timeout=60)
        self.events: list[dict[str, Any]] = []
        self._id = 0
        for domain in ("Runtime", "Log", "Page"):
            self.call(f"{domain}.enable")

    def _port(self, path: Path, timeout: float = 30.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            text = path.read_text() if path.exists() else ""
            if text.strip():
                return int(text.split()[0])
            time.sleep(0.05)
        raise TimeoutError("chromium did not open its DevTools port")

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def js(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in result:
            raise AssertionError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def open(self, path: Path, timeout: float = 90.0) -> str:
        self.events.clear()
        self.call("Page.navigate", url=path.resolve().as_uri())
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.js("document.body ? document.body.getAttribute('data-ready') : null")
            if state:
                return state
            time.sleep(0.2)
        raise TimeoutError(f"{path} did not finish rendering in {timeout} s")

    def problems(self) -> list[str]:
        """Console errors, uncaught exceptions, error log entries (CSP violations too) and dialogs."""
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                out.append(json.dumps(p["exceptionDetails"])[:500])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(json.dumps(p.get("args"))[:500])
            elif m == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(p["entry"].get("text", "")[:500])
            elif m == "Page.javascriptDialogOpening":
                out.append(f"dialog: {p.get('message')}")
        return out

    def screenshot(self, path: Path) -> None:
        height = self.js("document.documentElement.scrollHeight")
        shot = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                         clip={"x": 0, "y": 0, "width": 1400, "height": height, "scale": 1})
        path.write_bytes(base64.b64decode(shot["data"]))

    def close(self) -> None:
        try:
            self.ws.close()
        finally:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        pytest.skip("Chromium is not installed: `apt-get install -y chromium` (Debian) to run the browser test")
    pytest.importorskip("websocket", reason="websocket-client is missing: pip install -e '.[dev]'")
    b = Browser(tmp_path_factory.mktemp("chromium-profile"))
    b.call("Page.addScriptToEvaluateOnNewDocument", source=HOOK)
    yield b
    b.close()


def _hostile_report(folder: Path) -> Path:
    paths = [write_trace(folder / f"r{r}.trace.json", gpu=True, rank=r, world=2, slow=1 + 0.3 * r) for r in (0, 1)]
    analysis = analyze(load_trace(*map(str, paths)), machine=MACHINE)
    plan = plan_doc([r.path for r in analysis.regions[:5]])
    build = {"path": "</script><script>alert(13)</script>.cuvilpkg", "name": "m", "version": 1, "created": "-",
             "signed": False}
    return write_report(analysis, folder / "hostile.html", plan=Plan.from_json(plan), build=build,
                        title="<img src=x onerror=alert(14)>")


FIGURES_DRAWN = """Array.from(document.querySelectorAll('div.plot[data-figure]')).map(function (d) {
  return [d.getAttribute('data-figure'), !!d.querySelector('.main-svg'), d.querySelectorAll('canvas').length];
})"""


@pytest.fixture(scope="module")
def hostile_page(browser, tmp_path_factory) -> Path:
    """The hostile two-rank GPU report with a plan, opened once for the tests below (in order)."""
    folder = tmp_path_factory.mktemp("hostile")
    report = _hostile_report(folder)
    assert browser.open(report) == "1"
    browser.screenshot(folder / "report.png")
    return folder


def test_report_renders_without_errors_and_no_payload_runs(browser, hostile_page):
    assert (hostile_page / "report.png").stat().st_size > 10_000
    assert browser.problems() == []
    state = browser.js("window.cuvilReport")
    assert state["errors"] == [] and state["rendered"] == state["expected"] == 6
    drawn = {key: (svg, canvases) for key, svg, canvases in browser.js(FIGURES_DRAWN)}
    assert set(drawn) == {"timeline", "compile", "histograms", "roofline", "ranks", "plan"}
    assert all(svg for svg, _ in drawn.values()), drawn
    assert drawn["timeline"][1] > 0                    # WebGL canvas of the scattergl traces
    assert browser.js("document.querySelector('main').textContent").find(NO_WEBGL) < 0 and browser.js(GL_READY)
    assert browser.js("window.__csp") == []             # nothing needed the CSP to stop it
    assert browser.js("window.__alerts") == []
    assert browser.js("typeof window.__pwned") == "undefined"
    titles = browser.js("Array.from(document.querySelectorAll('section h2')).map(h => h.textContent)")
    assert len(titles) == len(SECTIONS) and browser.js("document.title") == "<img src=x onerror=alert(14)>"


def test_table_sorts_filters_and_timeline_zoom_is_shared(browser, hostile_page):
    column = """Array.from(document.querySelectorAll('#hot-table tbody tr')).map(r => parseFloat(r.cells[3].getAttribute('data-v')))"""
    browser.js("document.querySelectorAll('#hot-table thead th')[3].click()")
    totals = browser.js(column)
    assert totals == sorted(totals, reverse=True) and len(totals) == 10
    browser.js("document.querySelectorAll('#hot-table thead th')[3].click()")
    assert browser.js(column) == sorted(totals)
    browser.js("""(function () { var i = document.querySelector('input.table-filter');
        i.value = 'alert(1)'; i.dispatchEvent(new Event('input')); })()""")
    visible = browser.js("Array.from(document.querySelectorAll('#hot-table tbody tr')).filter(r => !r.hidden).length")
    assert visible == 1
    assert browser.js("document.getElementById('hot-count').textContent") == "1 of 10 shown"
    hovered = None
    for _ in range(30):                                # plotly throttles hover events
        hovered = browser.js("""(function () { var d = document.getElementById('plot-timeline');
            Plotly.Fx.hover(d, {xval: 1.5, yval: 0}, 'xy');
            return d._hoverdata && d._hoverdata.length ? d._hoverdata[0].data.name : null; })()""")
        if hovered:
            break
        time.sleep(0.1)
    assert hovered == "step"                           # hover finds the span under the cursor
    zoomed = browser.js("""Plotly.relayout(document.getElementById('plot-timeline'), {'xaxis2.range': [1, 2]})
        .then(function (d) { return [d._fullLayout.xaxis.range, d._fullLayout.xaxis2.range]; })""")
    assert zoomed[0] == zoomed[1] == [1, 2]            # the region panel follows the utilization panel
    assert browser.problems() == []


def test_cpu_only_report_draws_cpu_utilization(browser, tmp_path):
    trace = write_trace(tmp_path / "cpu.trace.json", names=["encoder", "decoder"], gpu=False)
    report = write_report(analyze(load_trace(str(trace)), machine=MACHINE), tmp_path / "cpu.html")
    assert browser.open(report) == "1"
    browser.screenshot(tmp_path / "cpu.png")
    assert browser.problems() == []
    assert "CPU utilization" in browser.js("document.querySelector('#timeline h2').textContent")
    names = browser.js("document.getElementById('plot-timeline').data.filter(t => t.visible === true || "
                       "t.visible === undefined).map(t => t.name)")
    assert any(n.startswith("cpu_util") for n in names)
    assert browser.js("document.querySelector('main').textContent").find(NO_WEBGL) < 0 and browser.js(GL_READY)
    assert browser.js("window.__csp") == []
    assert browser.js("window.cuvilReport.rendered") == browser.js("window.cuvilReport.expected") >= 4


OVERLAPS = """(function () {
  function boxes(sel) { return Array.from(document.querySelectorAll('#plot-histograms ' + sel))
      .map(e => e.getBoundingClientRect()).filter(r => r.width > 0); }
  var titles = boxes('g.annotation text'), axes = boxes('g[class^="g-x"][class$="title"] text');
  var hits = [];
  titles.forEach(t => axes.forEach(a => { if (t.left < a.right && a.left < t.right && t.top < a.bottom && a.top < t.bottom)
      hits.push([t.top, a.top]); }));
  return [titles.length, axes.length, hits];
})()"""


def test_report_polish_seen_in_the_browser(browser, hostile_page):
    """Histogram subplot titles clear the x-axis titles above them; the timeline's lanes are all
    labelled alike; the plan's tried counts are the CLI's; screenshots of each section are kept."""
    assert browser.open(hostile_page / "hostile.html") == "1"
    titles, axes, hits = browser.js(OVERLAPS)
    assert titles >= 4 and axes >= 4 and hits == []
    labels = browser.js("document.getElementById('plot-timeline')._fullLayout.yaxis.ticktext")
    assert labels and all(" · depth " in label for label in labels)
    tried = browser.js("Array.from(document.querySelectorAll('#plan-table tbody tr td:last-child summary'))"
                       ".map(s => s.textContent)")
    assert tried and all(t == "1 / 1" for t in tried)
    for sid in ("plan", "histograms", "timeline", "operators"):
        rect = browser.js(f"(function () {{ var r = document.getElementById('{sid}').getBoundingClientRect(); "
                          "return [r.x, r.y + window.scrollY, r.width, r.height]; })()")
        shot = browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=True,
                            clip={"x": rect[0], "y": rect[1], "width": rect[2], "height": rect[3], "scale": 1})
        (hostile_page / f"{sid}.png").write_bytes(base64.b64decode(shot["data"]))
    assert browser.problems() == []


MODULE_PATHS = [f"model/model.encoder_blocks/model.encoder_blocks.{i}/model.encoder_blocks.{i}.self_attention_projection"
                for i in range(3)] + ["model/model.classifier_head"]


def _module_report(folder: Path) -> Path:
    """A report as instrument_module names regions, with a plan whose alternatives carry long reasons."""
    trace = write_trace(folder / "modules.trace.json", names=MODULE_PATHS, gpu=False)
    analysis = analyze(load_trace(str(trace)), machine=MACHINE)
    alternatives = [{"config": f"compile:max-autotune+cfg{j}+freezing+cpp_wrapper", "scope": "", "predicted_ms": 0.9,
                     "measured_ms": 1.1, "status": "ok" if j % 3 else "compile_error", "reused_record": False,
                     "reason": None if j % 3 else "InductorError: LoweringException: a long reason " * 4}
                    for j in range(8)]
    plan = plan_doc([])
    plan["regions"] = [{**plan["regions"][0], "chosen": "compile:max-autotune-no-cudagraphs+freezing",
                        "alternatives": alternatives}]
    plan["regions"] += [{"path": p, "scope": p.rpartition("/")[2], "bottleneck": "launch_overhead", "evidence": {},
                         "chosen": "merged into <model>: compile:max-autotune-no-cudagraphs+freezing",
                         "predicted_ms": 0.5, "measured_ms": 0.6, "baseline_ms": 1.0, "alternatives": alternatives[:3]}
                        for p in MODULE_PATHS]
    plan["stale"] = []
    build = {"path": "out/model.cuvilpkg", "name": "model", "version": 1, "created": "2026-12-02", "signed": True}
    return write_report(analysis, folder / "modules.html", plan=Plan.from_json(plan), build=build, title="modules")


# Where an identifier's text wraps to a new line, the character before the break: only '.', '/'
# (the <wbr> after them) or a space may end a line.
MID_WORD_BREAKS = """(function () {
  var bad = [];
  document.querySelectorAll('.path').forEach(function (el) {
    var walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT), node, prevTop = null, prev = '';
    while ((node = walker.nextNode())) {
      for (var i = 0; i < node.data.length; i++) {
        var range = document.createRange(); range.setStart(node, i); range.setEnd(node, i + 1);
        var rects = range.getClientRects();
        if (!rects.length) { continue; }
        if (prevTop !== null && rects[0].top > prevTop + 2 && './ '.indexOf(prev) < 0) {
          bad.push(el.textContent.slice(0, i) + ' | ' + el.textContent.slice(i));
        }
        prevTop = rects[0].top; prev = node.data[i];
      }
    }
  });
  return bad;
})()"""
TABLE_OVERFLOW = """Array.from(document.querySelectorAll('table')).filter(function (t) {
  var wrap = t.closest('.table-wrap');
  var scrolls = wrap && ['auto', 'scroll'].indexOf(getComputedStyle(wrap).overflowX) >= 0;
  return !scrolls && t.getBoundingClientRect().width > t.parentElement.clientWidth + 1;
}).map(t => t.id || t.className)"""
MODEBAR_ON_TITLES = """(function () {
  var bar = document.querySelector('#plot-histograms .modebar').getBoundingClientRect();
  return Array.from(document.querySelectorAll('#plot-histograms g.annotation text')).map(e => e.getBoundingClientRect())
    .filter(t => t.left < bar.right && bar.left < t.right && t.top < bar.bottom && bar.top < t.bottom).length;
})()"""


def test_identifiers_wrap_at_separators_and_tables_stay_in_the_page(browser, tmp_path):
    """Region names break only after '.' or '/' (not 'model.encoder_bloc / ks.0'); the plan table,
    its opened alternatives included, fits the page or scrolls inside its frame; the modebar covers
    no histogram title; timeline lanes sit close together."""
    report = _module_report(tmp_path)
    for width in (1400, 1000):
        browser.call("Emulation.setDeviceMetricsOverride", width=width, height=1000, deviceScaleFactor=1, mobile=False)
        try:
            assert browser.open(report) == "1"
            assert browser.js(MID_WORD_BREAKS) == []
            assert browser.js(TABLE_OVERFLOW) == []
            assert browser.js("document.documentElement.scrollWidth <= document.documentElement.clientWidth")
            browser.js("document.querySelectorAll('#plan-table details').forEach(d => d.open = true)")
            assert browser.js(MID_WORD_BREAKS) == [] and browser.js(TABLE_OVERFLOW) == []
            if width == 1400:     # room enough: the whole plan table, opened lists too, without scrolling
                assert browser.js("(function () { var t = document.getElementById('plan-table'); "
                                  "return t.scrollWidth <= t.closest('.table-wrap').clientWidth; })()")
                browser.screenshot(tmp_path / "modules.png")
            assert browser.js(MODEBAR_ON_TITLES) == 0
            lane_px = browser.js("(function () { var y = document.getElementById('plot-timeline')._fullLayout.yaxis; "
                                 "return y._length / y.ticktext.length; })()")
            assert 12 <= lane_px <= 40        # pixels of the region panel per lane: no empty band
            assert browser.problems() == []
        finally:
            browser.call("Emulation.clearDeviceMetricsOverride")
