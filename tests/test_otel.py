"""OpenTelemetry export of regions: in-memory exporter and a real OTLP/HTTP receiver."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from cuvil_pgc import ProfileRegion, profile


def _session(tmp_path, **kw):
    return profile(tmp_path / "o.trace.json", ops=False, compile=False, sample_hz=0, gpu="off", **kw)


def _nested_work():
    for step in range(3):
        with ProfileRegion("request", step=step):
            with ProfileRegion("decode"):
                with ProfileRegion("attention"):
                    pass


def test_in_memory_exporter_keeps_parents_and_attributes(tmp_path):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    with _session(tmp_path, otel_exporter=exporter):
        _nested_work()
    spans = exporter.get_finished_spans()
    assert len(spans) == 9
    by_id = {s.context.span_id: s for s in spans}
    for span in spans:
        path = span.attributes["cuvil.region.path"]
        assert span.name == path.rsplit("/", 1)[-1]
        assert span.attributes["cuvil.rank"] == 0
        assert span.attributes["cuvil.duration_us"] == pytest.approx((span.end_time - span.start_time) / 1000)
        if span.name == "request":
            assert span.parent is None
        else:
            parent = by_id[span.parent.span_id]
            assert path == parent.attributes["cuvil.region.path"] + "/" + span.name
            assert parent.context.trace_id == span.context.trace_id
    roots = [s for s in spans if s.name == "request"]
    assert len({s.context.trace_id for s in roots}) == 3
    assert sorted(s.attributes["cuvil.attr.step"] for s in roots) == [0, 1, 2]


def test_queue_overflow_is_counted_not_blocking(tmp_path):
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from cuvil_pgc.instrument import otel

    exporter = InMemorySpanExporter()
    real_init = otel.OtelRegionExporter.__init__

    def tiny_queue(self, exporter, rank=0, **kw):
        real_init(self, exporter, rank=rank, max_queue=5, batch_size=1000, interval_s=5.0)

    otel.OtelRegionExporter.__init__ = tiny_queue
    try:
        with _session(tmp_path, otel_exporter=exporter, flush_interval_s=1.0):
            for _ in range(50):
                with ProfileRegion("r"):
                    pass
    finally:
        otel.OtelRegionExporter.__init__ = real_init
    meta = json.loads((tmp_path / "o.trace.json").read_text())["cuvil"]
    assert meta["dropped"]["otel"] == 50 - len(exporter.get_finished_spans())
    assert meta["dropped"]["otel"] >= 45


class _Collector(BaseHTTPRequestHandler):
    received: list[bytes] = []

    def do_POST(self):  # noqa: N802 - http.server API
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append((self.path, body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_otlp_http_receiver_gets_spans_with_parents(tmp_path, monkeypatch):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    _Collector.received = []
    server = HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "cuvil-test")
        monkeypatch.setenv("CUVIL_OTEL", "1")
        with _session(tmp_path):
            _nested_work()
    finally:
        server.shutdown()
        thread.join()
    spans, services = [], set()
    for path, body in _Collector.received:
        assert path == "/v1/traces"
        request = ExportTraceServiceRequest.FromString(body)
        for rs in request.resource_spans:
            services |= {a.value.string_value for a in rs.resource.attributes if a.key == "service.name"}
            for ss in rs.scope_spans:
                spans.extend(ss.spans)
    assert services == {"cuvil-test"}
    assert len(spans) == 9
    by_id = {s.span_id: s for s in spans}
    for s in spans:
        if s.name == "request":
            assert s.parent_span_id == b""
        else:
            parent = by_id[s.parent_span_id]
            assert {"decode": "request", "attention": "decode"}[s.name] == parent.name
            assert parent.trace_id == s.trace_id


def test_missing_exporter_package_does_not_break_the_program(tmp_path, monkeypatch):
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with _session(tmp_path, otel=True) as s:
        _nested_work()
    meta = json.loads((tmp_path / "o.trace.json").read_text())["cuvil"]
    assert meta["samplers"]["otel"]["status"] == "unavailable"
    assert "zipkin" in meta["samplers"]["otel"]["reason"]
    assert s.path.endswith("o.trace.json")
