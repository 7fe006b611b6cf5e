"""`cuvil-pgc recompile` from a real trace: --json shape, the plan table, errors as one line."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch
from torch import nn

from cuvil_pgc.cli import main
from tests._profiled import record_trace


class Step(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(16, 16, batch_first=True)
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def step():
    torch.manual_seed(0)
    return Step().eval(), (torch.randn(1, 2, 16),)


@pytest.fixture
def trace(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = step()
    return record_trace(model, inputs, tmp_path / "step.trace.json", calls=10)


@pytest.mark.slow
def test_recompile_cli_json_and_table(trace, tmp_path, capsys):
    spec = f"{os.path.abspath(__file__)}:step"
    out = str(tmp_path / "s.cuvilpkg")
    with pytest.raises(SystemExit) as done:
        main(["recompile", trace, "--model", spec, "-o", out, "--backends", "eager", "--budget", "4", "--json"])
    captured = capsys.readouterr()
    assert done.value.code == 0, captured.err
    doc = json.loads(captured.out)
    assert doc["build"] == out and os.path.isfile(out)
    assert set(doc) >= {"build", "regions", "measured_candidates", "space_size", "speedup_vs_eager"}
    paths = [r["path"] for r in doc["regions"]]
    # profile regions matched to submodules; the whole model is "model", or "<model>" when the search
    # merged it into one compile boundary (which wins depends on the measurements)
    assert paths[0] in ("model", "<model>") and "model/model.rnn" in paths
    assert all(set(r) >= {"path", "chosen", "predicted_ms", "measured_ms", "baseline_ms", "alternatives"}
               for r in doc["regions"])
    assert any(a["config"] == "eager+rewrite" for r in doc["regions"] for a in r["alternatives"]) or \
        any(r["chosen"] == "eager+rewrite" for r in doc["regions"])
    with pytest.raises(SystemExit) as done:
        main(["recompile", trace, "--model", spec, "-o", str(tmp_path / "t.cuvilpkg"), "--backends", "eager",
              "--budget", "2"])
    table = capsys.readouterr().out
    assert done.value.code == 0 and "recompile plan" in table
    assert re.search(r"[1-9]\d*\s+from records", table)     # the second run reuses records (the caption may wrap)


def test_recompile_cli_errors_are_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as done:
        main(["recompile", str(tmp_path / "nope.trace.json"), "--model", "cuvil_pgc.zoo:mlp", "--backends", "magic"])
    assert done.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "magic" in err[0]
    with pytest.raises(SystemExit) as done:
        main(["recompile", str(tmp_path / "nope.trace.json"), "--model", "cuvil_pgc.zoo:mlp", "-o",
              str(tmp_path / "x.cuvilpkg")])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 1 and len(err) == 1 and "nope.trace.json" in err[0]


def test_recompile_cli_passes_its_options_to_the_build(trace, tmp_path, monkeypatch, capsys):
    from cuvil_pgc.errors import RecompileError
    from cuvil_pgc.recompile import build

    seen = {}

    def fake_recompile(*args, **kwargs):
        seen.update(kwargs)
        raise RecompileError("stopped here by the test")
    monkeypatch.setattr(build, "recompile", fake_recompile)
    spec = f"{os.path.abspath(__file__)}:step"
    for flags, dynamic, seconds in (([], False, None), (["--dynamic"], True, None),
                                    (["--time-budget", "20m"], False, 1200.0)):
        with pytest.raises(SystemExit):
            main(["recompile", trace, "--model", spec, "-o", str(tmp_path / "d.cuvilpkg"), "-q", *flags])
        assert seen.pop("dynamic") is dynamic and seen.pop("time_budget") == seconds
    assert "stopped here by the test" in capsys.readouterr().err
