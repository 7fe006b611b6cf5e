"""CuptiKernelSampler through a fake cupti.cupti injected at ``_import_cupti``, inside real sessions."""

from __future__ import annotations

import inspect
import json
import logging
import re
import threading
import time

import pytest
from cupti import cupti as real_cupti

from cuvil_pgc.instrument import ProfileRegion, Session, SessionConfig
from cuvil_pgc.instrument.samplers import cupti_kernels
from cuvil_pgc.instrument.samplers.cupti_kernels import CuptiKernelSampler
from cuvil_pgc.trace import schema
from tests._regionlines import with_paths
from tests.fakes.fake_cupti import OFFSET_NS, RECORD_CLASSES, FakeCupti


@pytest.fixture
def fake(monkeypatch):
    fake = FakeCupti()
    monkeypatch.setattr(cupti_kernels, "_import_cupti", lambda: fake)
    monkeypatch.setattr(cupti_kernels, "_warned", set())
    return fake


def record(tmp_path, body, flush_interval_s: float = 0.25):
    """Run ``body`` in a real session with only the CUPTI sampler; return (trace dict, sampler)."""
    sampler = CuptiKernelSampler()
    config = SessionConfig(path=str(tmp_path / "run.trace.json"), ops=False, gpu="off", sample_hz=0,
                           flush_interval_s=flush_interval_s)
    with Session(config, samplers=[sampler]):
        body()
    with open(tmp_path / "run.trace.json") as fh:
        trace = json.load(fh)
    with_paths(trace["traceEvents"])        # args.region: the path of each event's args.region_id
    return trace, sampler


def by_cat(trace: dict, cat: str) -> list[dict]:
    return [e for e in trace["traceEvents"] if e.get("cat") == cat]


def trace_us(trace: dict, cupti_ns: int) -> float:
    """Where a fake CUPTI timestamp belongs on the trace clock."""
    return (cupti_ns - OFFSET_NS - trace["cuvil"]["start_monotonic_ns"]) / 1000.0


# -- the fake mirrors the real module ---------------------------------------------------------------
def test_fake_functions_exist_in_cupti_with_the_same_signatures():
    names = [n for n, v in inspect.getmembers(FakeCupti, inspect.isfunction)
             if not n.startswith(("_", "sim_"))]
    assert "activity_get_num_dropped_records" in names and "activity_register_callbacks" in names
    for name in names:
        assert hasattr(real_cupti, name), name
        real_params = list(inspect.signature(getattr(real_cupti, name)).parameters)
        fake_params = list(inspect.signature(getattr(FakeCupti, name)).parameters)[1:]   # drop self
        assert fake_params == real_params, name
    for name in ("ActivityKind", "ActivityFlag", "ActivityThreadIdType", "Result", "cuptiError",
                 "runtime_api_trace_cbid", "driver_api_trace_cbid", "ActivityMemcpyKind", "ActivityMemoryKind"):
        assert getattr(FakeCupti, name) is getattr(real_cupti, name)


def test_fake_records_only_use_fields_of_the_real_record_classes(fake):
    for kind in ("RUNTIME", "DRIVER", "CONCURRENT_KERNEL", "MEMCPY", "MEMSET"):
        fake.activity_enable(getattr(fake.ActivityKind, kind))
    made = {"kernel": fake.sim_launch("k"), "api": fake.sim_api_call(), "memcpy": fake.sim_memcpy(8),
            "memset": fake.sim_memset(8)}
    for key, rec in made.items():
        cls_name, _ = RECORD_CLASSES[key]
        classes = [getattr(real_cupti, cls_name)]
        if key == "kernel":     # whichever kernel record version CUPTI hands out, the fields are there
            classes = [getattr(real_cupti, f"ActivityKernel{v}") for v in range(9, 14)]
        for cls in classes:
            missing = [f for f in vars(rec) if not hasattr(cls, f)]
            assert not missing, (cls.__name__, missing)


