"""`cuvil-pgc demo --quick` end to end: every artifact exists and parses."""

from __future__ import annotations

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
    from cuvil_pgc.recompile.build import load_build
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
