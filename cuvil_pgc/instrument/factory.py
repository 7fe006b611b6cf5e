"""``profile()``: the one entry point that picks the kind of session for its options.

``profile(path, **options)`` returns, without starting it (``with`` or ``.start()`` does):

- a :class:`~cuvil_pgc.instrument._joined.JoinedSession` when ``cuvil-pgc profile`` already records
  this program (its regions go to the outer trace);
- an :class:`~cuvil_pgc.instrument.on_demand.OnDemandController` for ``on_demand=True``;
- an :class:`~cuvil_pgc.instrument.aggregate.AggregateSession` for ``mode="aggregate"``;
- a :class:`~cuvil_pgc.instrument.windows.ScheduledSession` for ``schedule=...``;
- else an event :class:`~cuvil_pgc.instrument.session.Session`.

It sits above every session kind (they import nothing from here), and imports each only when
asked for it, so ``from cuvil_pgc import profile`` stays as cheap as ``ProfileRegion``.
"""

from __future__ import annotations

import os
from typing import Any

from cuvil_pgc.errors import ConfigError
from cuvil_pgc.instrument.config import SessionConfig
from cuvil_pgc.instrument.session import Session, active_session


def profile(path: str | os.PathLike[str] = "cuvil.trace.json", **options: Any) -> Any:
    """Start recording into ``path`` when entered: ``with profile("run.trace.json", ops=True):``.

    Keyword options are the fields of :class:`SessionConfig` (``ops``, ``gpu``, ``sample_hz``,
    ``compile``, ``flush_interval_s``, ``otel``, ...). Environment variables fill what is not given.
    ``otel_exporter=`` passes an OpenTelemetry SpanExporter instead of the one OTEL_* names.
    ``schedule=cuvil_pgc.schedule(...)`` (with ``on_trace_ready``, ``max_files``, ``max_bytes``)
    returns a :class:`~cuvil_pgc.instrument.windows.ScheduledSession` writing one file per window;
    ``mode="aggregate"`` an :class:`~cuvil_pgc.instrument.aggregate.AggregateSession` (histograms
    in ``path``, options ``flush_s``, ``max_paths``); ``on_demand=True`` an
    :class:`~cuvil_pgc.instrument.on_demand.OnDemandController` (aggregates, windows on request,
    written beside ``path``).
    """
    outer = active_session()
    if outer is not None and outer.joinable:
        from cuvil_pgc.instrument._joined import JoinedSession

        return JoinedSession(outer, os.fspath(path))
    otel_exporter = options.pop("otel_exporter", None)
    mode = options.pop("mode", "events")
    if options.pop("on_demand", False):
        from cuvil_pgc.instrument.on_demand import OnDemandController

        return OnDemandController(os.path.dirname(os.path.abspath(os.fspath(path))), **options)
    if mode == "aggregate":
        from cuvil_pgc.instrument.aggregate import AggregateSession

        return AggregateSession(os.fspath(path), **options)
    if mode != "events":
        raise ConfigError(f"mode={mode!r} is not 'events' or 'aggregate'")
    window_options = {k: options.pop(k) for k in ("schedule", "on_trace_ready", "max_files", "max_bytes")
                      if k in options}
    config = SessionConfig.from_env(path=os.fspath(path), **options)
    if window_options.get("schedule") is not None:
        from cuvil_pgc.instrument.windows import ScheduledSession

        return ScheduledSession(config, otel_exporter=otel_exporter, **window_options)
    if window_options:
        raise ConfigError(f"{', '.join(window_options)} need schedule=cuvil_pgc.schedule(...)")
    return Session(config, otel_exporter=otel_exporter)
