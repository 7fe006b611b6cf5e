"""scripts/gpu_recompile.py (the device check of issue 26) without a GPU: its plan summary, its
step runner, and its refusal without CUDA."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_recompile.py"


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("gpu_recompile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plan_summary_shows_measured_and_refused_candidates_not_those_the_budget_left(script, capsys):
    doc = {"measured_candidates": 2, "space_size": 40, "baseline_ms": 0.6, "plan_ms": 0.2, "speedup_vs_eager": 3.0,
           "regions": [{"path": "model", "chosen": "cudagraphs", "bottleneck": "launch_overhead", "alternatives": [
               {"config": "cudagraphs", "scope": "", "status": "ok", "measured_ms": 0.2, "predicted_ms": 0.3},
               {"config": "aoti+freezing", "scope": "", "status": "not_measured", "predicted_ms": 0.4,
                "reason": "ranked below the measured candidates (budget)"},
               {"config": "aoti+freezing+fp16", "scope": "", "status": "not_measured", "predicted_ms": 0.5,
                "reason": "not built: the accuracy guard's tolerances reject fp16"}]}],
           "unloadable": {"<model>::aoti": "<model>: a process of its own that loaded it crashed (SIGSEGV)"}}
    script.print_plan(doc)
    out = capsys.readouterr().out
    assert "2 of 40 candidates measured" in out and "<model>::cudagraphs: ok" in out
    assert "accuracy guard" in out and "<model>::aoti+freezing:" not in out
    assert "{'cudagraphs': 1, 'aoti': 2}" in out
    assert "not shipped: <model>::aoti: <model>: a process of its own that loaded it crashed (SIGSEGV)" in out


@pytest.mark.slow   # the probe builds an AOTInductor package: ~20 s here
def test_the_calibration_probes_are_printed_with_the_fixed_costs_fitted_from_them(script, tmp_path, capsys):
    """What the next GPU session needs to see why the cost models put CUDA graphs behind eager."""
    import torch

    from cuvil_pgc.recompile.calibrate import calibrate_backends
    from cuvil_pgc.recompile.records import RecordDB

    db = RecordDB(tmp_path)
    script.print_probes(db)
    assert "calibration probe: no records" in capsys.readouterr().out
    torch.manual_seed(0)
    calibrate_backends(db, "machine-a", rounds=3)
    script.print_probes(RecordDB(tmp_path))
    out = capsys.readouterr().out
    assert "calibration probe on machine-a:" in out
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.startswith("  ")}
    assert {"eager", "compile", "aoti"} <= set(lines)
    assert all("fitted fixed cost" in line and " us (eager " in line for line in lines.values())


def test_a_step_that_fails_or_hangs_is_recorded_and_the_run_goes_on(script, capsys):
    steps = script.Steps("cpu")
    assert steps.run("ok", [sys.executable, "-c", "print('fine')"], 60) == "fine\n"
    assert steps.run("fails", [sys.executable, "-c", "import sys; print('why', file=sys.stderr); sys.exit(3)"], 60) is None
    assert steps.run("hangs", [sys.executable, "-c", "import time; time.sleep(30)"], 1) is None
    assert steps.failed == ["fails: exit 3", "hangs: timed out after 1 s"]
    out = capsys.readouterr().out
    assert "why" in out and "--- fails: FAILED (exit 3)" in out
    assert script._finish(steps) == 1


def test_without_cuda_the_script_says_so_and_exits_2(script, tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert script.main(["--out", str(tmp_path), "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
