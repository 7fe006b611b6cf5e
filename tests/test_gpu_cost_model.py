"""On a GPU the cost models split a scope's eager time into its kernels' time (from the profile)
and the host's, which compiled programs cut and CUDA graphs remove (see
:mod:`cuvil_pgc.recompile.cost_models`). Pinned on a real H200 trace of the model of
``scripts/gpu_recompile.py``; the op census runs its copy on the CPU (the census counts ops)."""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

import pytest

from cuvil_pgc.analyze import analyze
from cuvil_pgc.recompile import features
from cuvil_pgc.recompile.apply import capture_scope_inputs
from cuvil_pgc.recompile.candidates import Candidate, ScopeFeatures
from cuvil_pgc.recompile.cost_models import MachineFigures, PlanCostModel, split_eager
from cuvil_pgc.recompile.features import gpu_kernel_us, scope_features
from cuvil_pgc.recompile.matching import match_regions
from cuvil_pgc.trace import load_trace

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "h200" / "small_model.trace.json.gz"
#: what the searching process measured on the H200 in the run that recorded the trace (ms per forward)
MEASURED = {"eager": 0.648, "cudagraphs": 0.215, "aoti": 0.217}
FORWARDS = 40


@pytest.fixture(scope="module")
def analysis():
    return analyze(load_trace(str(TRACE)))


def _small_model():
    spec = importlib.util.spec_from_file_location("gpu_recompile", ROOT / "scripts" / "gpu_recompile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.small_model()        # on the CPU here


def _root_features(analysis, monkeypatch, device: str = "cuda") -> ScopeFeatures:
    """The whole model's features as a search on ``device`` makes them: eager as it measured it.
    The model is on the CPU here; ``device`` is what the features see."""
    model, inputs = _small_model()
    monkeypatch.setattr(features, "device_of", lambda module: device)
    root = match_regions(analysis, model).by_qualname()[""]
    feats = scope_features("", model, capture_scope_inputs(model, inputs, [""])[""], root, analysis,
                           float(root.stats.calls), 1.0)
    feats.eager_us, feats.calls = MEASURED["eager"] * 1e3, 1.0
    return feats


def test_a_scopes_gpu_time_is_its_regions_kernels_per_forward(analysis):
    with gzip.open(TRACE) as f:
        events = json.load(f)["traceEvents"]
    kernels = sum(e["dur"] for e in events if e.get("cat") == "kernel") / FORWARDS
    assert gpu_kernel_us(analysis, "model") / FORWARDS == pytest.approx(kernels, rel=1e-6)
    head = gpu_kernel_us(analysis, "model/model.head")
    assert 0 < head < gpu_kernel_us(analysis, "model")       # the head's own layers, inside the model's
    assert gpu_kernel_us(analysis, "model/model.he") == 0.0   # a path prefix is not a region inside


def test_the_whole_models_gpu_time_is_its_work_and_the_rest_the_hosts(analysis, monkeypatch):
    feats = _root_features(analysis, monkeypatch)
    assert feats.evidence["gpu_us"] == pytest.approx(64.2, abs=0.1)
    machine = MachineFigures.from_analysis_machine(analysis.machine)
    dispatch, work = split_eager(feats, machine)
    assert (dispatch + work, work) == pytest.approx((648.0, 64.2), abs=0.1)


#: the calibration probe's records in that run (µs per call; :mod:`cuvil_pgc.recompile.calibrate`)
PROBE_US = {"eager": 79.1, "aoti": 51.6, "compile": 137.0, "cudagraphs": 204.7}


def _calibrated(machine: MachineFigures) -> PlanCostModel:
    """The cost models after the search's refit from the H200's probe records."""
    model = PlanCostModel(machine)
    probe = ScopeFeatures(scope="", path="", bottleneck="launch_overhead", eager_us=PROBE_US["eager"], ops=3,
                          pointwise_ops=3, flops=32, bytes=128, labels=["launch_overhead"],
                          evidence={"gpu_us": 0.0, "probe": True})
    model.refit([(Candidate("", b, mode="reduce-overhead" if b == "cudagraphs" else "default"), probe, us)
                 for b, us in PROBE_US.items()])
    return model


def test_cuda_graphs_and_a_package_are_predicted_well_ahead_of_eager_on_a_host_bound_gpu_model(analysis, monkeypatch):
    feats = _root_features(analysis, monkeypatch)
    model = _calibrated(MachineFigures.from_analysis_machine(analysis.machine))
    predicted = {b: model.predict(Candidate("", b, mode="reduce-overhead" if b == "cudagraphs" else "default"),
                                  feats) / 1e3 for b in MEASURED}
    assert predicted["eager"] == pytest.approx(MEASURED["eager"])
    for backend in ("cudagraphs", "aoti"):      # both ran at a third of eager there
        assert predicted[backend] < 0.6 * predicted["eager"], predicted
        assert MEASURED[backend] / 2 < predicted[backend] < MEASURED[backend] * 2, predicted


def test_a_cpu_search_of_a_gpu_profile_keeps_the_cpu_split(analysis, monkeypatch):
    assert "gpu_us" not in _root_features(analysis, monkeypatch, device="cpu").evidence


def test_without_kernels_in_the_profile_the_cpu_split_holds():
    feats = ScopeFeatures(scope="", path="", bottleneck="host_bound", eager_us=100.0, ops=10)
    assert split_eager(feats, MachineFigures(dispatch_us=4.0)) == (40.0, 60.0)
    on_gpu = ScopeFeatures(scope="", path="", bottleneck="host_bound", eager_us=100.0, ops=10,
                           evidence={"gpu_us": 150.0})      # device-bound: no host time left to cut
    assert split_eager(on_gpu, MachineFigures()) == (0.0, 100.0)


def test_a_package_pays_a_launch_per_kernel_on_a_gpu_and_a_graph_does_not():
    cpu = ScopeFeatures(scope="", path="", bottleneck="host_bound", eager_us=500.0, ops=20)
    gpu = ScopeFeatures(scope="", path="", bottleneck="host_bound", eager_us=500.0, ops=20, evidence={"gpu_us": 50.0})
    model = PlanCostModel(MachineFigures(launch_us=6.0))
    aoti, graphs = Candidate("", "aoti"), Candidate("", "cudagraphs", mode="reduce-overhead")
    assert model.launch.predict(aoti, gpu) - model.launch.predict(aoti, cpu) == pytest.approx(20 * 6.0)
    assert model.launch.predict(graphs, gpu) == model.launch.predict(graphs, cpu)
