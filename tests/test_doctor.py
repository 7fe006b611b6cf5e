"""`cuvil-pgc doctor`: real checks on this machine, and the GPU checks through fake backends."""

from __future__ import annotations

import json
import os

import pynvml
import pytest
from typer.testing import CliRunner

from cuvil_pgc.cli import app
from cuvil_pgc.cli.doctor import all_checks
from cuvil_pgc.instrument import doctor
from cuvil_pgc.instrument.samplers import cupti_kernels, nvml
from tests.fakes.fake_cupti import FakeCupti
from tests.fakes.fake_nvml import FakeGpu, FakeNvml


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


# -- this machine, real backends -------------------------------------------------------------------
@pytest.mark.slow   # imports torch._inductor and runs torch.profiler: ~10 s on a shared 2-core machine
def test_real_checks_on_this_machine_give_reasons_and_fixes():
    checks = {c.name: c for c in doctor.run_checks()}
    assert checks["torch"].ok and "torch" in checks["torch"].detail
    assert checks["torch.profiler CPU op capture"].ok
    assert checks["CPU utilization (/proc)"].ok
    for check in checks.values():
        assert check.ok or (check.reason and check.fix), check
    if not _has_cuda():
        assert not checks["CUDA"].ok
        assert not checks["CUPTI (kernels)"].ok and "driver" in checks["CUPTI (kernels)"].reason.lower()
        assert not checks["NVML (utilization)"].ok and "NVML" in checks["NVML (utilization)"].reason


def test_json_is_one_document_with_every_check():
    result = CliRunner().invoke(app, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    names = [c["name"] for c in document["checks"]]
    assert names == [c.name for c in doctor.run_checks(all_checks())]
    assert names[:len(doctor.CHECKS)] == [c.name for c in doctor.run_checks()]    # profiling, then runtimes
    assert any("recompile backend" in name for name in names)
    assert document["ok"] == all(c["ok"] for c in document["checks"])
    assert {"name", "ok", "status", "detail", "reason", "fix"} <= set(document["checks"][0])


def test_table_names_each_backend_and_what_to_do(monkeypatch):
    monkeypatch.setattr(doctor, "CHECKS", [
        lambda: doctor.BackendCheck("CUDA", False, reason="no GPU here", fix="use a GPU machine"),
        lambda: doctor.BackendCheck("torch", True, "torch 9.9"),
    ])
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0
    for text in ("CUDA", "unavailable", "no GPU here", "use a GPU machine", "torch 9.9", "ok"):
        assert text in result.stdout


def test_cupti_is_probed_before_torch_profiler_claims_it():
    order = [check.__name__ for check in doctor.CHECKS]
    assert order.index("check_cupti") < order.index("check_op_capture")


def test_a_crashing_check_is_reported_not_raised():
    def check_boom():
        """Boom backend."""
        raise RuntimeError("kaput")

    (result,) = doctor.run_checks([check_boom])
    assert not result.ok and "kaput" in result.reason and result.name == "boom"


# -- GPU checks with fake backends -----------------------------------------------------------------
def test_cupti_ready(monkeypatch):
    fake = FakeCupti()
    monkeypatch.setattr(cupti_kernels, "_import_cupti", lambda: fake)
    check = doctor.check_cupti()
    assert check.ok and "activity API" in check.detail
    assert fake.subscribers == {}           # the probe let go of CUPTI


def test_cupti_taken_by_another_tool(monkeypatch):
    monkeypatch.setattr(cupti_kernels, "_import_cupti", lambda: FakeCupti(taken=True))
    check = doctor.check_cupti()
    assert not check.ok and "MULTIPLE_SUBSCRIBERS" in check.reason and "run without it" in check.fix


def test_cupti_not_installed(monkeypatch):
    def missing():
        raise ImportError("No module named 'cupti'")

    monkeypatch.setattr(cupti_kernels, "_import_cupti", missing)
    check = doctor.check_cupti()
    assert not check.ok and "cuvil-pgc[gpu]" in check.fix


def test_nvml_with_gpm(monkeypatch):
    fake = FakeNvml([FakeGpu(), FakeGpu(name="NVIDIA A100", gpm=False)])
    monkeypatch.setattr(nvml, "_import_nvml", lambda: fake)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    check = doctor.check_nvml()
    assert check.ok
    assert check.detail.startswith("2 GPU(s)") and "gpu0 NVIDIA H200: GPM" in check.detail and "gpu1 NVIDIA A100: no GPM" in check.detail
    assert fake.inits == fake.shutdowns == 1


def test_nvml_without_driver(monkeypatch):
    monkeypatch.setattr(nvml, "_import_nvml", lambda: FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    check = doctor.check_nvml()
    assert not check.ok and "NVML_ERROR_DRIVER_NOT_LOADED" in check.reason and check.fix


@pytest.mark.parametrize("value, ok", [("1", False), ("0", True)])
def test_counter_permission_reads_the_driver_parameter(tmp_path, monkeypatch, value, ok):
    params = tmp_path / "params"
    params.write_text(f"ResmanDebugLevel: 4294967295\nRmProfilingAdminOnly: {value}\n")
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    check = doctor.check_counter_permission(str(params))
    assert check.ok is ok
    if not ok:
        assert "NVreg_RestrictProfilingToAdminUsers" in check.reason and "root" in check.fix


def test_counter_permission_as_root_is_fine(tmp_path, monkeypatch):
    params = tmp_path / "params"
    params.write_text("RmProfilingAdminOnly: 1\n")
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    assert doctor.check_counter_permission(str(params)).ok


def test_cpu_utilization_needs_proc(tmp_path):
    assert not doctor.check_cpu_util(str(tmp_path)).ok
    (tmp_path / "self").mkdir()
    (tmp_path / "stat").write_text("cpu  1 2 3\ncpu0 1 2 3\ncpu1 1 2 3\n")
    (tmp_path / "self" / "stat").write_text("1 (python) R 0")
    check = doctor.check_cpu_util(str(tmp_path))
    assert check.ok and check.detail.startswith("2 cores")
