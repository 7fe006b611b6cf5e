"""Structural hashes travel from instrument_module through the analysis to region matching."""

from __future__ import annotations

import torch

from cuvil_pgc import profile
from cuvil_pgc._structure import SHORT, structural_hash
from cuvil_pgc.analyze import analyze
from cuvil_pgc.instrument.module import instrument_module
from cuvil_pgc.recompile.matching import match_regions


def _model(hidden: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, hidden)).eval()


def test_changed_module_is_stale_and_unchanged_ones_match(tmp_path):
    v1, x = _model(4), torch.randn(2, 8)
    with instrument_module(v1) as handle:
        assert handle.regions["model.0"].attrs["structure"] == structural_hash(v1[0])[:SHORT]
        with profile(tmp_path / "v1.trace.json", ops=False, compile=False, sample_hz=0, gpu="off"):
            v1(x)
    analysis = analyze(str(tmp_path / "v1.trace.json"))
    first = analysis.region("model/model.0")
    assert first.evidence["module"] == "Linear" and first.evidence["structure"] == structural_hash(v1[0])[:SHORT]

    v2 = _model(6)                    # the last layer changed shape; the first two did not
    result = match_regions(analysis, v2)
    stale = {s.path: s.reason for s in result.stale}
    matched = {m.path for m in result.matched}
    assert "model/model.2" in stale and "structure changed" in stale["model/model.2"]
    assert {"model/model.0", "model/model.1"} <= matched
