"""NvmlSampler through a fake pynvml injected at ``_import_nvml``, inside real sessions."""

from __future__ import annotations

import inspect
import json
import re
import sys
import threading
import time

import pynvml
import pytest

from cuvil_pgc.instrument import Session, SessionConfig
from cuvil_pgc.instrument.samplers import build_samplers, cupti_kernels, nvml
from cuvil_pgc.instrument.samplers.nvml import NvmlSampler
from cuvil_pgc.trace import schema
from tests.fakes.fake_nvml import FakeGpu, FakeNvml


def install(monkeypatch, fake: FakeNvml) -> FakeNvml:
    monkeypatch.setattr(nvml, "_import_nvml", lambda: fake)
    return fake


def record(tmp_path, seconds: float = 0.25, hz: float = 100.0):
    sampler = NvmlSampler(sample_hz=hz)
    config = SessionConfig(path=str(tmp_path / "run.trace.json"), ops=False, gpu="off", sample_hz=hz,
                           flush_interval_s=0.05)
    with Session(config, samplers=[sampler]):
        time.sleep(seconds)
    with open(tmp_path / "run.trace.json") as fh:
        return json.load(fh), sampler


def counters(trace: dict, name: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("ph") == "C" and e["name"] == name]


# -- the fake mirrors the real module ---------------------------------------------------------------
def test_fake_functions_exist_in_pynvml_with_the_same_signatures():
    names = [n for n, _ in inspect.getmembers(FakeNvml, inspect.isfunction) if n.startswith("nvml")]
    assert len(names) >= 15
    for name in names:
        assert hasattr(pynvml, name), name
        real_params = list(inspect.signature(getattr(pynvml, name)).parameters)
        fake_params = list(inspect.signature(getattr(FakeNvml, name)).parameters)[1:]
        assert fake_params == real_params, name


def test_sampler_uses_only_names_pynvml_has():
    source = inspect.getsource(nvml)
    used = set(re.findall(r"\bnvml\.(\w+)", source))
    assert {"nvmlGpmMetricsGet", "nvmlGpmSampleAlloc", "nvmlGpmSampleGet", "nvmlGpmQueryDeviceSupport",
            "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetClockInfo", "nvmlDeviceGetPowerUsage",
            "nvmlDeviceGetMemoryInfo", "c_nvmlGpmMetricsGet_t", "NVML_GPM_METRICS_GET_VERSION"} <= used
    assert not [n for n in used if not hasattr(pynvml, n)]
    assert all(hasattr(pynvml, constant) for constant in nvml._GPM_METRICS.values())


# -- sampling ------------------------------------------------------------------------------------
def test_gpm_path_emits_sm_activity_occupancy_and_the_plain_counters(tmp_path, monkeypatch):
    fake = install(monkeypatch, FakeNvml([FakeGpu()]))
    trace, sampler = record(tmp_path)
    sm = counters(trace, schema.COUNTER_SM_UTIL)
    assert sm and all(e["args"] == {"gpu0": 62.5} for e in sm)
    assert {e["args"]["gpu0"] for e in counters(trace, schema.COUNTER_SM_OCCUPANCY)} == {31.25}
    assert {e["args"]["gpu0"] for e in counters(trace, schema.COUNTER_MEM_BW_UTIL)} == {12.0}
    assert {e["args"]["gpu0"] for e in counters(trace, schema.COUNTER_SM_CLOCK)} == {1980}
    assert {e["args"]["gpu0"] for e in counters(trace, schema.COUNTER_POWER)} == {312.0}
    assert {e["args"]["gpu0"] for e in counters(trace, schema.COUNTER_MEM_USED)} == {3 << 30}
    # GPM values average the interval since the previous sample and are stamped at its start.
    assert sm[0]["ts"] < counters(trace, schema.COUNTER_SM_CLOCK)[0]["ts"]
    metrics = trace["cuvil"]["samplers"]["nvml"]["metrics"]["gpu0"]
    assert metrics[schema.COUNTER_SM_UTIL] == {"source": "gpm"}
    assert metrics[schema.COUNTER_SM_OCCUPANCY] == {"source": "gpm"}
    (device,) = trace["cuvil"]["devices"]
    assert device["name"] == "NVIDIA H200" and device["compute_capability"] == "9.0"
    assert device["uuid"].startswith("GPU-") and device["memory_bytes"] == 141 << 30
    assert device["driver_version"] == "580.95.05"
    assert fake.inits == fake.shutdowns == 1 and fake.freed == 2


