"""Runtime backends (ONNX Runtime, OpenVINO; TensorRT through a fake) in the plan space, behind the
module's own call, in signed builds; and what doctor says about them."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from cuvil_pgc.instrument import doctor
from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile.apply import ExportError, ScopeInputs, exporter_of_reason, realize
from cuvil_pgc.recompile.candidates import (
    Candidate,
    RuntimeSpace,
    ScopeFeatures,
    generate_space,
    scope_candidates,
)

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")
needs_ov = pytest.mark.skipif(not runtimes.check("openvino").ok, reason="openvino not installed")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


def feats(label: str = "launch_overhead", scope: str = "", **kw) -> ScopeFeatures:
    return ScopeFeatures(scope=scope, path=scope or "model", bottleneck=label, eager_us=500.0, ops=40,
                         pointwise_ops=10, labels=[label], **kw)


class Structured(nn.Module):
    """Returns a dict with a None entry, a tuple holding a constant, and two tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> dict:
        h = torch.relu(self.a(x))
        out = self.b(h) if scale is None else self.b(h) * scale
        return {"out": out, "nothing": None, "pair": (h, 3)}


# -- the plan space ---------------------------------------------------------------------------------
def test_every_scope_gets_the_runtimes_usable_here_with_their_knobs():
    space = RuntimeSpace(("ort", "openvino"), native_bf16=True, threads=2)
    root = {c.config for c in scope_candidates(feats("compute", rewrites=["lstm_cell:rnn"]), runtimes=space)}
    assert {"ort", "openvino", "ort+rewrite", "openvino+rewrite", "ort+opt=extended", "ort+spin=off",
            "ort+exec=parallel", "openvino+bf16"} <= root
    sub = {c.key for c in generate_space([feats(), feats(scope="enc")], runtimes=space)}
    assert {"<model>::ort", "enc::ort", "<model>::openvino", "enc::openvino"} <= sub
    # one thread: no spinning or executor knobs; no native bf16: no OpenVINO bf16; idle: nothing
    plain = {c.config for c in scope_candidates(feats("compute"), runtimes=RuntimeSpace(("ort", "openvino")))}
    assert "ort" in plain and not {"ort+spin=off", "ort+exec=parallel", "openvino+bf16"} & plain
    assert [c.config for c in scope_candidates(feats("idle"), runtimes=space)] == ["eager"]
    # nothing installed: no runtime candidates at all
    assert not any(c.backend in runtimes.RUNTIME_BACKENDS for c in scope_candidates(feats(), runtimes=RuntimeSpace()))


def test_cuda_space_has_the_cuda_providers_and_tensorrt():
    space = RuntimeSpace(("ort", "tensorrt"))
    configs = {c.config for c in scope_candidates(feats("compute"), device="cuda", runtimes=space)}
    assert {"ort+ep=cuda", "ort+ep=tensorrt", "tensorrt", "tensorrt+fp16"} <= configs
    assert "ort" not in configs and not any(c.startswith("openvino") for c in configs)


def test_backends_option_restricts_and_knobs_survive_json():
    space = generate_space([feats()], backends=("ort",), runtimes=RuntimeSpace(("ort", "openvino")))
    assert {c.backend for c in space} == {"eager", "ort"}
    cand = Candidate("enc", "ort", knobs=(("opt", "extended"),))
    assert Candidate.from_json(cand.to_json()) == cand and cand.config == "ort+opt=extended"


def test_cli_accepts_runtime_backends():
    from cuvil_pgc.recompile._cli import _backends

    assert _backends("ort,openvino,aoti") == ("ort", "openvino", "aoti")


# -- doctor -----------------------------------------------------------------------------------------
def test_doctor_lists_each_runtime_and_the_extra_that_installs_a_missing_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)     # import openvino now raises ImportError
    runtimes.reset()
    try:
        checks = {c.name: c for c in doctor.run_checks([doctor._runtime_check(b) for b in runtimes.RUNTIME_BACKENDS])}
        ov = checks["OpenVINO (recompile backend)"]
        assert not ov.ok and "openvino is not importable" in ov.reason and "cuvil-pgc[openvino]" in ov.fix
        assert "Torch-TensorRT (recompile backend)" in checks and "ONNX Runtime (recompile backend)" in checks
        if runtimes.check("ort").ok:
            assert checks["ONNX Runtime (recompile backend)"].ok
            assert "CPUExecutionProvider" in checks["ONNX Runtime (recompile backend)"].detail
    finally:
        runtimes.reset()


# -- regions on a runtime ---------------------------------------------------------------------------
@pytest.mark.slow   # one ONNX export (~5-20 s on a shared 2-core machine)
@needs_ort
@needs_ov
def test_runtime_regions_return_the_original_structure_and_fall_back_for_other_shapes():
    torch.manual_seed(0)
    model, x = Structured().eval(), torch.randn(3, 16)
    inputs = ScopeInputs((x,))
    with torch.no_grad():
        ref = model(x)
    for cand in (Candidate("", "ort"), Candidate("", "openvino"), Candidate("", "ort", knobs=(("opt", "basic"),))):
        region = realize(model, cand, inputs, machine="t").module
        with torch.no_grad():
            out = region(x)
        assert set(out) == {"out", "nothing", "pair"} and out["nothing"] is None and out["pair"][1] == 3
        torch.testing.assert_close(out["out"], ref["out"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(out["pair"][0], ref["pair"][0], rtol=1e-4, atol=1e-5)
        # a call the export was not made for runs the original module
        with torch.no_grad():
            other = region(torch.randn(5, 16))
        assert other["out"].shape == (5, 4) and region.fallback_calls == 1
    # the second ORT candidate reused the first one's export from the artifact cache
    assert len(list((Path(os.environ["CUVIL_CACHE_DIR"]) / "artifacts").glob("*.onnx"))) == 1


def test_export_error_names_its_exporter():
    assert ExportError("torch.onnx.export failed: boom").exporter == "torch.onnx.export"
    assert exporter_of_reason("ExportError: openvino.convert_model failed: x") == "openvino.convert_model"
    assert exporter_of_reason("ExportError: torch.export failed: y") == "torch.export"
