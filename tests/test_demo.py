"""`cuvil-pgc demo --quick` end to end: every artifact exists and parses."""

from __future__ import annotations

import os
import subprocess
import sys
from html.parser import HTMLParser

import pytest

SECTIONS = ("summary", "hot-regions", "timeline", "compile", "histograms", "roofline", "fusion", "plan")


class _Ids(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.ids |= {v for k, v in attrs if k == "id" and v}


@pytest.mark.slow
def test_demo_quick_end_to_end(tmp_path):
    out = tmp_path / "demo"
    result = subprocess.run([sys.executable, "-m", "cuvil_pgc", "demo", "--quick", "-o", str(out)],
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "demo finished" in result.stdout

    from cuvil_pgc.trace import load_trace

    trace = load_trace(out / "lstm_step.trace.json")
    assert len(trace.of_kind(0)) > 0 and len(trace.of_kind(1)) > 0      # regions and operators

    parser = _Ids()
    parser.feed((out / "lstm_step.report.html").read_text(encoding="utf-8"))
    assert set(SECTIONS) <= parser.ids

    import torch

    from cuvil_pgc import zoo
    from cuvil_pgc.recompile.load import load_build
    from cuvil_pgc.recompile.package import open_build
    from cuvil_pgc.recompile.signing import load_public_key

    key = out / "demo-signing.key.pub"
    with open_build(out / "lstm_step.cuvilpkg", load_public_key(key), require_signature=True) as build:
        assert build.signature_verified and "plan.json" in build.members()
    model, inputs = zoo.get("lstm_step")()
    fast = load_build(out / "lstm_step.cuvilpkg", model, pubkey=str(key), require_signature=True)
    with torch.inference_mode():
        expected, got = model(*inputs), fast(*inputs)
    for e, g in zip(expected, got, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)


def test_demo_summary_fits_80_columns_without_cutting_paths():
    import io

    from rich.console import Console

    from cuvil_pgc.cli.demo import ModelResult
    from cuvil_pgc.viewer.console_demo import print_summary

    out = io.StringIO()
    long = "/srv/a-rather-long-directory-name/cuvil-demo-output"
    result = ModelResult("lstm_step", f"{long}/lstm_step.trace.json", f"{long}/lstm_step.report.html",
                         f"{long}/lstm_step.cuvilpkg", speedup_vs_eager=3.8, speedup_vs_compile=4.18)
    print_summary(Console(file=out, width=80), [result], f"{long}/demo-signing.key", 42.0)
    text = out.getvalue()
    assert "vs torch.compile" in text and "3.80x" in text and "4.18x" in text    # headers and figures whole
    for path in (result.trace, result.report, result.build, f"{long}/demo-signing.key.pub"):
        assert path in text, path                                                  # never folded mid-name
    assert max(len(line) for line in text.splitlines() if "│" in line or "┃" in line) <= 80


def test_demo_runs_at_the_threads_asked_for_and_restores_them(tmp_path, monkeypatch):
    import torch

    import cuvil_pgc.cli.demo as demo

    seen = []
    monkeypatch.setattr(demo, "_run_demo", lambda out_dir, **kw: seen.append((torch.get_num_threads(), kw)) or [])
    before = torch.get_num_threads()
    target = 1 if before != 1 else 2
    demo.run_demo(str(tmp_path), quick=True, threads=target)
    assert seen[0][0] == target and seen[0][1]["threads"] == target and seen[0][1]["default"] is False
    assert torch.get_num_threads() == before


@pytest.fixture
def light_demo(monkeypatch):
    """The demo with its slow steps faked (search, report, timing); profiling and analysis are real."""
    from types import SimpleNamespace

    import cuvil_pgc.cli.demo as demo

    def fake_recompile(model, inputs, trace, analysis, budget, quiet=False, terminal=None):
        return SimpleNamespace(plan={}, save=lambda path, **kw: open(path, "wb").close())

    monkeypatch.setattr(demo, "_recompile", fake_recompile)
    monkeypatch.setattr(demo, "_report", lambda analysis, build, path, key: open(path, "w").close())
    monkeypatch.setattr(demo, "_compare", lambda *a: {"eager": 2.0, "torch.compile": 1.5, "build": 1.0})
    monkeypatch.setattr(demo, "QUICK_MODELS", ("mlp",))
    return demo


def test_demo_json_is_one_document_with_speedups_and_paths(tmp_path, light_demo):
    import json

    from typer.testing import CliRunner

    from cuvil_pgc.cli import app

    out = tmp_path / "demo"
    result = CliRunner().invoke(app, ["demo", "--quick", "--json", "-q", "-o", str(out)], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)                 # nothing else on stdout
    (model,) = doc["models"]
    assert model["name"] == "mlp" and model["speedup_vs_eager"] == 2.0 and model["speedup_vs_compile"] == 1.5
    assert [model["trace"], model["report"], model["build"]] == [
        str(out / "mlp.trace.json"), str(out / "mlp.report.html"), str(out / "mlp.cuvilpkg")]
    assert all(os.path.exists(model[k]) for k in ("trace", "report", "build"))
    assert doc["public_key"] == str(out / "demo-signing.key.pub")
    assert "demo finished" in result.stderr          # the human summary went to stderr


def test_demo_warns_when_the_machine_is_busy(tmp_path, monkeypatch, light_demo, capsys):
    from cuvil_pgc.analyze import contention

    monkeypatch.setattr(contention, "_read_loadavg", lambda: (8.0, 9))
    monkeypatch.setattr(contention, "usable_cores", lambda: 2)
    (result,) = light_demo.run_demo(str(tmp_path / "demo"), quick=True, quiet=True)
    assert len(result.warnings) == 1 and "load average 8.0 on 2 cores" in result.warnings[0]
    printed = " ".join(capsys.readouterr().out.split())
    assert "warning: the machine is busy: load average 8.0 on 2 cores (4.0 per core); these speedups" in printed
    monkeypatch.setattr(contention, "_read_loadavg", lambda: (1.0, 1))
    (quiet,) = light_demo.run_demo(str(tmp_path / "demo2"), quick=True, quiet=True)
    assert quiet.warnings == []


def test_demo_takes_sigterm_as_an_exit(tmp_path, light_demo, monkeypatch):
    """Its recompiles run as `cuvil-pgc recompile`'s do: SIGTERM raises SystemExit, so what the
    search was building is left unfinished, not taken by the next search for a native fault."""
    import signal

    from typer.testing import CliRunner

    from cuvil_pgc.cli import app

    handlers = []
    monkeypatch.setattr(light_demo, "run_demo", lambda *a, **kw: handlers.append(signal.getsignal(signal.SIGTERM)) or [])
    result = CliRunner().invoke(app, ["demo", "--quick", "-q", "-o", str(tmp_path / "demo")])
    assert result.exit_code == 0, result.output
    assert handlers and handlers[0] not in (signal.SIG_DFL, signal.SIG_IGN, None)
    with pytest.raises(SystemExit) as exited:
        handlers[0](signal.SIGTERM, None)
    assert exited.value.code == 143