def test_sampler_calls_only_names_the_real_module_has():
    source = inspect.getsource(cupti_kernels)
    used = set(re.findall(r"(?:\b|_)cupti\.(\w+)", source)) - {"cupti"}
    assert {"activity_enable", "activity_disable", "activity_register_callbacks", "activity_flush_all",
            "activity_get_num_dropped_records", "get_timestamp", "subscribe", "unsubscribe",
            "set_thread_id_type", "ActivityKind"} <= used
    assert not [name for name in used if not hasattr(real_cupti, name)]
    for cbid in cupti_kernels._DRIVER_LAUNCHES:
        assert hasattr(real_cupti.driver_api_trace_cbid, cbid)
    assert hasattr(real_cupti.Result, cupti_kernels.MULTIPLE_SUBSCRIBERS)
    assert hasattr(real_cupti.Result, cupti_kernels.INSUFFICIENT_PRIVILEGES)


# -- kernels, attribution, clocks ------------------------------------------------------------------
def test_kernels_carry_their_fields_aligned_times_and_regions(tmp_path, fake):
    launched = {}

    def body():
        with ProfileRegion("outer"):
            time.sleep(0.002)
            with ProfileRegion("inner"):
                time.sleep(0.002)
                launched["inner"] = fake.sim_launch("_Z6kernelPf", grid=(8, 4, 2), block=(256, 2, 1),
                                                    registers=40, static_smem=2048, dynamic_smem=4096)
                time.sleep(0.002)
            time.sleep(0.002)
            launched["outer"] = fake.sim_launch("triton_poi_fused_add", stream=9, driver=True)
            time.sleep(0.002)
        launched["none"] = fake.sim_launch("outside_any_region")

    trace, sampler = record(tmp_path, body)
    kernels = {e["name"]: e for e in by_cat(trace, schema.CAT_KERNEL)}
    assert set(kernels) == {"kernel(float*)", "triton_poi_fused_add", "outside_any_region"}
    inner = kernels["kernel(float*)"]
    assert inner["args"]["region"] == "outer/inner"
    assert inner["args"]["grid"] == [8, 4, 2] and inner["args"]["block"] == [256, 2, 1]
    assert inner["args"]["registers"] == 40 and inner["args"]["shared_memory"] == 2048 + 4096
    assert inner["args"]["correlation"] == launched["inner"].correlation_id
    assert (inner["pid"], inner["tid"]) == (0, 7) and inner["args"]["stream"] == 7
    assert inner["ts"] == pytest.approx(trace_us(trace, launched["inner"].start), abs=500)
    assert inner["dur"] == pytest.approx(20.0)
    assert kernels["triton_poi_fused_add"]["args"]["region"] == "outer"
    assert kernels["triton_poi_fused_add"]["tid"] == 9
    assert kernels["outside_any_region"]["args"]["region"] is None
    assert sampler.status["kernels"] == 3 and sampler.status["unattributed"] == 1


def test_runtime_calls_sit_on_the_launching_thread(tmp_path, fake):
    worker_tid = {}

    def work():
        worker_tid["tid"] = threading.get_native_id()
        with ProfileRegion("worker"):
            time.sleep(0.002)
            fake.sim_launch("from_worker")
            time.sleep(0.002)

    def body():
        with ProfileRegion("main"):
            time.sleep(0.002)
            fake.sim_api_call("cudaGetDevice_v3020")
            thread = threading.Thread(target=work)
            thread.start()
            thread.join()
            time.sleep(0.002)

    trace, sampler = record(tmp_path, body)
    assert sampler._cupti.thread_id_type == int(real_cupti.ActivityThreadIdType.SYSTEM)
    runtime = {e["name"]: e for e in by_cat(trace, schema.CAT_RUNTIME)}
    assert runtime["cudaGetDevice"]["tid"] == threading.get_native_id()
    assert runtime["cudaGetDevice"]["args"]["region"] == "main"
    assert runtime["cudaLaunchKernel"]["tid"] == worker_tid["tid"]
    assert runtime["cudaLaunchKernel"]["args"]["region"] == "worker"
    kernel = by_cat(trace, schema.CAT_KERNEL)[0]
    assert kernel["args"]["region"] == "worker"
    assert kernel["args"]["correlation"] == runtime["cudaLaunchKernel"]["args"]["correlation"]