def test_without_gpm_sm_util_is_the_coarse_metric_and_occupancy_is_unavailable(tmp_path, monkeypatch):
    install(monkeypatch, FakeNvml([FakeGpu(name="NVIDIA A100", compute_capability=(8, 0), gpm=False)]))
    trace, _ = record(tmp_path)
    assert {e["args"]["gpu0"] for e in counters(trace, schema.COUNTER_SM_UTIL)} == {97.0}
    assert {e["args"]["gpu0"] for e in counters(trace, schema.COUNTER_MEM_BW_UTIL)} == {40.0}
    assert counters(trace, schema.COUNTER_SM_OCCUPANCY) == []
    metrics = trace["cuvil"]["samplers"]["nvml"]["metrics"]["gpu0"]
    assert metrics[schema.COUNTER_SM_UTIL]["source"] == "utilization_rates"
    assert "coarse" in metrics[schema.COUNTER_SM_UTIL]["note"]
    assert "GPM" in metrics[schema.COUNTER_SM_OCCUPANCY]["unavailable"]


def test_refused_metrics_are_unavailable_with_the_reason_and_never_emitted(tmp_path, monkeypatch):
    gpu = FakeGpu(refuse={"nvmlDeviceGetPowerUsage": pynvml.NVML_ERROR_NOT_SUPPORTED,
                          "nvmlDeviceGetClockInfo": pynvml.NVML_ERROR_NO_PERMISSION},
                  gpm_refuse={pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: pynvml.NVML_ERROR_NOT_SUPPORTED})
    install(monkeypatch, FakeNvml([gpu]))
    trace, _ = record(tmp_path)
    assert counters(trace, schema.COUNTER_POWER) == []
    assert counters(trace, schema.COUNTER_SM_CLOCK) == []
    assert counters(trace, schema.COUNTER_SM_OCCUPANCY) == []       # refused: not a single 0
    assert {e["args"]["gpu0"] for e in counters(trace, schema.COUNTER_SM_UTIL)} == {62.5}
    metrics = trace["cuvil"]["samplers"]["nvml"]["metrics"]["gpu0"]
    assert "NVML_ERROR_NOT_SUPPORTED" in metrics[schema.COUNTER_POWER]["unavailable"]
    assert "NVML_ERROR_NO_PERMISSION" in metrics[schema.COUNTER_SM_CLOCK]["unavailable"]
    assert "NVML_ERROR_NOT_SUPPORTED" in metrics[schema.COUNTER_SM_OCCUPANCY]["unavailable"]


def test_mig_is_named_in_the_reason(tmp_path, monkeypatch):
    gpu = FakeGpu(gpm=False, mig=True, refuse={"nvmlDeviceGetUtilizationRates": pynvml.NVML_ERROR_NOT_SUPPORTED})
    install(monkeypatch, FakeNvml([gpu]))
    trace, _ = record(tmp_path, seconds=0.05)
    reason = trace["cuvil"]["samplers"]["nvml"]["metrics"]["gpu0"][schema.COUNTER_SM_UTIL]["unavailable"]
    assert "NVML_ERROR_NOT_SUPPORTED" in reason and "MIG" in reason
    assert counters(trace, schema.COUNTER_SM_UTIL) == []


def test_each_visible_gpu_is_a_series_and_cuda_visible_devices_is_honoured(tmp_path, monkeypatch):
    gpus = [FakeGpu(uuid="GPU-aaaa", sm_util=10.0), FakeGpu(uuid="GPU-bbbb", sm_util=90.0)]
    install(monkeypatch, FakeNvml(gpus))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    trace, _ = record(tmp_path)
    assert {"gpu0": 10.0, "gpu1": 90.0} in [e["args"] for e in counters(trace, schema.COUNTER_SM_UTIL)]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    (tmp_path / "b").mkdir()
    trace, _ = record(tmp_path / "b")
    assert {e["args"]["gpu0"] for e in counters(trace, schema.COUNTER_SM_UTIL)} == {90.0}
    assert [d["uuid"] for d in trace["cuvil"]["devices"]] == ["GPU-bbbb"]


