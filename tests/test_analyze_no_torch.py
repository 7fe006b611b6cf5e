"""Analysing a GPU trace never imports torch (issue 25, item 10): load + analyze in a fresh process."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cuvil_pgc.analyze.machine import nvidia_gpu_visible
from tests.test_reader_invariants import DATA

SCRIPT = """
import sys
from cuvil_pgc.analyze.analyzer import analyze
from cuvil_pgc.trace.reader import load_trace
result = analyze(load_trace(sys.argv[1]))
assert result.trace["counts"]["kernel"] > 0
print("torch" in sys.modules)
"""


@pytest.mark.skipif(nvidia_gpu_visible(), reason="with a GPU here, finding its cached calibration asks torch")
def test_load_and_analyze_of_a_gpu_trace_does_not_import_torch(tmp_path) -> None:
    env = {"CUVIL_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(p for p in sys.path if p)}
    for trace in (DATA / "kineto_gpu" / "gpu_two_regions.json", DATA / "kineto_generations" / "ns_flows.json"):
        proc = subprocess.run([sys.executable, "-c", SCRIPT, str(trace)], capture_output=True, text=True,
                              env=env, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip().splitlines()[-1] == "False", f"{trace.name} imported torch"
