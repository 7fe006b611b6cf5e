"""Always-on aggregate histograms as OpenTelemetry metrics: a fleet's latency per region, no traces.

An aggregate session (``profile(path, mode="aggregate", otel=True)`` or ``CUVIL_OTEL=1``) hands
each summary it writes to :class:`OtelMetricsExporter` (``submit``), whose own thread converts it
and calls the metric exporter. Submitting never blocks: a summary replaces the one still waiting,
and replaced or failed ones are counted (``dropped``; the summary's ``dropped.otel_metrics``).
Nothing is lost for good by a drop: every export is cumulative since the session started.

Metric ``cuvil.region.duration`` (unit ``s``), an exponential histogram (scale 3: 8 buckets per
octave, as the aggregate histograms) with one data point per region path (attribute
``cuvil.region.path``), cumulative temporality. Each aggregate bucket's count goes to the
exponential bucket holding its midpoint (so a percentile read there is within ~9 %); count,
sum, min and max are exact. Resource attributes: ``host.name``, ``cuvil.rank``, ``cuvil.model`` and
``cuvil.build.version`` (when given), plus what ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``
say. The exporter comes from ``OTEL_METRICS_EXPORTER`` (``otlp``: OTLP/HTTP protobuf to
``OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT``, the ``otel`` extra; ``console``; ``none``) or is passed in.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Any

from cuvil_pgc.instrument.otel import BackgroundExport, exporter_for

log = logging.getLogger("cuvil_pgc")

OTEL_METRICS_EXPORTER = "OTEL_METRICS_EXPORTER"
OTEL_EXPORTER_OTLP_METRICS_PROTOCOL = "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL"
METRIC_NAME = "cuvil.region.duration"
SCALE = 3                       # 2**SCALE buckets per octave, as the aggregate scheme's 8
PATH_ATTRIBUTE = "cuvil.region.path"


def exporter_from_env() -> Any:
    """The MetricExporter that the standard OTEL_* environment variables ask for (None: ``none``)."""
    return exporter_for(OTEL_METRICS_EXPORTER, OTEL_EXPORTER_OTLP_METRICS_PROTOCOL,
                        ("opentelemetry.sdk.metrics.export", "ConsoleMetricExporter"),
                        ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"))


def exponential_index(seconds: float) -> int:
    """Index of the scale-3 exponential bucket ``(base**i, base**(i+1)]`` holding ``seconds`` (> 0)."""
    return math.ceil(math.log2(seconds) * (1 << SCALE)) - 1


def data_point(row: dict[str, Any], start_ns: int, now_ns: int) -> Any:
    """One summary region row ({path, count, sum_ns, min_ns, max_ns, buckets}) as a data point."""
    from opentelemetry.sdk.metrics.export import Buckets, ExponentialHistogramDataPoint

    from cuvil_pgc.trace.summary import bucket_bounds

    counts: dict[int, int] = {}
    zero = 0
    for b, n in row["buckets"]:
        low, high = bucket_bounds(int(b))
        mid_s = (low + high) / 2e9
        if mid_s <= 0:
            zero += n
            continue
        i = exponential_index(mid_s)
        counts[i] = counts.get(i, 0) + int(n)
    offset = min(counts) if counts else 0
    dense = [counts.get(i, 0) for i in range(offset, max(counts) + 1)] if counts else []
    count = int(row["count"])
    return ExponentialHistogramDataPoint(
        attributes={PATH_ATTRIBUTE: row["path"]}, start_time_unix_nano=start_ns, time_unix_nano=now_ns,
        count=count, sum=row["sum_ns"] / 1e9, scale=SCALE, zero_count=zero,
        positive=Buckets(offset=offset, bucket_counts=dense), negative=Buckets(offset=0, bucket_counts=[]),
        flags=0, min=row["min_ns"] / 1e9 if count else 0.0, max=row["max_ns"] / 1e9 if count else 0.0)


def metrics_data(summary: dict[str, Any], resource: Any, now_ns: int) -> Any:
    """The MetricsData of one aggregate summary document (``{"cuvil_summary": ...}``)."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        ExponentialHistogram,
        Metric,
        MetricsData,
        ResourceMetrics,
        ScopeMetrics,
    )
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    from cuvil_pgc.trace.summary import SUMMARY_KEY

    body = summary[SUMMARY_KEY]
    start_ns = int(body["metadata"].get("start_unix_ns") or now_ns)
    points = [data_point(row, start_ns, now_ns) for row in body["regions"] if row["count"] > 0]
    metric = Metric(name=METRIC_NAME, description="Time in a profile region, per region path", unit="s",
                    data=ExponentialHistogram(data_points=points,
                                              aggregation_temporality=AggregationTemporality.CUMULATIVE))
    scope = ScopeMetrics(scope=InstrumentationScope("cuvil_pgc"), metrics=[metric], schema_url="")
    return MetricsData(resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[scope], schema_url="")])


def resource_for(host: str, rank: int, model: str | None = None, build_version: str | None = None) -> Any:
    from opentelemetry.sdk.resources import Resource

    attrs: dict[str, Any] = {"host.name": host, "cuvil.rank": rank}
    if model:
        attrs["cuvil.model"] = str(model)
    if build_version is not None:
        attrs["cuvil.build.version"] = str(build_version)
    return Resource.create(attrs)


class OtelMetricsExporter(BackgroundExport):
    """Exports submitted summaries from one background thread; the latest waiting summary wins."""

    what = "metric exporter"

    def __init__(self, exporter: Any, resource: Any, timeout_s: float = 10.0) -> None:
        self.exporter = exporter
        self.resource = resource
        self.timeout_s = timeout_s
        self.dropped = 0              # summaries replaced before export, or whose export failed
        self.exported = 0
        self._pending: dict[str, Any] | None = None
        self._lock = threading.Lock()
        self._start("cuvil-pgc-otel-metrics")

    def submit(self, summary: dict[str, Any]) -> None:
        """Queue a summary for export. Never blocks on the exporter, never raises."""
        with self._lock:
            if self._pending is not None:
                self.dropped += 1
            self._pending = summary
        self._wake.set()

    def _export(self) -> None:
        import time

        with self._lock:
            summary, self._pending = self._pending, None
        if summary is None:
            return
        try:
            result = self.exporter.export(metrics_data(summary, self.resource, time.time_ns()),
                                          timeout_millis=self.timeout_s * 1000)
            ok = getattr(result, "name", "SUCCESS") == "SUCCESS"
        except Exception as exc:
            log.warning("cuvil-pgc: OpenTelemetry metric export failed: %s", exc)
            ok = False
        if ok:
            self.exported += 1
        else:
            self.dropped += 1