def test_kernel_delivered_before_its_launch_record_is_still_attributed(tmp_path, fake):
    def body():
        with ProfileRegion("decode"):
            time.sleep(0.002)
            fake.sim_launch("early_kernel", kernel_first=True)
            time.sleep(0.002)

    def split_buffers():
        kernel, api = fake.open_buffer
        fake.open_buffer = [kernel]
        fake.sim_close_buffer()
        fake.open_buffer = [api]

    def run():
        body()
        split_buffers()

    trace, _ = record(tmp_path, run)
    (kernel,) = by_cat(trace, schema.CAT_KERNEL)
    assert kernel["args"]["region"] == "decode"


def test_events_stream_out_during_the_session_once_their_region_ended(tmp_path, fake):
    partial = tmp_path / ("run.trace.json" + schema.PARTIAL_SUFFIX)
    seen = {}

    def body():
        with ProfileRegion("step"):
            time.sleep(0.002)
            fake.sim_launch("streamed")
            time.sleep(0.002)
        deadline = time.monotonic() + 20.0     # generous: shared, loaded CI machines
        while time.monotonic() < deadline and b"streamed" not in partial.read_bytes():
            time.sleep(0.02)
        seen["text"] = partial.read_bytes()

    trace, _ = record(tmp_path, body, flush_interval_s=0.05)
    line = next(ln for ln in seen["text"].splitlines() if b'"streamed"' in ln)
    step_id = next(e["args"]["id"] for e in with_paths(trace["traceEvents"]) if e["args"]["path"] == "step")
    assert json.loads(line.rstrip(b","))["args"]["region_id"] == step_id
    assert len(by_cat(trace, schema.CAT_KERNEL)) == 1


def test_memcpy_and_memset_records(tmp_path, fake):
    def body():
        with ProfileRegion("load"):
            time.sleep(0.002)
            fake.sim_memcpy(4096, copy_kind="HTOD")
            fake.sim_memset(512)
            time.sleep(0.002)

    trace, sampler = record(tmp_path, body)
    (copy,) = by_cat(trace, schema.CAT_MEMCPY)
    (fill,) = by_cat(trace, schema.CAT_MEMSET)
    assert copy["args"]["bytes"] == 4096 and copy["args"]["kind"] == "HTOD" and copy["args"]["region"] == "load"
    assert fill["args"]["bytes"] == 512 and fill["args"]["kind"] == "DEVICE" and fill["args"]["region"] == "load"
    assert sampler.status["memcpys"] == 1 and sampler.status["memsets"] == 1
    names = {e["args"]["name"] for e in trace["traceEvents"] if e.get("ph") == "M" and e.get("pid") == 0}
    assert {"GPU 0", "stream 7"} <= names


def test_dropped_records_are_counted_in_the_metadata(tmp_path, fake):
    def body():
        fake.sim_launch("k")
        fake.sim_close_buffer(dropped=5)
        fake.sim_launch("k2")
        fake.sim_close_buffer(dropped=2)

    trace, _ = record(tmp_path, body)
    assert trace["cuvil"]["dropped"]["cupti"] == 7
    assert trace["cuvil"]["samplers"]["cupti"]["dropped_records"] == 7
    assert len(by_cat(trace, schema.CAT_KERNEL)) == 2


