"""--filter on profile (what is recorded), analyze and report (what is shown)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests._regionlines import with_paths

SCRIPT = """
import torch
from cuvil_pgc import ProfileRegion
x = torch.randn(64, 64)
for _ in range(3):
    with ProfileRegion("serve"):
        with ProfileRegion("matmul"):
            torch.mm(x, x)
        with ProfileRegion("softmax"):
            torch.softmax(x, dim=-1)
        with ProfileRegion("other"):
            torch.relu(x)
"""


def _cli(*args, check=True):
    result = subprocess.run([sys.executable, "-m", "cuvil_pgc", *args], capture_output=True, text=True, timeout=300)
    if check:
        assert result.returncode == 0, result.stderr
    return result


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("filters")
    script = tmp / "work.py"
    script.write_text(SCRIPT)
    full, filtered = tmp / "full.trace.json", tmp / "filtered.trace.json"
    _cli("profile", "--gpu", "off", "-o", str(full), str(script))
    _cli("profile", "--gpu", "off", "--filter", "matmul|softmax", "-o", str(filtered), str(script))
    return full, filtered


def _events(path):
    return json.loads(open(path, encoding="utf-8").read())["traceEvents"]


@pytest.mark.slow
def test_profile_filter_records_only_matches(traces):
    full, filtered = traces
    regions = {e["args"]["path"] for e in with_paths(_events(filtered))}
    assert regions == {"serve/matmul", "serve/softmax"}
    ops = {e["name"] for e in _events(filtered) if e.get("cat") == "cpu_op"}
    assert "aten::mm" in ops and "aten::relu" not in ops
    assert "aten::relu" in {e["name"] for e in _events(full) if e.get("cat") == "cpu_op"}


@pytest.mark.slow
def test_analyze_filter_shows_only_matches(traces):
    full, _ = traces
    doc = json.loads(_cli("analyze", str(full), "--json", "--filter", "softmax").stdout)
    assert {r["path"] for r in doc["regions"]} == {"serve/softmax"}
    bad = _cli("analyze", str(full), "--filter", "nomatch", check=False)
    assert bad.returncode == 1 and "no region path matches" in bad.stderr


@pytest.mark.slow
def test_report_filter_shows_only_matches(traces, tmp_path):
    full, _ = traces
    out = tmp_path / "r.html"
    _cli("report", str(full), "-o", str(out), "--filter", "matmul")
    html = out.read_text(encoding="utf-8")
    assert "serve/matmul" in html and "serve/softmax" not in html
