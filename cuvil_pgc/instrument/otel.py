"""Export completed regions as OpenTelemetry spans, batched off the hot path.

The session's writer thread hands each drained batch of regions to :class:`OtelRegionExporter`
(``submit``); a background thread turns them into SDK ``ReadableSpan`` objects and calls the
span exporter in batches. The user's threads never touch OpenTelemetry. When the bounded queue
is full, regions are dropped and counted (``dropped``; reported in the trace metadata under
``dropped.otel``) instead of blocking.

Spans: name = the region name (keep region names low-cardinality; ids go to attributes);
attributes ``cuvil.region.path``, ``cuvil.region.id``, ``cuvil.rank``, ``cuvil.duration_us``,
``thread.id``, region attributes as ``cuvil.attr.<key>`` and ``cuvil.bottleneck`` when a region
carries a ``bottleneck`` attribute. Parent/child follows the region tree; every root region
starts its own trace. Span and trace ids derive from region ids and a random per-session salt.

The exporter comes from the standard environment (``OTEL_TRACES_EXPORTER``: ``otlp`` (default,
OTLP/HTTP protobuf through the ``otel`` extra; endpoint from ``OTEL_EXPORTER_OTLP_*``),
``console`` or ``none``; ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES`` for the resource),
or is passed in (``profile(..., otel_exporter=InMemorySpanExporter())``).
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections import deque
from typing import Any

from cuvil_pgc.errors import ConfigError

log = logging.getLogger("cuvil_pgc")

_MASK64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15

# Standard OpenTelemetry environment variables (opentelemetry.environment_variables / the spec).
OTEL_TRACES_EXPORTER = "OTEL_TRACES_EXPORTER"
OTEL_EXPORTER_OTLP_PROTOCOL = "OTEL_EXPORTER_OTLP_PROTOCOL"
OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"

# One completed region: (name, path, id, parent id | None, root id, start unix ns, end unix ns, tid, attrs)
RegionRow = tuple[str, str, int, Any, int, int, int, int, Any]


def exporter_kind(variable: str, protocol_variable: str) -> str:
    """What a standard ``OTEL_*_EXPORTER`` variable asks for: ``otlp`` (the default; OTLP/HTTP
    protobuf only, per ``protocol_variable`` or ``OTEL_EXPORTER_OTLP_PROTOCOL``), ``console`` or ``none``."""
    kind = os.environ.get(variable, "otlp").split(",")[0].strip().lower()
    if kind not in ("otlp", "console", "none"):
        raise ConfigError(f"{variable}={kind!r} is not supported", fix="use otlp, console or none")
    if kind == "otlp":
        protocol = os.environ.get(protocol_variable, os.environ.get(OTEL_EXPORTER_OTLP_PROTOCOL, "http/protobuf"))
        if protocol != "http/protobuf":
            raise ConfigError(f"OTLP protocol {protocol!r} is not supported",
                              fix="set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf")
    return kind


def exporter_for(variable: str, protocol_variable: str, console: tuple[str, str], otlp: tuple[str, str]) -> Any:
    """The exporter a standard ``OTEL_*_EXPORTER`` variable asks for (None for ``none``): the
    ``console`` or ``otlp`` class, each given as (module, class name); the OTLP/HTTP one comes with
    the ``otel`` extra."""
    import importlib

    kind = exporter_kind(variable, protocol_variable)
    if kind == "none":
        return None
    if kind == "console":
        return getattr(importlib.import_module(console[0]), console[1])()
    try:
        module = importlib.import_module(otlp[0])
    except ImportError:
        raise ConfigError("the OTLP/HTTP exporter is not installed", fix="pip install 'cuvil-pgc[otel]'") from None
    return getattr(module, otlp[1])()


def exporter_from_env() -> Any:
    """The SpanExporter that the standard OTEL_* environment variables ask for."""
    return exporter_for(OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_TRACES_PROTOCOL,
                        ("opentelemetry.sdk.trace.export", "ConsoleSpanExporter"),
                        ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"))


class BackgroundExport:
    """One daemon thread that exports what was submitted when woken (or every ``interval_s``) and
    what is left at :meth:`shutdown`. Subclasses set ``exporter`` and implement ``_export()``; the
    exporter is third-party code, so nothing it raises leaves this class."""

    what = "exporter"           # named in the log line of a failed shutdown

    def _start(self, name: str, interval_s: float | None = None) -> None:
        self._interval_s = interval_s
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Export what is waiting, then stop the thread and the exporter."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout_s)
        try:
            self.exporter.shutdown()
        except Exception as exc:  # the exporter is third-party code
            log.warning("cuvil-pgc: OpenTelemetry %s shutdown failed: %s", self.what, exc)

    def _loop(self) -> None:
        while True:
            self._wake.wait(self._interval_s)
            self._wake.clear()
            self._export()
            if self._stop:
                self._export()
                return

    def _export(self) -> None:
        raise NotImplementedError


class OtelRegionExporter(BackgroundExport):
    """Bounded queue of completed regions, exported as spans by one background thread."""

    def __init__(self, exporter: Any, rank: int = 0, max_queue: int = 65_536, batch_size: int = 512,
                 interval_s: float = 1.0) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        self.exporter = exporter
        self.rank = rank
        self.max_queue = max_queue
        self.batch_size = batch_size
        self.interval_s = interval_s
        self.dropped = 0
        self.exported = 0
        self.failed_batches = 0
        self._salt = random.getrandbits(64) | 1
        self._queue: deque[RegionRow] = deque()
        self._resource = Resource.create({"cuvil.rank": rank})
        self._scope = InstrumentationScope("cuvil_pgc")
        self._start("cuvil-pgc-otel", interval_s)

    def submit(self, rows: list[RegionRow]) -> None:
        """Queue completed regions; drops (and counts) what does not fit. Never blocks."""
        room = self.max_queue - len(self._queue)
        if room < len(rows):
            self.dropped += len(rows) - max(room, 0)
            rows = rows[:max(room, 0)]
        self._queue.extend(rows)
        if len(self._queue) >= self.batch_size:
            self._wake.set()

    def _export(self) -> None:
        while self._queue:
            n = min(self.batch_size, len(self._queue))
            pop = self._queue.popleft
            batch = [self._span(pop()) for _ in range(n)]
            try:
                result = self.exporter.export(batch)
                ok = getattr(result, "name", "SUCCESS") == "SUCCESS"
            except Exception as exc:
                log.warning("cuvil-pgc: OpenTelemetry export failed: %s", exc)
                ok = False
            if ok:
                self.exported += n
            else:
                self.failed_batches += 1
                self.dropped += n

    def _span(self, row: RegionRow) -> Any:
        from opentelemetry import trace as trace_api
        from opentelemetry.sdk.trace import ReadableSpan

        name, path, rid, parent_id, root_id, start, end, tid, attrs = row
        trace_id = (self._span_id(root_id) << 64) | self._salt
        context = trace_api.SpanContext(trace_id, self._span_id(rid), is_remote=False,
                                        trace_flags=trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED))
        parent = None if parent_id is None else trace_api.SpanContext(
            trace_id, self._span_id(parent_id), is_remote=False)
        attributes: dict[str, Any] = {"cuvil.region.path": path, "cuvil.region.id": rid,
                                      "cuvil.rank": self.rank, "cuvil.duration_us": (end - start) / 1000.0,
                                      "thread.id": tid}
        for key, value in (attrs or {}).items():
            if value is not None:
                attributes["cuvil.bottleneck" if key == "bottleneck" else f"cuvil.attr.{key}"] = value
        return ReadableSpan(name=name, context=context, parent=parent, resource=self._resource,
                            attributes=attributes, start_time=start, end_time=end,
                            instrumentation_scope=self._scope)

    def _span_id(self, region_id: int) -> int:
        return ((region_id * _GOLDEN) ^ self._salt) & _MASK64 or 1