def test_stop_releases_cupti(tmp_path, fake):
    trace, sampler = record(tmp_path, lambda: fake.sim_launch("k"))
    assert fake.enabled == set() and fake.subscribers == {}
    forced = int(real_cupti.ActivityFlag.FLUSH_FORCED)
    assert fake.flushes[-1] == forced and fake.flushes.count(forced) == 1   # forced only at stop
    assert trace["cuvil"]["samplers"]["cupti"]["status"] == schema.STATUS_OK
    assert trace["cuvil"]["samplers"]["cupti"]["dropped_records"] == 0      # reported even when none
    assert "cupti" not in trace["cuvil"]["dropped"]
    assert cupti_kernels._active is None
    assert abs(sampler.status["clock_drift_us"]) < 1000


def test_in_flight_kernels_wait_for_completion_and_cut_ones_are_counted(tmp_path, fake):
    partial = tmp_path / ("run.trace.json" + schema.PARTIAL_SUFFIX)

    def body():
        fake.sim_launch("slow", in_flight=True)
        time.sleep(0.3)                       # several unforced flushes: the buffer is held back
        held = b'"slow"' not in partial.read_bytes()
        fake.sim_finish()
        fake.sim_launch("cut", in_flight=True)
        assert held

    trace, _ = record(tmp_path, body, flush_interval_s=0.05)
    assert [k["name"] for k in by_cat(trace, schema.CAT_KERNEL)] == ["slow"]
    assert trace["cuvil"]["dropped"]["cupti_incomplete"] == 1


# -- CUPTI not available ---------------------------------------------------------------------------
def test_cupti_held_by_another_tool_falls_back_with_one_warning(tmp_path, monkeypatch, caplog):
    fake = FakeCupti(taken=True)
    monkeypatch.setattr(cupti_kernels, "_import_cupti", lambda: fake)
    monkeypatch.setattr(cupti_kernels, "_warned", set())

    def body():
        with ProfileRegion("still_recorded"):
            fake.sim_launch("never_seen")

    with caplog.at_level(logging.WARNING, logger="cuvil_pgc"):
        trace, _ = record(tmp_path, body)
        again = tmp_path / "again"
        again.mkdir()
        record(again, body)             # a second session: no second warning
    status = trace["cuvil"]["samplers"]["cupti"]
    assert status["status"] == schema.STATUS_UNAVAILABLE
    assert "MULTIPLE_SUBSCRIBERS" in status["reason"]
    assert by_cat(trace, schema.CAT_KERNEL) == []
    assert [e["name"] for e in by_cat(trace, schema.CAT_REGION)] == ["still_recorded"]
    assert sum("MULTIPLE_SUBSCRIBERS" in r.getMessage() for r in caplog.records) == 1
    assert fake.enabled == set()


def test_no_driver_is_recorded_unavailable(tmp_path, monkeypatch):
    fake = FakeCupti(no_driver=True)
    monkeypatch.setattr(cupti_kernels, "_import_cupti", lambda: fake)
    trace, _ = record(tmp_path, lambda: None)
    status = trace["cuvil"]["samplers"]["cupti"]
    assert status["status"] == schema.STATUS_UNAVAILABLE and "CUDA driver is not found" in status["reason"]


def test_missing_cupti_python_says_how_to_install(monkeypatch):
    def missing():
        raise ImportError("No module named 'cupti'")

    monkeypatch.setattr(cupti_kernels, "_import_cupti", missing)
    assert "cuvil-pgc[gpu]" in CuptiKernelSampler().unavailable()


def test_failure_while_enabling_leaves_cupti_released_and_the_user_code_running(tmp_path, fake, monkeypatch):
    def refuse(kind):
        raise real_cupti.cuptiError(real_cupti.Result.ERROR_NOT_SUPPORTED)

    monkeypatch.setattr(fake, "activity_enable", refuse)
    ran = []
    trace, _ = record(tmp_path, lambda: ran.append(1))
    assert ran == [1]
    status = trace["cuvil"]["samplers"]["cupti"]
    assert status["status"] == schema.STATUS_FAILED and "ERROR_NOT_SUPPORTED" in status["reason"]
    assert fake.subscribers == {} and cupti_kernels._active is None


