"""The HTML report: sections, one plotly.js, escaping of hostile strings (static proof), missing data,
large timelines, the report command with --build, atomic writes, and progress only on terminals."""

from __future__ import annotations

import base64
import hashlib
import json
import re
from html.parser import HTMLParser

import pytest

from cuvil_pgc.analyze.analysis import Analysis, RegionStats, Timeline
from cuvil_pgc.analyze.analyzer import analyze
from cuvil_pgc.analyze.machine import MachineModel
from cuvil_pgc.recompile.plan_doc import Plan
from cuvil_pgc.trace.reader import load_trace
from cuvil_pgc.viewer import render_html, write_report
from cuvil_pgc.viewer.html import SECTIONS
from tests._report_traces import HOSTILE, plan_doc, write_trace

MACHINE = MachineModel(device="cpu", name="test cpu", fingerprint="t", peak_flops={"fp32": 100e9}, mem_bw=10e9,
                       dispatch_overhead_s=3e-6)


class Page(HTMLParser):
    """Everything the static checks need: scripts, attributes, text, section ids and headings."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.scripts: list[tuple[dict, str]] = []
        self.attrs: list[tuple[str, str, str]] = []
        self.sections: dict[str, list[str]] = {}
        self.text: list[str] = []
        self.csp = ""
        self._in_script: dict | None = None
        self._script_text: list[str] = []
        self._section: str | None = None
        self._in_h2 = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.attrs += [(tag, k, v or "") for k, v in attrs]
        if tag == "script":
            self._in_script, self._script_text = a, []
        elif tag == "section":
            self._section = a.get("id")
            self.sections[self._section] = []
        elif tag == "h2":
            self._in_h2 = True
        elif tag == "meta" and a.get("http-equiv") == "Content-Security-Policy":
            self.csp = a["content"]

    def handle_endtag(self, tag):
        if tag == "script" and self._in_script is not None:
            self.scripts.append((self._in_script, "".join(self._script_text)))
            self._in_script = None
        elif tag == "h2":
            self._in_h2 = False

    def handle_data(self, data):
        if self._in_script is not None:
            self._script_text.append(data)
            return
        self.text.append(data)
        if self._in_h2 and self._section:
            self.sections[self._section].append(data)


def parse(document: str) -> Page:
    page = Page()
    page.feed(document)
    page.close()
    return page


@pytest.fixture(scope="module")
def gpu_two_ranks(tmp_path_factory) -> Analysis:
    d = tmp_path_factory.mktemp("traces")
    paths = [write_trace(d / f"r{r}.trace.json", gpu=True, rank=r, world=2, slow=1 + 0.3 * r) for r in (0, 1)]
    return analyze(load_trace(*map(str, paths)), machine=MACHINE)


@pytest.fixture(scope="module")
def hostile_document(gpu_two_ranks) -> str:
    plan = plan_doc([r.path for r in gpu_two_ranks.regions[:5]])
    build = {"path": HOSTILE[1] + ".cuvilpkg", "name": HOSTILE[0], "version": 1, "created": HOSTILE[2],
             "signed": False, "signature_verified": False}
    return render_html(gpu_two_ranks, plan=Plan.from_json(plan), build=build, title=HOSTILE[2])


def _figures(page: Page) -> dict:
    data = [body for attrs, body in page.scripts if attrs.get("type") == "application/json"]
    assert len(data) == 1
    return json.loads(data[0])


def test_every_section_has_an_id_a_heading_and_plotly_is_inlined_once(hostile_document):
    from plotly.offline import get_plotlyjs

    page = parse(hostile_document)
    for sid, _label in SECTIONS:
        assert sid in page.sections, sid
        assert "".join(page.sections[sid]).strip(), f"section {sid} has no heading"
    assert hostile_document.count(get_plotlyjs()) == 1
    figures = _figures(page)
    assert set(figures) == {"timeline", "compile", "histograms", "roofline", "ranks", "plan", "_template"}
    divs = {v for tag, k, v in page.attrs if tag == "div" and k == "data-figure"}
    assert divs == set(figures) - {"_template"}
    assert "Region timeline and SM utilization" in page.sections["timeline"][0]


def test_timeline_shares_x_between_spans_and_sm_utilization(gpu_two_ranks):
    from cuvil_pgc.viewer.figures import timeline_figure

    fig = timeline_figure(gpu_two_ranks)
    kinds = {t["type"] for t in fig["data"]}
    assert kinds == {"scattergl"}
    util = [t for t in fig["data"] if t.get("legendgroup") == "util"]
    assert util and all(t["xaxis"] == "x2" for t in util)
    assert fig["layout"]["xaxis"]["matches"] == "x2"       # shared x: zooming one zooms both
    shown = [t["name"] for t in util if t.get("visible") is not False and t.get("visible") != "legendonly"]
    assert shown and all(n.startswith("sm_util") for n in shown)


def test_hostile_strings_cannot_run_static_proof(hostile_document):
    page = parse(hostile_document)
    executable = [(a, body) for a, body in page.scripts if a.get("type") != "application/json"]
    # ours only: plotly.js and report.js, both admitted by their sha256 in the CSP, nothing else
    assert len(executable) == 2 and all(not a.get("src") for a, _ in executable)
    for _attrs, body in executable:
        digest = base64.b64encode(hashlib.sha256(body.encode()).digest()).decode()
        assert f"'sha256-{digest}'" in page.csp
    assert "'unsafe-inline'" not in page.csp.split("script-src")[1].split(";")[0]
    assert not [(t, k) for t, k, _v in page.attrs if k.lower().startswith("on")]
    assert not [v for _t, k, v in page.attrs if k in ("href", "src") and "javascript:" in v.lower()]
    raw_json = [body for a, body in page.scripts if a.get("type") == "application/json"][0]
    assert not re.search(r"[<>&\u2028\u2029]", raw_json)
    assert "\u202e" not in hostile_document        # bidi override shown as <U+202E>, never applied
    shown = "".join(page.text)
    for s in HOSTILE[:4]:
        assert s in shown, s                       # displayed literally, as text
    figures_text = json.dumps(_figures(page))
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in figures_text   # plotly draws it as text too
    assert "<script>" not in figures_text and "<img" not in figures_text


def test_missing_data_renders_a_note_in_every_section():
    empty = Analysis(regions=[])
    page = parse(render_html(empty))
    assert set(page.sections) == {sid for sid, _ in SECTIONS}
    assert _figures(page) == {}
    text = " ".join(page.text)
    assert "No torch.compile activity recorded in this trace." in text
    assert "Single rank" in text and "No recompile plan" in text and "No region call latencies" in text


def test_region_without_evidence_and_json_roundtrip_render(gpu_two_ranks):
    doc = gpu_two_ranks.to_json(include_timeline=True)
    again = Analysis.from_json(json.loads(json.dumps(doc)))
    assert "hot-table" in render_html(again)
    bare = Analysis(regions=[RegionStats(path="r", calls=1, total_us=1, self_us=1, mean_us=1, p50_us=1, p95_us=1,
                                         p99_us=1, share=1, hotness=0, bottleneck="idle", confidence=0)])
    assert "hot-table" in render_html(bare)


def test_cdn_mode_references_the_cdn_with_integrity(gpu_two_ranks):
    from plotly.offline import get_plotlyjs

    document = render_html(gpu_two_ranks, plotly_js="cdn")
    page = parse(document)
    srcs = [a["src"] for a, _ in page.scripts if a.get("src")]
    assert len(srcs) == 1 and srcs[0].startswith("https://cdn.plot.ly/")
    assert get_plotlyjs()[:2000] not in document
    assert "https://cdn.plot.ly" in page.csp
    assert [a.get("integrity", "") for a, _ in page.scripts if a.get("src")][0].startswith("sha256-")


def test_hot_region_table_is_sortable_and_filterable(gpu_two_ranks):
    page = parse(render_html(gpu_two_ranks))
    tables = {v for t, k, v in page.attrs if t == "table" and k == "id"}
    assert "hot-table" in tables
    assert ("input", "data-table", "hot-table") in page.attrs
    sort_values = [v for t, k, v in page.attrs if t == "td" and k == "data-v"]
    assert any(re.fullmatch(r"[0-9.e+-]+", v) for v in sort_values)


def _big_analysis(n_spans: int) -> Analysis:
    import numpy as np

    rng = np.random.default_rng(0)
    ts = np.sort(rng.uniform(0, 5e6, n_spans))
    paths = [f"model/layer{i % 60}/block" for i in range(n_spans)]
    spans = {"path": paths, "lane": [f"r0 pid 1 tid {i % 3}" for i in range(n_spans)], "ts_us": ts.tolist(),
             "dur_us": rng.uniform(1, 50, n_spans).tolist(), "depth": [i % 4 for i in range(n_spans)],
             "bottleneck": ["launch_overhead"] * n_spans}
    series = {"ts_us": np.linspace(0, 5e6, 2000).tolist(), "value": [50.0] * 2000}
    counters = {"cpu_util.process": series, **{f"cpu_util.cpu{i}": series for i in range(40)}}
    return Analysis(regions=[], timeline=Timeline(spans=spans, counters=counters))


def test_large_timeline_is_decimated_and_compact():
    from cuvil_pgc.viewer import figures

    analysis = _big_analysis(figures.MAX_DRAWN_SPANS + 10_000)
    fig = figures.timeline_figure(analysis)
    span_traces = [t for t in fig["data"] if t.get("legendgroup") != "util"]
    drawn = sum(len(t["x"]) for t in span_traces) // 3
    assert drawn == figures.MAX_DRAWN_SPANS
    assert len(span_traces) == figures.MAX_SPAN_TRACES + 1           # hot paths + "other regions"
    from cuvil_pgc.viewer.template import script_json

    util = [t for t in fig["data"] if t.get("legendgroup") == "util"]
    assert len(util) == figures.MAX_UTIL_SERIES and util[0]["name"] == "cpu_util.process"
    assert util[0].get("visible", True) is True and util[1]["visible"] == "legendonly"
    assert (len(script_json(fig)) - len(script_json(util))) / drawn < 60   # bytes per drawn span


def test_write_report_is_atomic(tmp_path, gpu_two_ranks, monkeypatch):
    target = tmp_path / "report.html"
    target.write_text("old report")
    import cuvil_pgc.viewer.html as html_mod

    def broken(*a, **k):
        raise RuntimeError("render failed")

    monkeypatch.setattr(html_mod, "render_html", broken)
    with pytest.raises(RuntimeError):
        write_report(gpu_two_ranks, target)
    assert target.read_text() == "old report"
    monkeypatch.undo()
    write_report(gpu_two_ranks, target)
    assert target.read_text().startswith("<!DOCTYPE html>")
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]


def _cli(args: list[str], capsys) -> tuple[int, str, str]:
    from cuvil_pgc.cli import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_report_command_with_build_and_errors(tmp_path, capsys, monkeypatch):
    from tests._buildkit import make_build, rezip

    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    trace = write_trace(tmp_path / "run.trace.json")
    machine = tmp_path / "machine.json"
    MACHINE.save(machine)
    plan = plan_doc(["step/encoder"])
    build = make_build(tmp_path / "m.cuvilpkg", members={"plan.json": json.dumps(plan).encode()})
    out_html = tmp_path / "out.html"
    code, _out, err = _cli(["report", str(trace), "-o", str(out_html), "--build", str(build)], capsys)
    assert code == 1 and "without a trusted key" in err and not out_html.exists()     # unsigned: refused
    code, out, err = _cli(["report", str(trace), "-o", str(out_html), "--build", str(build), "--allow-unsigned",
                           "--machine", str(machine), "--title", "My <run>", "--filter", "step"], capsys)
    assert code == 0, err
    assert "wrote" in out and out_html.exists()
    page = parse(out_html.read_text())
    assert "My <run>" in "".join(page.text)
    assert "compile(mode=max-autotune) step/encoder" in "".join(page.text)
    assert "plan" in _figures(page)
    # no progress bar when stderr is not a terminal (at most the opt-in's log line)
    assert all("nobody vouches for" in line for line in err.splitlines())

    def swap_plan(entries):
        evil = json.dumps(plan_doc(["<script>alert(12)</script>"])).encode()
        return [(info, evil if info.filename == "plan.json" else data) for info, data in entries]

    tampered = rezip(build, tmp_path / "bad.cuvilpkg", swap_plan)
    code, _out, err = _cli(["report", str(trace), "-o", str(tmp_path / "x.html"), "--build", str(tampered),
                            "--allow-unsigned"], capsys)
    assert code == 1 and "bad.cuvilpkg" in err and not (tmp_path / "x.html").exists()

    code, _out, err = _cli(["report", str(trace), "-o", str(out_html), "--plotly-js", "nope"], capsys)
    assert code == 1 and "--plotly-js" in err
    code, _out, err = _cli(["report", str(tmp_path / "missing.json"), "-o", str(out_html)], capsys)
    assert code == 1 and "missing.json" in err
    code, _out, err = _cli(["report", str(trace), "-o", str(tmp_path / "no" / "dir" / "r.html")], capsys)
    assert code == 1 and "does not exist" in err
    code, _out, err = _cli(["report", str(trace), "-o", str(tmp_path)], capsys)
    assert code == 1 and "cannot write the report" in err


def test_progress_only_on_interactive_terminals():
    import io

    from rich.console import Console

    from cuvil_pgc.viewer.progress import stage_progress

    piped = io.StringIO()
    with stage_progress(2, console=Console(file=piped)) as progress:
        with progress.stage("loading"):
            pass
    assert piped.getvalue() == "" and not progress.shown

    tty = io.StringIO()
    console = Console(file=tty, force_terminal=True, force_interactive=True, width=80)
    with stage_progress(2, console=console) as progress:
        with progress.stage("loading traces"):
            assert progress.shown
            console.file.flush()
    assert "loading traces" in tty.getvalue()


def test_roofline_data_places_regions_and_ops_under_the_roofs(gpu_two_ranks):
    from cuvil_pgc.analyze.roofline import roofline_data

    cpu_only = Analysis(regions=[
        RegionStats(path="mm", calls=2, total_us=10, self_us=10, mean_us=5, p50_us=5, p95_us=5, p99_us=5, share=0.5,
                    hotness=1, bottleneck="compute", confidence=0.9,
                    evidence={"device": "cpu", "intensity": 20.0, "achieved_flops_s": 5e10},
                    top_ops=[{"name": "aten::mm", "kind": "op", "calls": 2, "total_us": 8.0, "flops": 4e5, "bytes": 2e4},
                             {"name": "aten::view", "kind": "op", "calls": 2, "total_us": 1.0, "flops": 0.0, "bytes": 0.0}]),
        RegionStats(path="py", calls=1, total_us=5, self_us=5, mean_us=5, p50_us=5, p95_us=5, p99_us=5, share=0.2,
                    hotness=1, bottleneck="host_bound", confidence=0.7, evidence={"device": "cpu", "intensity": None})],
        machine={"cpu": MACHINE.to_json()})
    data = roofline_data(cpu_only)
    assert data["roofs"] == [{"device": "cpu", "dtype": "fp32", "peak_flops": 100e9, "mem_bw": 10e9, "ridge": 10.0,
                              "source": "measured", "name": "test cpu"}]
    assert [p["path"] for p in data["regions"]] == ["mm"]
    assert data["ops"] == [{"name": "aten::mm", "region": "mm", "device": "cpu", "intensity": 20.0,
                            "flops_s": 4e5 / 8e-6, "total_us": 8.0, "calls": 2.0}]
    from cuvil_pgc.viewer.figures import roofline_figure

    fig = roofline_figure(data)
    assert fig["layout"]["xaxis"]["type"] == fig["layout"]["yaxis"]["type"] == "log"
    roof = fig["data"][0]
    assert roof["y"][1] == 100e9 and roof["x"][1] == 10.0          # the ridge point
    gpu = roofline_data(gpu_two_ranks)
    assert {(r["device"], r["dtype"]) for r in gpu["roofs"]} >= {("cpu", "fp32"), ("cuda", "fp32"), ("cuda", "bf16")}


def test_compile_figure_marks_breaks_misses_and_recompiles_with_reasons(gpu_two_ranks):
    from cuvil_pgc.viewer.figures import compile_figure

    fig = compile_figure(gpu_two_ranks)
    bars = {t["name"] for t in fig["data"] if t["type"] == "bar"}
    marks = {t["name"]: t for t in fig["data"] if t["type"] == "scatter"}
    assert {"frame", "dynamo", "inductor"} <= bars
    assert set(marks) == {"graph break", "cache miss", "recompile"}
    assert "guard failed" in marks["recompile"]["text"][0]
    assert "&lt;img src=x onerror=alert(8)&gt;" in marks["graph break"]["text"][0]
    rows = set(fig["layout"]["yaxis"]["categoryarray"])
    assert {"r0 0/0 · frame", "r1 0/0 · frame", "r0 0/0 · events"} <= rows      # two ranks: rows per rank
    assert compile_figure(Analysis(regions=[])) is None


def test_histograms_prefer_regions_with_several_calls_and_plan_speedups():
    from cuvil_pgc.viewer.figures import histogram_figure, plan_figure

    def region(path, calls):
        return RegionStats(path=path, calls=calls, total_us=1, self_us=1, mean_us=1, p50_us=1, p95_us=1, p99_us=1,
                           share=0, hotness=0, bottleneck="idle", confidence=0,
                           histogram={"edges_us": [1.0, 2.0, 4.0], "counts": [calls - 1.0, 1.0]})

    fig = histogram_figure(Analysis(regions=[region("once", 1), region("many", 5)]))
    assert [t["name"] for t in fig["data"]] == ["many"]
    assert fig["data"][0]["y"] == [4.0, 1.0, 1.0] and fig["layout"]["xaxis"]["type"] == "log"
    plan = {"regions": [{"path": "a", "baseline_ms": 2.0, "predicted_ms": 1.0, "measured_ms": 0.8},
                        {"path": "b", "baseline_ms": None, "predicted_ms": 1.0}]}
    fig = plan_figure(Plan.from_json(plan))
    assert [t["y"] for t in fig["data"]] == [[2.0], [2.5]]
    assert plan_figure(Plan()) is None


def test_partial_plan_and_kineto_gpu_trace_render():
    page = parse(render_html(analyze("tests/data/kineto_gpu/gpu_two_regions.json", machine=MACHINE),
                             plan=Plan.from_json({"format": 1})))
    text = " ".join(page.text)
    assert "The plan lists no regions." in text and "NVIDIA H100" in text
    assert "No torch.compile activity recorded in this trace." in text
    assert "timeline" in _figures(page)
    assert "Region timeline and SM utilization" in page.sections["timeline"][0]
    assert "No SM utilization samples" in text


def test_plan_section_counts_tried_as_the_cli_and_names_default_tolerances():
    from cuvil_pgc.viewer._run_sections import plan_section
    from cuvil_pgc.viewer.console_recompile import plan_view
    from tests._report_traces import plan_doc

    plan = plan_doc(["model/model.blocks/model.blocks.0/model.blocks.0.attn"])
    plan["regions"][1]["alternatives"] += [{"config": "aoti", "status": "ok"}, {"config": "x", "status": "not_measured"}]
    plan["tolerances"] = {"rtol": None, "atol": None}        # the defaults were used
    plan = Plan.from_json(plan)
    html = plan_section(plan, {"path": "b.cuvilpkg", "name": "m", "version": 3, "created": "2026-01-02"}, False)
    cli = {r["path"]: r["tried"] for r in plan_view(plan).rows}
    assert cli["model/model.blocks/model.blocks.0/model.blocks.0.attn"] == "2/1"
    assert "<summary>2 / 1 (3 considered)</summary>" in html
    assert "m v3, created 2026-01-02" in html and "model.<wbr>blocks.<wbr>0.<wbr>attn</bdi>" in html   # breaks after separators only
    assert "rtol -" not in html and "defaults per output dtype (" in html and "float32 rtol 0.0001" in html


def test_timeline_lanes_are_labelled_alike():
    from cuvil_pgc.viewer.figures import lane_labels

    assert lane_labels([("r0 pid 5 tid 7", 0), ("r0 pid 5 tid 7", 1), ("r0 pid 5 tid 9", 0)]) == [
        "thread 7 · depth 0", "thread 7 · depth 1", "thread 9 · depth 0"]
    assert lane_labels([("r0 pid 5 tid 7", 0), ("r1 pid 6 tid 7", 0)]) == [
        "r0 pid 5 tid 7 · depth 0", "r1 pid 6 tid 7 · depth 0"]


def test_a_plan_json_document_renders_as_its_typed_plan(gpu_two_ranks):
    """write_report/render_html take build.plan or a plan.json dict alike; a document that is not a
    plan is a ConfigError, not an AttributeError from deep inside the renderer."""
    from cuvil_pgc.errors import ConfigError

    doc = plan_doc(["step/encoder"])
    typed = render_html(gpu_two_ranks, plan=Plan.from_json(doc), title="t")
    as_dict = render_html(gpu_two_ranks, plan=doc, title="t")
    assert 'id="plan-table"' in as_dict
    generated = re.compile(r"generated [0-9-]+ [0-9:]+ UTC")       # the header's clock
    assert generated.sub("", as_dict) == generated.sub("", typed)
    with pytest.raises(ConfigError, match="not a plan"):
        render_html(gpu_two_ranks, plan={"choices": "nope", "regions": 3}, title="t")
