"""Honest timings under contention: the trace's counters, the run queue and the spread of repeated
timings are read, and the figures printed from a busy window say so (the load is faked at its seams)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from cuvil_pgc.analyze import contention
from cuvil_pgc.cli import app
from tests._tracebuild import build_trace, op, region


def _util(total: float, process: float, n: int = 20) -> list[dict]:
    out = []
    for i in range(n):
        out += [{"name": "cpu_util.total", "ts": i * 10.0, "value": total},
                {"name": "cpu_util.process", "ts": i * 10.0, "value": process}]
    return out


def _events() -> list[dict]:
    events = []
    for i in range(10):
        events += [region("model/model.fc", i * 20.0, 15.0), op("aten::addmm", i * 20.0 + 1, 12.0, flops=1e6, bytes=1e4)]
    return events


@pytest.fixture
def busy_host(monkeypatch):
    monkeypatch.setattr(contention, "_read_loadavg", lambda: (8.0, 9))
    monkeypatch.setattr(contention, "usable_cores", lambda: 2)


def test_trace_counters_mark_contention_and_lower_confidence():
    from cuvil_pgc.analyze import analyze

    quiet = analyze(build_trace(_events(), counters=_util(total=55.0, process=50.0)))
    busy = analyze(build_trace(_events(), counters=_util(total=100.0, process=20.0)))
    assert quiet.trace["contention"]["contended_fraction"] == 0.0
    assert busy.trace["contention"] == {"samples": 20, "contended_fraction": 1.0, "others_pct_median": 80.0}
    assert any("other processes held 80% of the CPU" in w for w in busy.trace["warnings"])
    for q, b in zip(quiet.regions, busy.regions, strict=True):
        assert b.confidence == pytest.approx(q.confidence * 0.5, abs=1e-3)
        assert b.evidence["contended_fraction"] == 1.0


def test_run_queue_against_cores(monkeypatch, busy_host):
    load = contention.host_load()
    assert load == {"load1": 8.0, "running": 9, "cores": 2, "per_core": 4.0, "contended": True}
    assert "load average 8.0 on 2 cores (4.0 per core)" in contention.load_warning(load, "speedups")
    monkeypatch.setattr(contention, "_read_loadavg", lambda: (2.0, 2))
    assert contention.load_warning(contention.host_load()) is None


def test_spread_of_repeated_timings():
    assert contention.spread_warning("eager", 1.0, (0.95, 1.05)) is None
    assert "spread widely (95% interval 60%" in contention.spread_warning("build", 1.0, (0.8, 1.4))


def test_profile_warns_on_a_busy_machine(tmp_path, monkeypatch, busy_host):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work.py").write_text("sum(range(1000))\n")
    result = CliRunner().invoke(app, ["profile", "--no-ops", "--gpu", "off", "--sample-hz", "0", "work.py"])
    assert result.exit_code == 0, result.output
    assert "warning: the machine is busy: load average 8.0 on 2 cores" in result.stderr


def test_compare_warns_and_reports_in_json(monkeypatch, busy_host):
    import cuvil_pgc.recompile.compare as compare_mod

    def fake_compare(net, inputs, a, b, **kw):
        side = {"median_ms": 1.0, "ci95_ms": [0.7, 1.5]}
        return {"a": {"name": a, **side}, "b": {"name": b, **side}, "verdict": "same", "speedup": 1.0,
                "speedup_ci95": [0.8, 1.2], "rounds": 5}

    monkeypatch.setattr(compare_mod, "compare", fake_compare)
    runner = CliRunner()
    doc = json.loads(runner.invoke(app, ["compare", "eager", "compile", "--model", "cuvil_pgc.zoo:mlp",
                                         "--json"]).stdout)
    assert len(doc["warnings"]) == 3 and "load average 8.0" in doc["warnings"][0]
    shown = runner.invoke(app, ["compare", "eager", "compile", "--model", "cuvil_pgc.zoo:mlp"])
    assert shown.exit_code == 0 and "warning: the machine is busy" in shown.stderr
    assert "1.00x" in shown.stdout


def test_report_says_the_histograms_come_from_a_busy_window():
    from cuvil_pgc.analyze import analyze
    from cuvil_pgc.viewer.html import render_html

    html = render_html(analyze(build_trace(_events(), counters=_util(total=100.0, process=20.0))), plotly_js="cdn")
    assert "Other processes saturated the CPU in 100%" in html and "other processes held 80%" in html


def _fake_recompile(monkeypatch):
    from types import SimpleNamespace

    import cuvil_pgc.recompile.build as build_mod
    from tests.test_cli_tables import _plan

    monkeypatch.setattr(build_mod, "recompile", lambda net, inputs, traces, **kw: SimpleNamespace(
        plan=_plan("model"), save=lambda *a, **k: None, to_json=lambda: {"build": "m.cuvilpkg"}))


def test_recompile_warns_on_a_busy_machine(tmp_path, monkeypatch, busy_host):
    import json

    _fake_recompile(monkeypatch)
    trace = tmp_path / "t.trace.json"
    trace.write_text("{}")
    args = ["recompile", str(trace), "--model", "cuvil_pgc.zoo:mlp", "-o", str(tmp_path / "m.cuvilpkg")]
    result = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "warning: the machine is busy: load average 8.0 on 2 cores" in " ".join(result.stderr.split())
    assert "machine is busy" not in result.stdout
    doc = json.loads(CliRunner().invoke(app, [*args, "--json"]).stdout)
    assert len(doc["warnings"]) == 1 and "measured speedups include waiting for CPU" in doc["warnings"][0]


def test_recompile_is_silent_about_load_on_a_quiet_machine(tmp_path, monkeypatch):
    _fake_recompile(monkeypatch)
    monkeypatch.setattr(contention, "_read_loadavg", lambda: (1.0, 1))
    monkeypatch.setattr(contention, "usable_cores", lambda: 2)
    result = _recompile_cli(tmp_path)
    assert result.exit_code == 0, result.output
    assert "machine is busy" not in result.stderr


def test_recompile_does_not_count_its_own_load_as_a_busy_machine(tmp_path, monkeypatch):
    """The search's compile workers and the race's worker processes raise the load average (5.0
    on 2 idle cores after one): the load that says other processes took CPU is the one before."""
    from types import SimpleNamespace

    import cuvil_pgc.recompile.build as build_mod
    from tests.test_cli_tables import _plan

    monkeypatch.setattr(contention, "_read_loadavg", lambda: (1.0, 1))
    monkeypatch.setattr(contention, "usable_cores", lambda: 2)

    def searching(net, inputs, traces, **kw):       # the search's own processes load the machine
        monkeypatch.setattr(contention, "_read_loadavg", lambda: (5.0, 6))
        return SimpleNamespace(plan=_plan("model"), save=lambda *a, **k: None, to_json=lambda: {"build": "m.cuvilpkg"})

    monkeypatch.setattr(build_mod, "recompile", searching)
    result = _recompile_cli(tmp_path)
    assert result.exit_code == 0, result.output
    assert "machine is busy" not in result.stderr


def _recompile_cli(tmp_path):
    trace = tmp_path / "t.trace.json"
    trace.write_text("{}")
    return CliRunner().invoke(app, ["recompile", str(trace), "--model", "cuvil_pgc.zoo:mlp",
                                    "-o", str(tmp_path / "m.cuvilpkg")])