def test_cupti_status_name_reads_the_error_code():
    err = real_cupti.cuptiError(real_cupti.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
    assert cupti_kernels.cupti_status_name(err) == "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
    assert cupti_kernels.cupti_status_name(RuntimeError("boom")) is None


# -- a real GPU ------------------------------------------------------------------------------------
@pytest.mark.cuda
def test_real_cupti_captures_a_matmul_inside_its_region(tmp_path):
    import torch

    x = torch.randn(512, 512, device="cuda")
    torch.cuda.synchronize()

    def body():
        with ProfileRegion("matmul"):
            (x @ x).sum().item()

    trace, sampler = record(tmp_path, body)
    assert trace["cuvil"]["samplers"]["cupti"]["status"] == schema.STATUS_OK, trace["cuvil"]["samplers"]
    kernels = by_cat(trace, schema.CAT_KERNEL)
    assert kernels and all(k["dur"] > 0 for k in kernels)
    assert any(k["args"]["region"] == "matmul" for k in kernels)
    assert "cupti" in trace["cuvil"]["dropped"] or sampler.status["kernels"] == len(kernels)


def test_a_failing_dropped_query_is_reported_not_hidden(tmp_path, fake, monkeypatch):
    def broken(context, stream_id, dropped):
        raise real_cupti.cuptiError(real_cupti.Result.ERROR_INVALID_PARAMETER)

    monkeypatch.setattr(fake, "activity_get_num_dropped_records", broken)
    trace, _ = record(tmp_path, lambda: fake.sim_launch("k"))
    status = trace["cuvil"]["samplers"]["cupti"]
    assert status["dropped_records"] is None and "ERROR_INVALID_PARAMETER" in status["dropped_query_error"]
    assert len(by_cat(trace, schema.CAT_KERNEL)) == 1


# -- scripts/gpu_smoke.py's checks, fed by the fakes ---------------------------------------------------
def _load_smoke():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_smoke.py"
    spec = importlib.util.spec_from_file_location("gpu_smoke", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow   # a real session with torch.profiler op capture: a few seconds here
def test_gpu_smoke_checks_pass_on_a_trace_shaped_like_the_smoke_run(tmp_path, fake, monkeypatch, capsys):
    import torch

    from cuvil_pgc.instrument.samplers import nvml
    from tests.fakes.fake_nvml import FakeNvml

    smoke = _load_smoke()
    monkeypatch.setattr(nvml, "_import_nvml", lambda: FakeNvml())
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    steps, path = 3, str(tmp_path / "smoke.trace.json")
    x = torch.ones(8, 8)

    def launch_in(name: str, kernels: int = 2) -> None:
        with ProfileRegion(name):
            for _ in range(kernels):
                torch.mm(x, x)
                fake.sim_launch(f"{name}_kernel")

    def worker() -> None:
        launch_in("worker", kernels=5)

    with Session(SessionConfig(path=path, ops=True, gpu="on", sample_hz=100)):
        for _ in range(steps):
            with ProfileRegion("step"):
                launch_in("preprocess")
                with ProfileRegion("model"):
                    launch_in("model.features")
                    launch_in("model.head")
                launch_in("postprocess")
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        time.sleep(0.1)         # a few NVML ticks
    with open(path) as fh:
        trace = json.load(fh)
    trace["_smoke"] = {"steps": steps, "wall_s": 0.1}
    checks = smoke.Checks()
    smoke.check_kernels(trace, checks)
    smoke.check_counters(trace, checks)
    smoke.check_dropped_and_ops(trace, path, checks)
    smoke.print_summary(trace)
    assert checks.failures == [], capsys.readouterr().out
    # and the checks do fail when kernels lose their regions
    for event in trace["traceEvents"]:
        if event.get("cat") == schema.CAT_KERNEL:
            event["args"]["region"] = None
    broken = smoke.Checks()
    smoke.check_kernels(trace, broken)
    assert any("unattributed" in f for f in broken.failures)
