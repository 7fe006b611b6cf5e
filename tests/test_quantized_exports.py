"""A model quantized with torch.ao's eager or FX flow (``quantize_dynamic``, ``convert_fx``) holds
its weights packed in TorchScript objects that neither torch.export nor torch.onnx.export takes:
every AOTInductor, ONNX Runtime and OpenVINO candidate failed with ``Conv2dPackedParamsBase ...
does not have a field with name '__obj_flatten__'``, and the build shipped eager with nothing
saying why or what to do. The rejection names the quantized modules and the flow whose programs
export."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile.apply import ScopeInputs, export_program
from cuvil_pgc.recompile.export_error import ExportError, quantized_note


def dynamic_int8() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")              # torch.ao's deprecation of the flow itself
        return torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)


def test_the_note_names_the_quantized_modules_and_nothing_else():
    assert "torch.ao quantized modules (Linear)" in quantized_note(dynamic_int8())
    assert "prepare_pt2e" in quantized_note(dynamic_int8())
    assert quantized_note(nn.Sequential(nn.Linear(8, 2), nn.ReLU())) == ""


def test_torch_export_s_failure_on_packed_weights_says_why_first():
    with pytest.raises(ExportError, match=r"^torch.export failed \(the region holds torch.ao quantized modules "
                                          r"\(Linear\).*prepare_pt2e.*\): "):
        export_program(dynamic_int8(), ScopeInputs((torch.randn(4, 8),)))


def test_the_onnx_export_s_failure_on_packed_weights_says_why_first(tmp_path):
    pytest.importorskip("onnxscript")
    from cuvil_pgc.recompile.runtime_build import export_onnx

    with pytest.raises(ExportError, match=r"^torch.onnx.export failed \(the region holds torch.ao quantized "
                                          r"modules \(Linear\)"):
        export_onnx(dynamic_int8(), ScopeInputs((torch.randn(4, 8),)), tmp_path / "q.onnx", 1)


def test_the_rejection_keeps_the_exporter_s_own_message_after_the_named_cause():
    """The search's rejection of the candidate (what plan.json and the CLI show) has room for the
    exporter's message after the cause: cut at 300 characters, it read ``AttributeError: __torch__...``."""
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.checked_build import build_checked
    from cuvil_pgc.recompile.search import SearchOptions

    model, x = dynamic_int8(), torch.randn(4, 8)
    with torch.no_grad():
        ref = model(x)
    built = build_checked(Candidate("", "aoti"), model, ScopeInputs((x,)), ref, SearchOptions(), exact=None,
                          padding=None, machine="m", weights="w")
    assert built.status == "compile_error" and built.export_failed
    assert "prepare_pt2e" in built.reason and "__obj_flatten__" in built.reason
