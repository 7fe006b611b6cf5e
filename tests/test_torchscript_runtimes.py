"""A TorchScript model, loaded with ``torch.jit.load`` as services load it, gets ONNX Runtime and
OpenVINO candidates: ``torch.export`` refuses ScriptModules ("Exporting a ScriptModule is not
supported"), so such a model had no runtime candidate and every recompile of it shipped eager.
Its region is exported with the TorchScript exporter instead, and the build loads in a service
process that has only the ``.pt`` file."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.runtimes import check
from tests._service import run_service

pytestmark = [pytest.mark.usefixtures("build_env"),
              pytest.mark.skipif(not check("ort").ok, reason="needs onnxruntime (the [ort] extra)")]


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc, self.out = nn.Embedding(500, 32), nn.Linear(32, 32), nn.Linear(32, 3)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.fc(self.emb(ids))).mean(1)
        return self.out(h), h


SERVICE = textwrap.dedent('''
    import json, sys
    import torch
    from cuvil_pgc import load_build

    model = torch.jit.load(sys.argv[1]).eval()
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(3))
    fast = load_build(sys.argv[2], model, pubkey=sys.argv[3])
    with torch.no_grad():
        out, ref = fast(ids), model(ids)
    print(json.dumps({"applied": fast.cuvil_load_report.applied, "fallback_calls": fast.fallback_calls,
                      "diff": max(float((a - b).abs().max()) for a, b in zip(out, ref)),
                      "type": type(out).__name__}))
''')


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "tagger.pt"
    torch.jit.save(torch.jit.trace(Tagger().eval(), (torch.randint(0, 500, (2, 16)),)), str(path))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_a_torch_jit_loaded_model_runs_on_a_runtime_in_a_service(tmp_path, keys, saved, backend):
    if not check(backend).ok:
        pytest.skip(f"needs {backend}")
    model = torch.jit.load(str(saved)).eval()
    ids = torch.randint(0, 500, (2, 16))
    build = recompile(model, (ids,), plan={"": Candidate("", backend)}, records=False, deployed_race=False, rounds=3)
    assert [c.candidate.backend for c in build.plan.choices] == [backend]
    with torch.no_grad():
        torch.testing.assert_close(build.module(ids), model(ids), rtol=1e-4, atol=1e-5)
    path = build.save(tmp_path / "tagger.cuvilpkg", signing_key=str(keys[0]))
    report = run_service(SERVICE, saved, path, keys[1], cwd=tmp_path)
    assert report["applied"] == [f"<model>: {backend}"] and report["fallback_calls"] == 0, report
    assert report["diff"] < 1e-4 and report["type"] == "tuple", report


def test_a_script_module_whose_number_argument_becomes_a_graph_input_is_rejected(tmp_path):
    """A ScriptModule with a number argument: the TorchScript exporter makes it a graph input,
    which the runtimes would not be fed; the graph's inputs are checked against the region's, and
    the candidate is rejected with that reason instead of failing at its first call."""
    from cuvil_pgc.recompile.apply import ScopeInputs
    from cuvil_pgc.recompile.realized import ExportError
    from cuvil_pgc.recompile.runtime_build import export_onnx

    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def forward(self, x: torch.Tensor, scale: float = 2.0) -> torch.Tensor:
            return self.fc(x) * scale

    with pytest.raises(ExportError) as err:
        export_onnx(torch.jit.script(Scaled().eval()), ScopeInputs((torch.randn(2, 8),)), tmp_path / "s.onnx", 1)
    assert "the ONNX graph has 2 inputs" in str(err.value) and "the region 1 input" in str(err.value)
    assert not list(tmp_path.iterdir())             # no half-written file left behind
