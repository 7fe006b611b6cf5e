"""Aggregate histograms as OpenTelemetry exponential-histogram metrics: real OTLP/HTTP payloads, drops."""

from __future__ import annotations

import json
import math
import threading
from http.server import HTTPServer

import pytest

from cuvil_pgc import ProfileRegion, profile
from cuvil_pgc.instrument.otel_metrics import SCALE, OtelMetricsExporter, data_point, exponential_index
from cuvil_pgc.trace.summary import bucket_bounds
from tests.test_otel import _Collector


def _work(n=40):
    for _ in range(n):
        with ProfileRegion("request"):
            with ProfileRegion("decode"):
                sum(range(200))


def test_otlp_receiver_gets_exponential_histograms_per_region_path(tmp_path, monkeypatch):
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    _Collector.received = []
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "ranker-svc")
        monkeypatch.setenv("CUVIL_OTEL", "1")
        summary = tmp_path / "serve.summary.json"
        with profile(summary, mode="aggregate", flush_s=60, model="ranker", build_version="7"):
            _work()
    finally:
        server.shutdown()
        thread.join()
    bodies = [body for path, body in _Collector.received if path == "/v1/metrics"]
    assert bodies, f"no metrics posted: {[p for p, _ in _Collector.received]}"
    request = ExportMetricsServiceRequest.FromString(bodies[-1])
    (rm,) = request.resource_metrics
    attrs = {a.key: a.value for a in rm.resource.attributes}
    assert attrs["service.name"].string_value == "ranker-svc"
    assert attrs["cuvil.model"].string_value == "ranker"
    assert attrs["cuvil.build.version"].string_value == "7"
    assert attrs["cuvil.rank"].int_value == 0 and attrs["host.name"].string_value
    (metric,) = rm.scope_metrics[0].metrics
    assert metric.name == "cuvil.region.duration" and metric.unit == "s"
    assert metric.exponential_histogram.aggregation_temporality == 2          # cumulative
    points = {p.attributes[0].value.string_value: p for p in metric.exponential_histogram.data_points}
    assert set(points) == {"request", "request/decode"}
    doc = json.loads(summary.read_text())["cuvil_summary"]
    rows = {r["path"]: r for r in doc["regions"]}
    for path, p in points.items():
        row = rows[path]
        assert p.count == row["count"] == 40 and p.scale == SCALE
        assert sum(p.positive.bucket_counts) + p.zero_count == p.count
        assert p.sum == pytest.approx(row["sum_ns"] / 1e9) and p.min == pytest.approx(row["min_ns"] / 1e9)
    assert doc["metadata"]["samplers"]["otel_metrics"]["status"] == "ok"


def test_buckets_map_to_the_exponential_bucket_of_their_midpoint():
    row = {"path": "r", "count": 6, "sum_ns": 6000, "min_ns": 100, "max_ns": 5000,
           "buckets": [[60, 2], [61, 1], [100, 3]]}
    p = data_point(row, 1, 2)
    for b, n in row["buckets"]:
        low, high = bucket_bounds(b)
        mid = (low + high) / 2e9
        i = exponential_index(mid)
        base = 2 ** (2 ** -SCALE)
        assert base ** i < mid <= base ** (i + 1) * (1 + 1e-12)
        assert p.positive.bucket_counts[i - p.positive.offset] >= n
    assert sum(p.positive.bucket_counts) == 6
    assert math.isclose(p.max, 5e-6)


class _BlockingExporter:
    def __init__(self):
        self.entered, self.release, self.batches = threading.Event(), threading.Event(), []

    def export(self, data, timeout_millis=None):
        self.entered.set()
        self.release.wait(30)
        self.batches.append(data)
        return type("R", (), {"name": "SUCCESS"})()

    def shutdown(self):
        pass


def test_a_slow_collector_drops_and_counts_but_never_blocks_the_caller():
    from opentelemetry.sdk.resources import Resource

    exporter = _BlockingExporter()
    metrics = OtelMetricsExporter(exporter, Resource.create({}))
    summary = {"cuvil_summary": {"metadata": {"start_unix_ns": 1}, "regions": [
        {"path": "r", "count": 1, "sum_ns": 10, "min_ns": 10, "max_ns": 10, "buckets": [[26, 1]]}]}}
    metrics.submit(summary)
    assert exporter.entered.wait(10)
    for _ in range(4):                    # the exporter is stuck: these must return at once
        metrics.submit(summary)
    exporter.release.set()
    metrics.shutdown()
    assert metrics.dropped == 3 and metrics.exported == 2 and len(exporter.batches) == 2


def test_a_failing_exporter_is_counted_in_the_summary(tmp_path):
    class Failing:
        def export(self, data, timeout_millis=None):
            raise OSError("collector down")

        def shutdown(self):
            pass

    path = tmp_path / "s.summary.json"
    session = profile(path, mode="aggregate", flush_s=60, otel_metrics_exporter=Failing())
    with session:
        _work(5)
    session.flush()                          # after stop: the earlier export's failure is in the file
    meta = json.loads(path.read_text())["cuvil_summary"]["metadata"]
    assert meta["dropped"]["otel_metrics"] >= 1


def test_on_demand_otel_true_exports_the_aggregate_as_metrics(tmp_path, monkeypatch):
    """profile(on_demand=True, otel=True) exports metrics without CUVIL_OTEL (it used to pass otel to
    the capture windows only)."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest

    _Collector.received = []
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    ctl = tmp_path / "ctl"
    ctl.mkdir(mode=0o700)
    try:
        monkeypatch.delenv("CUVIL_OTEL", raising=False)
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        with profile(ctl / "serve.trace.json", on_demand=True, otel=True, flush_s=60, model="ranker",
                     ops=False, gpu="off", sample_hz=0, compile=False) as controller:
            _work()
    finally:
        server.shutdown()
        thread.join()
    assert controller.aggregate.otel is True and "model" not in controller.window_options
    assert controller.window_options["otel"] is True        # the windows export spans as before
    bodies = [body for path, body in _Collector.received if path == "/v1/metrics"]
    assert bodies, f"no metrics posted: {[p for p, _ in _Collector.received]}"
    (rm,) = ExportMetricsServiceRequest.FromString(bodies[-1]).resource_metrics
    attrs = {a.key: a.value for a in rm.resource.attributes}
    assert attrs["cuvil.model"].string_value == "ranker"
    points = rm.scope_metrics[0].metrics[0].exponential_histogram.data_points
    assert {p.attributes[0].value.string_value for p in points} == {"request", "request/decode"}
