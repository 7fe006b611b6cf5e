"""Machine model: calibration, roofline helpers, machine files, the per-machine cache, the CLI."""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from cuvil_pgc.analyze import _microbench as mb
from cuvil_pgc.analyze import machine as mm
from cuvil_pgc.analyze.machine import MachineModel
from cuvil_pgc.errors import AnalysisError, ConfigError


def _model(**overrides) -> MachineModel:
    fields = dict(device="cpu", name="Test CPU (4 cores, avx2)", fingerprint="0123456789abcdef",
                  peak_flops={"fp32": 200e9, "bf16": 4e9}, mem_bw=20e9, dispatch_overhead_s=2e-6,
                  threads=4, source="measured", measured_at="2026-01-01T00:00:00+00:00",
                  torch_version="2.13.0", notes={"bf16": "slow"}, details={"quick": True})
    fields.update(overrides)
    return MachineModel(**fields)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache folder and a fresh 'warned once' memory."""
    monkeypatch.setenv(mm.CACHE_DIR_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(mm, "_warned", set())
    return tmp_path / "cache"


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> tuple[MachineModel, Path]:
    """One quick calibration shared by the tests that inspect its figures."""
    folder = tmp_path_factory.mktemp("calibration-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(mm.CACHE_DIR_ENV, str(folder))
        return mm.calibrate(quick=True), folder


# ---------------------------------------------------------------- calibration (real measurements)

@pytest.mark.slow
def test_quick_calibration_gives_plausible_positive_figures(calibrated) -> None:
    model, _ = calibrated
    assert model.source == "measured" and model.device == "cpu"
    assert all(math.isfinite(v) and v > 0 for v in model.peak_flops.values())
    assert 1e8 < model.peak_flops["fp32"] < 1e16            # plausibility ranges, not timings
    assert 1e8 < model.mem_bw < 1e14
    assert 1e-7 < model.dispatch_overhead_s < 1e-3
    assert model.launch_latency_s is None
    assert model.threads == torch.get_num_threads()
    assert model.fingerprint == mm.fingerprint_of(mm.machine_identity("cpu"))
    assert dt.datetime.fromisoformat(model.measured_at).tzinfo is not None
    for dtype in ("bf16", "fp16"):     # measured (maybe with a 'slow' note) or honestly unsupported
        assert dtype in model.peak_flops or model.notes[dtype].startswith("unsupported")
        if dtype in model.peak_flops and model.peak_flops[dtype] < 0.5 * model.peak_flops["fp32"]:
            assert model.notes[dtype].startswith("slow")


@pytest.mark.slow
def test_calibration_keeps_its_evidence_and_stays_within_budget(calibrated) -> None:
    model, _ = calibrated
    figures = [*model.details["matmul"].values(), *model.details["bandwidth"].values(),
               model.details["dispatch"]]
    assert {"fp32", "copy", "add"} <= set(model.details["matmul"]) | set(model.details["bandwidth"])
    for figure in figures:
        assert figure["estimator"] in ("median", "best") and figure["samples"] >= 3
        assert figure["best_s"] <= figure["time_s"] <= max(figure["median_s"], figure["time_s"])
    assert model.details["quick"] is True
    # phases and the total are each rounded to the ms: allow that rounding
    assert sum(model.details["phases_s"].values()) <= model.details["calibration_s"] + 0.002
    # the figure that came from the bandwidth kernels is the best of them
    assert model.mem_bw == max(f["value"] for f in model.details["bandwidth"].values())


@pytest.mark.slow
def test_calibration_is_cached_and_default_machine_hits_the_cache(calibrated, monkeypatch, caplog) -> None:
    model, folder = calibrated
    monkeypatch.setenv(mm.CACHE_DIR_ENV, str(folder))
    monkeypatch.setattr(mm, "_warned", set())
    assert mm.cache_path(model.fingerprint).is_file()
    with caplog.at_level(logging.WARNING, logger=mm.__name__):
        assert mm.default_machine() == model
        assert mm.default_machine("cpu") == model
    assert not caplog.records


def test_quick_calibration_runs_without_touching_the_cache(cache: Path, monkeypatch) -> None:
    monkeypatch.setattr(mb, "PLANS", {**mb.PLANS, ("cpu", True): mb.Plan(
        (64,), 0.05, (32,), 0.02, 4 << 20, 1 << 20, 0.05, 10, 5)})
    model = mm.calibrate(quick=True, cache=False)
    assert model.source == "measured" and model.peak_flops["fp32"] > 0
    assert not cache.exists()
    assert model.details["plan"]["fp32_sizes"] == [64]


@pytest.mark.cuda
def test_cuda_calibration(cache: Path) -> None:
    model = mm.calibrate("cuda", quick=True)
    assert model.device == "cuda:0" and model.source == "measured"
    assert 1e-7 < model.launch_latency_s < 1e-2 and 1e-7 < model.dispatch_overhead_s < 1e-2
    assert model.peak_flops["fp32"] > 1e11 and model.mem_bw > 1e10
    assert mm.default_machine("cuda") == model


def test_cuda_device_without_cuda_is_a_clear_config_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(ConfigError, match="no CUDA.*--device cpu"):
        mm.calibrate("cuda", quick=True)


@pytest.mark.parametrize("device", ["tpu", "cuda:x", "", "gpu"])
def test_unknown_device_is_rejected(device: str) -> None:
    with pytest.raises(ConfigError, match="not cpu, cuda or cuda:N"):
        mm.calibrate(device)


# ---------------------------------------------------------------- microbenchmark statistics

def test_summarize_takes_the_median_of_undisturbed_samples() -> None:
    samples = [mb.Sample(w, 2 * w) for w in (1.0, 2.0, 3.0, 4.0, 100.0)]
    samples.append(mb.Sample(0.5, 0.1))        # preempted: too little CPU time, ignored
    m = mb.summarize(samples, threads=2, size="s", work=10.0)
    assert m.estimator == "median" and m.undisturbed == 5
    assert m.time_s == 3.0 and m.value == pytest.approx(10.0 / 3.0)
    assert m.best_s == 0.5 and m.samples == 6


def test_summarize_falls_back_to_the_fastest_sample_on_a_busy_machine() -> None:
    samples = [mb.Sample(w, 0.3 * w) for w in (5.0, 2.0, 9.0, 4.0)]
    m = mb.summarize(samples, threads=1, size="s", per=4)
    assert m.estimator == "best" and m.undisturbed == 0
    assert m.value == pytest.approx(2.0 / 4)          # a per-op cost: time / ops


def test_gpu_samples_count_as_undisturbed() -> None:
    m = mb.summarize([mb.Sample(w, None) for w in (3.0, 1.0, 2.0)], threads=1, size="s", work=6.0)
    assert m.estimator == "median" and m.value == 3.0


def _measurement(value: float, estimator: str, threads: int) -> mb.Measurement:
    return mb.Measurement(value=value, time_s=1.0, estimator=estimator, median_s=1.0, best_s=1.0,
                          samples=3, undisturbed=0, threads=threads, size="s")


def test_one_thread_floor_remeasures_a_contended_figure_and_restores_threads() -> None:
    before = torch.get_num_threads()
    watch = mb.Stopwatch("cpu")
    watch.threads = 2
    calls = []

    def run(stopwatch: mb.Stopwatch, share: float) -> dict[str, mb.Measurement]:
        calls.append((stopwatch.threads, share))
        if share == 1.0:
            return {"a": _measurement(1.0, "best", 2), "b": _measurement(9.0, "best", 2)}
        return {"a": _measurement(5.0, "median", 1), "b": _measurement(3.0, "median", 1)}

    found = mb._one_thread_floor(watch, run)
    assert calls == [(2, 1.0), (1, 0.5)]
    assert found["a"].value == 5.0 and found["a"].threads == 1      # one thread did better
    assert found["b"].value == 9.0 and found["b"].threads == 2
    assert torch.get_num_threads() == before


def test_one_thread_floor_leaves_calm_figures_alone() -> None:
    watch = mb.Stopwatch("cpu")
    watch.threads = 2
    calls = []

    def run(stopwatch: mb.Stopwatch, share: float) -> dict[str, mb.Measurement]:
        calls.append(share)
        return {"a": _measurement(1.0, "median", 2)}

    assert mb._one_thread_floor(watch, run)["a"].value == 1.0 and calls == [1.0]


# ---------------------------------------------------------------- roofline helpers

def test_ridge_and_roof() -> None:
    model = _model()
    assert model.ridge() == pytest.approx(10.0)                  # 200e9 / 20e9
    assert model.roof(1.0) == pytest.approx(20e9)                # memory-bound side
    assert model.roof(1000.0) == pytest.approx(200e9)            # compute-bound side
    assert model.roof(model.ridge()) == pytest.approx(200e9)
    assert model.roof(0.1, "bf16") == pytest.approx(2e9)
    assert model.roof(1e6, torch.bfloat16) == pytest.approx(4e9)
    assert model.peak("float32") == model.peak("torch.float32") == 200e9
    assert model.dispatch_us == pytest.approx(2.0) and model.launch_us == 0.0


def test_missing_dtype_names_what_is_there() -> None:
    with pytest.raises(AnalysisError, match="no fp16 peak.*fp32, bf16"):
        _model().roof(1.0, "fp16")


# ---------------------------------------------------------------- machine files

def test_save_load_round_trip(tmp_path: Path) -> None:
    model = _model(launch_latency_s=None)
    path = tmp_path / "sub" / "machine.json"
    model.save(path)
    assert MachineModel.load(path) == model
    assert json.loads(path.read_text())["schema_version"] == mm.SCHEMA_VERSION
    assert MachineModel.from_json(model.to_json()) == model
    assert not list(path.parent.glob(".*.tmp"))


def test_optional_fields_may_be_absent(tmp_path: Path) -> None:
    doc = {k: v for k, v in _model().to_json().items() if k not in ("notes", "details", "threads",
                                                                     "measured_at", "torch_version")}
    model = MachineModel.from_json(doc)
    assert model.notes == {} and model.details == {} and model.threads is None


def _write(tmp_path: Path, doc) -> Path:
    path = tmp_path / "machine.json"
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


def _without(key: str) -> dict:
    doc = _model().to_json()
    del doc[key]
    return doc


def _with(**changes) -> dict:
    doc = _model().to_json()
    doc.update(changes)
    return doc


@pytest.mark.parametrize(("doc", "expected"), [
    ("{not json", "not JSON"),
    ("[1, 2]", "JSON list, not an object"),
    (_without("mem_bw"), "'mem_bw' is missing"),
    (_without("peak_flops"), "'peak_flops' is missing"),
    (_without("device"), "'device' is missing"),
    (_without("schema_version"), "'schema_version' is missing"),
    (_without("dispatch_overhead_s"), "'dispatch_overhead_s' is missing"),
    (_with(peak_flops={"bf16": 1e9}), "'peak_flops.fp32' is missing"),
    (_with(peak_flops={"fp32": -1.0}), "'peak_flops.fp32' must be a positive"),
    (_with(peak_flops={"fp32": "fast"}), "'peak_flops.fp32' must be a number"),
    (_with(mem_bw=0), "'mem_bw' must be a positive"),
    (_with(mem_bw=True), "'mem_bw' has type bool"),
    (_with(dispatch_overhead_s=float("nan")), "'dispatch_overhead_s' must be a positive finite"),
    (_with(source="guessed"), "'source' is 'guessed'"),
    (_with(device="tpu"), "'device' is 'tpu'"),
    (_with(schema_version=99), "'schema_version' is 99, newer"),
    (_with(name=7), "'name' has type int"),
    (_with(notes=[]), "'notes' has type list"),
])
def test_bad_machine_files_are_rejected_naming_the_field(tmp_path: Path, doc, expected: str) -> None:
    path = _write(tmp_path, doc)
    with pytest.raises(AnalysisError) as info:
        MachineModel.load(path)
    assert expected in str(info.value)
    assert str(path) in str(info.value) and "cuvil-pgc calibrate" in str(info.value)


def test_missing_machine_file(tmp_path: Path) -> None:
    with pytest.raises(AnalysisError, match="does not exist.*calibrate -o"):
        MachineModel.load(tmp_path / "nope.json")


_json = st.recursive(st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
                     max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(key=st.sampled_from(sorted(_model().to_json())), value=_json)
def test_any_field_value_loads_or_raises_analysis_error(key: str, value) -> None:
    doc = _model().to_json()
    doc[key] = value
    try:
        model = MachineModel.from_json(doc)
    except AnalysisError as exc:
        assert key in str(exc) or "peak_flops" in str(exc)
    else:
        assert model.mem_bw > 0 and model.peak_flops["fp32"] > 0


# ---------------------------------------------------------------- cache, fingerprint, fallback

def test_cache_dir_honours_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(mm.CACHE_DIR_ENV, str(tmp_path / "x"))
    assert mm.cache_dir() == tmp_path / "x"
    monkeypatch.delenv(mm.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mm.cache_dir() == tmp_path / "xdg" / "cuvil-pgc"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert mm.cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "cuvil-pgc"
    assert mm.cache_path("abc").name == "machine-abc.json"


def test_fingerprint_is_stable_and_tracks_torch_version(monkeypatch) -> None:
    identity = mm.machine_identity("cpu")
    assert identity["torch"] == torch.__version__
    assert identity["cores"] == os.cpu_count()
    assert mm.fingerprint_of(identity) == mm.fingerprint_of(mm.machine_identity())
    monkeypatch.setattr(mm, "_torch_version", lambda: "9.9.9")
    assert mm.fingerprint_of(mm.machine_identity()) != mm.fingerprint_of(identity)


def test_no_cache_gives_the_flagged_fallback_and_warns_once(cache: Path, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger=mm.__name__):
        first = mm.default_machine()
        second = mm.default_machine()
    assert first.source == second.source == "fallback"
    assert first.peak_flops == mm.FALLBACK_CPU["peak_flops"] and first.mem_bw == mm.FALLBACK_CPU["mem_bw"]
    assert first.fingerprint == mm.fingerprint_of(mm.machine_identity())
    assert first.measured_at is None
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "cuvil-pgc calibrate" in warnings[0]
    first.peak_flops["fp32"] = 1.0                          # callers' edits never reach the constant
    assert mm.FALLBACK_CPU["peak_flops"]["fp32"] != 1.0


def test_cached_model_is_returned_for_this_fingerprint(cache: Path, caplog) -> None:
    fingerprint = mm.fingerprint_of(mm.machine_identity())
    model = _model(fingerprint=fingerprint)
    model.save(mm.cache_path(fingerprint))
    _model(fingerprint="ffffffffffffffff", mem_bw=1.0).save(mm.cache_path("ffffffffffffffff"))
    with caplog.at_level(logging.WARNING, logger=mm.__name__):
        assert mm.default_machine() == model
    assert not caplog.records


def test_corrupt_cache_falls_back_with_a_warning_naming_the_file(cache: Path, caplog) -> None:
    path = mm.cache_path(mm.fingerprint_of(mm.machine_identity()))
    path.parent.mkdir(parents=True)
    path.write_text("{")
    with caplog.at_level(logging.WARNING, logger=mm.__name__):
        model = mm.default_machine()
    assert model.source == "fallback"
    assert str(path) in caplog.records[0].getMessage()


def test_cuda_fallback_on_a_machine_without_that_gpu(cache: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    model = mm.default_machine("cuda")
    assert model.device == "cuda:0" and model.source == "fallback"
    assert model.launch_us > 0 and model.peak("bf16") > model.peak("fp32")


# ---------------------------------------------------------------- CLI

def _fixed_model() -> MachineModel:
    return _model(name="Fixed CPU", notes={"bf16": "slow: 0.020x the fp32 rate",
                                           "fp16": "unsupported: no kernel"})


def test_cli_prints_a_table(cache: Path, monkeypatch, capsys) -> None:
    from cuvil_pgc import cli

    monkeypatch.setattr(mm, "calibrate", lambda device, quick: _fixed_model())
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["calibrate", "--quick"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for text in ("Fixed CPU", "200.0 GFLOP/s", "4.0 GFLOP/s", "20.00 GB/s", "2.00 µs",
                 "ridge point fp32", "10.0 FLOP/byte", "unsupported: no kernel"):
        assert text in out, text


def test_cli_json_and_output_file(cache: Path, monkeypatch, capsys, tmp_path: Path) -> None:
    from cuvil_pgc import cli

    monkeypatch.setattr(mm, "calibrate", lambda device, quick: _fixed_model())
    target = tmp_path / "m.json"
    with pytest.raises(SystemExit):
        cli.main(["calibrate", "--json", "-o", str(target)])
    doc = json.loads(capsys.readouterr().out)
    assert MachineModel.from_json(doc) == MachineModel.load(target) == _fixed_model()


def test_cli_cuda_without_cuda_is_one_error_line(capsys) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    from cuvil_pgc import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["calibrate", "--device", "cuda"])
    assert exit_info.value.code == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("cuvil-pgc: error:") and "CUDA" in err[0]


@pytest.mark.slow
def test_cli_subprocess_prints_one_json_document(tmp_path: Path) -> None:
    env = {**os.environ, mm.CACHE_DIR_ENV: str(tmp_path / "cache")}
    out = tmp_path / "x.json"
    result = subprocess.run([sys.executable, "-m", "cuvil_pgc", "calibrate", "--quick", "-o", str(out), "--json"],
                            capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)                          # exactly one document, nothing else
    model = MachineModel.from_json(doc)
    assert model == MachineModel.load(out)
    assert model.source == "measured" and model.details["quick"] is True
    assert (tmp_path / "cache" / f"machine-{model.fingerprint}.json").is_file()


# ---------------------------------------------------------------- a GPU's calibration, found without torch

def test_local_gpu_names_come_from_nvml_where_the_driver_has_no_proc_files(cache: Path, monkeypatch,
                                                                            tmp_path: Path) -> None:
    from cuvil_pgc.instrument.samplers import nvml
    from tests.fakes.fake_nvml import FakeGpu, FakeNvml

    monkeypatch.setattr(mm, "NVIDIA_PROC_GPUS", str(tmp_path / "no-such-folder"))
    monkeypatch.setattr(mm, "nvidia_gpu_visible", lambda: True)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(nvml, "_import_nvml", lambda: FakeNvml([FakeGpu(name="NVIDIA L4")]))
    assert mm.local_gpu_names() == ["NVIDIA L4"]
    identity = {**mm.machine_identity("cpu"), "device": "cuda:0", "gpu": "NVIDIA L4", "capability": "8.9",
                "sms": 58, "cuda": "12.8"}
    model = mm.measured_model(identity, {"peak_flops": {"fp32": 30e12}, "mem_bw": 3e11})
    model.save(mm.cache_path(model.fingerprint))
    assert model.details["gpu"] == {"name": "NVIDIA L4", "sms": 58}
    assert mm.default_machine("cuda") == model
    assert mm.cached_gpu_model("NVIDIA L4", 58) == model and mm.cached_gpu_model("NVIDIA L4", 60) is None


def test_no_visible_gpu_has_no_names_and_asks_no_nvml(monkeypatch) -> None:
    from cuvil_pgc.instrument.samplers import nvml

    monkeypatch.setattr(mm, "nvidia_gpu_visible", lambda: False)
    monkeypatch.setattr(nvml, "_import_nvml", lambda: pytest.fail("NVML asked"))
    assert mm.local_gpu_names() == []