def test_no_visible_gpu_is_unavailable(tmp_path, monkeypatch):
    fake = install(monkeypatch, FakeNvml())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    trace, _ = record(tmp_path, seconds=0.01)
    status = trace["cuvil"]["samplers"]["nvml"]
    assert status["status"] == schema.STATUS_UNAVAILABLE and "CUDA_VISIBLE_DEVICES" in status["reason"]
    assert fake.inits == fake.shutdowns == 1


def test_lag_is_recorded_and_the_thread_stops(tmp_path, monkeypatch):
    install(monkeypatch, FakeNvml())
    trace, sampler = record(tmp_path, hz=50.0)
    status = trace["cuvil"]["samplers"]["nvml"]
    assert status["status"] == schema.STATUS_OK and status["samples"] >= 1
    assert set(status["lag_ms"]) == {"p50", "max"} and status["lag_ms"]["max"] >= status["lag_ms"]["p50"]
    assert "missed_ticks" in status
    assert not sampler._thread.is_alive()
    assert not [t for t in threading.enumerate() if t.name == "cuvil-pgc-nvml"]


def test_nvml_that_cannot_start_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    install(monkeypatch, FakeNvml(init_error=pynvml.NVML_ERROR_DRIVER_NOT_LOADED))
    trace, _ = record(tmp_path, seconds=0.01)
    status = trace["cuvil"]["samplers"]["nvml"]
    assert status["status"] == schema.STATUS_UNAVAILABLE and "NVML_ERROR_DRIVER_NOT_LOADED" in status["reason"]
    install(monkeypatch, FakeNvml(gpus=[]))
    assert NvmlSampler().unavailable() == "NVML sees no GPU"


def test_real_pynvml_without_a_driver_is_unavailable_not_an_error():
    if nvml.cuda_present():
        pytest.skip("this machine has a GPU")
    assert NvmlSampler().unavailable()


# -- choosing samplers ---------------------------------------------------------------------------
def test_gpu_option_selects_the_gpu_samplers(monkeypatch):
    def names(gpu: str) -> list[str]:
        return [s.name for s in build_samplers(SessionConfig(ops=False, gpu=gpu))]

    monkeypatch.setattr(nvml, "cuda_present", lambda: False)
    assert "cupti" not in names("off") and "nvml" not in names("off")
    assert "cupti" not in names("auto")
    assert {"cupti", "nvml"} <= set(names("on"))
    monkeypatch.setattr(nvml, "cuda_present", lambda: True)
    assert {"cupti", "nvml"} <= set(names("auto"))


def test_cuda_present_asks_nvml_when_torch_is_not_imported(monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    fake = install(monkeypatch, FakeNvml([FakeGpu()]))
    assert nvml.cuda_present() is True and fake.inits == fake.shutdowns == 1
    install(monkeypatch, FakeNvml([]))
    assert nvml.cuda_present() is False


def test_gpu_on_without_gpu_records_both_unavailable(tmp_path, monkeypatch):
    install(monkeypatch, FakeNvml(init_error=pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))

    def no_cupti():
        raise ImportError("No module named 'cupti'")

    monkeypatch.setattr(cupti_kernels, "_import_cupti", no_cupti)
    config = SessionConfig(path=str(tmp_path / "t.trace.json"), ops=False, gpu="on")
    with Session(config):
        pass
    with open(tmp_path / "t.trace.json") as fh:
        samplers = json.load(fh)["cuvil"]["samplers"]
    assert samplers["cupti"]["status"] == samplers["nvml"]["status"] == schema.STATUS_UNAVAILABLE
    assert "cuvil-pgc[gpu]" in samplers["cupti"]["reason"]


# -- a real GPU ------------------------------------------------------------------------------------
@pytest.mark.cuda
def test_real_nvml_reports_utilization_or_says_why_not(tmp_path):
    trace, _ = record(tmp_path, seconds=0.5, hz=20.0)
    status = trace["cuvil"]["samplers"]["nvml"]
    assert status["status"] == schema.STATUS_OK, status
    sm = status["metrics"]["gpu0"][schema.COUNTER_SM_UTIL]
    assert counters(trace, schema.COUNTER_SM_UTIL) if "source" in sm else sm["unavailable"]
    assert trace["cuvil"]["devices"][0]["uuid"]
