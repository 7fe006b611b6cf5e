"""Recording sessions: ``with profile("run.trace.json") as session: ...`` (``profile()`` is in :mod:`.factory`).

A session installs the region recorder, starts the configured samplers and a writer thread that
drains per-thread buffers into the partial trace file every ``flush_interval_s``. Stopping
finishes the file atomically (trace.writer). One session records per process at a time.

Nothing here raises into the user's program once recording has started: failures of samplers or
of the disk are logged once, counted, and reported in the trace metadata. Starting does not raise
for the disk either: a session that cannot create its file (no space, no permission) records
itself unavailable (``Session.unavailable``, ``sampler_status["trace"]``, one log line) and the
program runs unrecorded. A partial file left by a crashed writer is moved aside (trace._leftover,
logged once); one a live process writes makes this session write ``<stem>.pid<N><suffix>``.
The drop counters go into the partial file as they change (``cuvil_dropped`` events), so a trace
recovered after a crash still says what was dropped. A forked child inherits no session: it
never writes, finishes or removes its parent's file (``os.register_at_fork``).
"""

from __future__ import annotations

import logging
import os
import platform
import re
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from cuvil_pgc._cpu_identity import cpu_identity
from cuvil_pgc._version import __version__
from cuvil_pgc.errors import SessionError
from cuvil_pgc.instrument import region as _region
from cuvil_pgc.instrument._buffers import RegionRecorder
from cuvil_pgc.instrument._eventlines import format_regions
from cuvil_pgc.instrument._ranks import rank_and_world
from cuvil_pgc.instrument.clock import SessionClock
from cuvil_pgc.instrument.config import SessionConfig
from cuvil_pgc.instrument.region import frame_path
from cuvil_pgc.instrument.samplers import build_samplers
from cuvil_pgc.instrument.samplers.base import Sampler, SamplerContext
from cuvil_pgc.trace import schema
from cuvil_pgc.trace.schema import split_trace_path
from cuvil_pgc.trace.writer import PartialInUse, TraceWriter, dumps

log = logging.getLogger("cuvil_pgc")

_active: Session | None = None
_active_lock = threading.Lock()


def active_session() -> Session | None:
    """The session recording in this process, if any."""
    return _active


class Session:
    """One recording: regions, samplers and the trace file they stream into."""

    def __init__(self, config: SessionConfig, samplers: list[Sampler] | None = None,
                 otel_exporter: Any = None) -> None:
        self.config = config
        self.rank, self.world_size = rank_and_world()
        self._otel_exporter = otel_exporter
        self._otel: Any = None
        self.path = config.path
        self.samplers = build_samplers(config) if samplers is None else samplers
        self.clock: SessionClock | None = None
        self.pid = os.getpid()
        self.dropped: dict[str, int] = {}
        self.sampler_status: dict[str, dict[str, Any]] = {}
        self._recorder = RegionRecorder(config.buffer_events)
        self._writer: TraceWriter | None = None
        self._emitted: deque[list[dict[str, Any]]] = deque()
        self._retain = any(getattr(s, "needs_regions", False) for s in self.samplers)
        self._kept: tuple[list[int], list[float], list[float], list[Any]] = ([], [], [], [])
        self._names_json: dict[str, bytes] = {}
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._io_lock = threading.Lock()
        self._failed_io: str | None = None
        self.unavailable: str | None = None      # why this session records nothing (its file failed)
        self.leftover: dict[str, Any] | None = None
        self._drops_written: dict[str, int] = {}
        self._id_floor = 1 << 62                  # set at start: ids below it are earlier sessions'
        self._logged: set[str] = set()
        self._recording = False
        self.joinable = False       # `cuvil-pgc profile`: the program's own profile() joins this session
        self.joined: list[str] = []  # paths those inner profile() calls asked for
        self.steps = 0
        self._keep_from_us = float("-inf")
        self._filter = re.compile(config.filter).search if config.filter else None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, record_regions: bool = True) -> Session:
        """Open the trace and start the samplers; with ``record_regions=False`` (a warm-up) regions
        are not recorded and nothing is kept until :meth:`begin_recording`."""
        global _active
        with _active_lock:
            if _active is not None:
                raise SessionError(f"a session is already recording to {_active.path}",
                                   path=self.path, fix="stop it before starting another (one session per "
                                   "process), or record into it: cuvil_pgc.active_session()")
            self.rank, self.world_size = rank_and_world()
            if self.world_size > 1:
                self.path = rank_path(self.config.path, self.rank)
            self.clock = SessionClock.now()
            self._id_floor = _region.reserve_id()
            self._writer = self._open_writer()
            _active = self
        if self._writer is None:
            return self
        self._start_samplers()
        self._start_otel()
        if record_regions:
            self.begin_recording()
            self._keep_from_us = float("-inf")     # everything the samplers saw since start is kept
        else:
            self._keep_from_us = float("inf")      # warm-up: nothing is kept until begin_recording
        self._thread = threading.Thread(target=self._flush_loop, name="cuvil-pgc-writer", daemon=True)
        self._thread.start()
        return self

    def _open_writer(self) -> TraceWriter | None:
        """The trace writer, or None with the reason in ``unavailable`` (never raises for the disk)."""
        try:
            try:
                writer = TraceWriter(self.path, self._header())
            except PartialInUse as busy:
                stem, suffix = split_trace_path(self.path)
                self.path = f"{stem}.pid{self.pid}{suffix}"
                log.warning("cuvil-pgc: %s; this session records to %s instead", busy.problem, self.path)
                writer = TraceWriter(self.path, self._header())
        except (OSError, SessionError) as exc:
            reason = exc.problem if isinstance(exc, SessionError) else f"{type(exc).__name__}: {exc}"
            self.unavailable = f"cannot write {self.path}: {reason}"
            log.warning("cuvil-pgc: recording is off for this session (%s); the program runs unrecorded",
                        self.unavailable)
            self.sampler_status["trace"] = {"status": schema.STATUS_UNAVAILABLE, "reason": self.unavailable}
            for sampler in self.samplers:
                self.sampler_status[sampler.name] = {"status": schema.STATUS_UNAVAILABLE,
                                                     "reason": "the session has no trace file"}
            return None
        if writer.leftover is not None:
            found = writer.leftover
            self.leftover = {"path": found.partial, "moved_to": found.moved_to, "pid": found.pid,
                             "reason": found.reason}
            log.warning("cuvil-pgc: %s was left by a session that did not finish (%s); moved it to %s, where "
                        "`cuvil-pgc summary %s` recovers it", found.partial, found.reason, found.moved_to,
                        found.moved_to)
        return writer

    def begin_recording(self) -> None:
        """Start recording regions (and keeping sampler events) from now on."""
        if self._recording or self._writer is None:
            return
        self._keep_from_us = self.clock.mono_to_us(time.perf_counter_ns())
        _region.set_sampling(self.config.sampling_policy())
        _region.attach(self._recorder)
        self._recording = True

    def stop(self) -> str | None:
        """Finish the trace; returns its path (None if the disk failed; the partial stays)."""
        global _active
        if _active is not self:
            return None
        if self._recording:
            _region.detach(self._recorder)
            _region.set_sampling(None)
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        self._drain_regions()
        for sampler in self.samplers:
            self._guard(sampler, "stop", sampler.stop)
        self._stop_otel()
        path = self._finish()
        with _active_lock:
            _active = None
        return path

    def step(self) -> None:
        """Mark the end of one step of the user's loop (counted; schedules act on it)."""
        self.steps += 1

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- samplers --------------------------------------------------------------------------
    def _start_samplers(self) -> None:
        ctx = SamplerContext(clock=self.clock, config=self.config, emit=self._emit,
                             count_dropped=self.count_dropped, region_index=self.region_index,
                             pid=self.pid)
        for sampler in self.samplers:
            reason = self._call_quiet(sampler.unavailable)
            if reason:
                self.sampler_status[sampler.name] = {"status": schema.STATUS_UNAVAILABLE, "reason": reason}
                sampler.status = self.sampler_status[sampler.name]
                continue
            self.sampler_status[sampler.name] = sampler.status
            self._guard(sampler, "start", lambda s=sampler: s.start(ctx))

    def _start_otel(self) -> None:
        if not (self.config.otel or self._otel_exporter is not None):
            return
        try:
            from cuvil_pgc.instrument.otel import OtelRegionExporter, exporter_from_env

            exporter = self._otel_exporter or exporter_from_env()
            if exporter is None:
                self.sampler_status["otel"] = {"status": schema.STATUS_DISABLED, "reason": "OTEL_TRACES_EXPORTER=none"}
                return
            self._otel = OtelRegionExporter(exporter, rank=self.rank)
            self.sampler_status["otel"] = {"status": schema.STATUS_OK}
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            self._log_once("otel", f"cuvil-pgc: OpenTelemetry export disabled ({reason})")
            self.sampler_status["otel"] = {"status": schema.STATUS_UNAVAILABLE, "reason": reason}

    def _stop_otel(self) -> None:
        if self._otel is None:
            return
        self._otel.shutdown()
        self.count_dropped("otel", self._otel.dropped)
        self.sampler_status["otel"].update(exported=self._otel.exported, failed_batches=self._otel.failed_batches)

    def _live_samplers(self) -> list[Sampler]:
        return [s for s in self.samplers if self.sampler_status.get(s.name, {}).get("status") == schema.STATUS_OK]

    def _guard(self, sampler: Sampler, what: str, call) -> None:
        if self.sampler_status.get(sampler.name, {}).get("status") != schema.STATUS_OK:
            return
        try:
            call()
        except Exception as exc:  # a sampler must never take the user's program down
            reason = f"{what} failed: {type(exc).__name__}: {exc}"
            self._log_once(sampler.name, f"cuvil-pgc: sampler {sampler.name} disabled ({reason})")
            self.sampler_status[sampler.name] = {"status": schema.STATUS_FAILED, "reason": reason}
            sampler.status = self.sampler_status[sampler.name]

    def _call_quiet(self, fn) -> Any:
        try:
            return fn()
        except Exception as exc:
            return f"availability check failed: {type(exc).__name__}: {exc}"

    def _emit(self, events: Iterable[dict[str, Any]]) -> None:
        self._emitted.append(list(events))

    def count_dropped(self, source: str, n: int) -> None:
        """Record that ``n`` events from ``source`` were dropped (reported in the metadata)."""
        if n:
            self.dropped[source] = self.dropped.get(source, 0) + n

    def region_index(self):
        """An index over the regions completed so far, for attributing ops and kernels."""
        from cuvil_pgc.trace.attribution import RegionIndex

        tids, starts, ends, frames = self._kept
        n = min(len(tids), len(starts), len(ends), len(frames))
        return RegionIndex(tids[:n], starts[:n], ends[:n]), _FrameIds(frames[:n])

    # -- writing ---------------------------------------------------------------------------
    def _flush_loop(self) -> None:
        interval = self.config.flush_interval_s
        while _active is self and not self._wake.is_set():
            self._wake.wait(interval)
            if self._wake.is_set():
                break
            self._drain_regions()
            for sampler in self._live_samplers():
                self._guard(sampler, "flush", sampler.flush)
            self._write_emitted()
            self._write_drop_counts()
            self._io(lambda w: w.flush())

    def _drain_regions(self) -> None:
        for buf, frames in self._recorder.drain():
            try:
                self._write_regions(buf.tid, frames)
            except Exception as exc:   # e.g. a ProfileRegion subclass that broke its name
                self.count_dropped("regions", len(frames))
                self._log_once("write-regions", f"cuvil-pgc: {len(frames)} regions could not be written "
                                                f"({type(exc).__name__}: {exc}); they are counted as dropped")

    def _write_regions(self, tid: int, frames: list) -> None:
        """Serialise one thread's ended region frames as Chrome ``X`` event lines (_eventlines)."""
        if self._filter is not None:
            frames = [f for f in frames if self._filter(frame_path(f))]
            if not frames:
                return
        s0 = self.clock.start_mono_ns
        head = b'{"ph":"X","cat":"region","pid":%d,"tid":%d,"name":' % (self.pid, tid)
        decl_head = b'{"ph":"M","name":"%s","pid":%d,"tid":%d,"args":{"name":' % (
            schema.META_REGION_EVENT.encode(), self.pid, tid)
        data = format_regions(frames, head, decl_head, s0, self._id_floor, self._names_json, _region_json, dumps)
        self._io(lambda w: w.write_raw(data, len(frames)))
        if self._otel is not None:
            unix0 = self.clock.start_unix_ns - s0
            self._otel.submit([_span_row(f, unix0, tid) for f in frames])
        if self._retain:
            tids, starts, ends, kept = self._kept
            tids.extend([tid] * len(frames))
            starts.extend([(f[2] - s0) / 1000.0 for f in frames])
            ends.extend([(f[5] - s0) / 1000.0 for f in frames])
            kept.extend(frames)

    def _drop_counts(self) -> dict[str, int]:
        """Everything dropped so far, per source (the regions' buffers included)."""
        counts = dict(self.dropped)
        regions = self._recorder.dropped()
        if regions:
            counts["regions"] = counts.get("regions", 0) + regions
        return counts

    def _write_drop_counts(self) -> None:
        """Append the drop counters to the partial file when they changed: a crash keeps them."""
        counts = self._drop_counts()
        if counts == self._drops_written:
            return
        self._drops_written = counts
        event = {"ph": "M", "name": schema.META_DROPPED_EVENT, "pid": self.pid, "tid": 0, "args": counts}
        self._io(lambda w: w.write_events([event]))

    def _forked(self) -> None:
        """In a forked child (see _after_fork_in_child): let go of everything the parent owns."""
        self._recording = False
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.disown()

    def _write_emitted(self) -> None:
        while self._emitted:
            events = self._kept_events(self._emitted.popleft())
            self._io(lambda w, ev=events: w.write_events(ev))

    def _kept_events(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Drop sampler events from before recording began (warm-up) and those the filter rejects."""
        cutoff, match = self._keep_from_us, self._filter
        if cutoff > float("-inf"):
            events = [e for e in events if e.get("ph") == "M" or e.get("ts", cutoff) >= cutoff]
        if match is not None:     # a region_id names a kept region: one the filter let through
            events = [e for e in events if e.get("ph") in ("M", "C") or match(e.get("name", ""))
                      or (e.get("args") or {}).get("region_id") is not None]
        return events

    def _io(self, fn) -> None:
        with self._io_lock:
            if self._failed_io is not None or self._writer is None:
                return
            try:
                fn(self._writer)
            except Exception as exc:
                self._failed_io = f"{type(exc).__name__}: {exc}"
                self._log_once("io", f"cuvil-pgc: writing {self.path} failed ({self._failed_io}); "
                                     f"events recorded so far stay in {self.path}{schema.PARTIAL_SUFFIX}")

    def _finish(self) -> str | None:
        self._write_emitted()
        self.count_dropped("regions", self._recorder.dropped())
        last = [{"ph": "M", "name": "thread_name", "pid": self.pid, "tid": b.tid,
                 "args": {"name": b.thread_name}} for b in self._recorder.buffers]
        last.append({"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0,
                     "args": {"name": f"cuvil-pgc {os.path.basename(sys.argv[0] or 'python')}"}})
        result: list[str] = []
        self._io(lambda w: result.append(w.close(last, self.metadata())))
        if not result and self._writer is not None:
            self._writer.abandon()
        return result[0] if result else None

    def _header(self) -> dict[str, Any]:
        torch = sys.modules.get("torch")
        rank, world = self.rank, self.world_size
        return {
            "schema_version": schema.SCHEMA_VERSION,
            "version": __version__,
            "host": socket.gethostname(),
            "cpu": cpu_identity(),          # whether a calibration describes the recording CPU
            "pid": self.pid,
            "rank": rank,
            "world_size": world,
            "python": platform.python_version(),
            "torch": getattr(torch, "__version__", None),
            "platform": platform.platform(),
            "devices": [],
            "start_unix_ns": self.clock.start_unix_ns,
            "start_monotonic_ns": self.clock.start_mono_ns,
            "command": list(sys.argv),
        }

    def metadata(self) -> dict[str, Any]:
        """The ``cuvil`` object of the finished trace."""
        meta = self._header()
        devices = [d for s in self.samplers for d in getattr(s, "devices", [])]
        meta.update(devices=devices, dropped=dict(self.dropped),
                    samplers={k: dict(v) for k, v in self.sampler_status.items()},
                    config={"ops": self.config.ops, "gpu": self.config.gpu, "sample_hz": self.config.sample_hz,
                            "flush_interval_s": self.config.flush_interval_s, "filter": self.config.filter,
                            "record_shapes": self.config.record_shapes, "with_stack": self.config.with_stack,
                            "profile_memory": self.config.profile_memory})
        if self.config.sampling_scale != 1.0:
            meta["sampling"] = {"every": self.config.sample_every, "rate": self.config.sample_rate,
                                "scale": self.config.sampling_scale,
                                "note": "root regions sampled; their subtrees follow; ops and kernels not sampled"}
        if self._failed_io:
            meta["io_error"] = self._failed_io
        if self.joined:
            meta["joined"] = list(self.joined)
        if self.leftover is not None:
            meta["previous_partial"] = dict(self.leftover)
        return meta

    def _log_once(self, key: str, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.warning(message)


def _region_json(region: _region.ProfileRegion) -> tuple[bytes, bytes]:
    """A region's name and attributes as JSON fragments, cached on the region."""
    attrs = dumps(region.attrs)[1:-1] if region.attrs else b""
    region._json = (dumps(region.name), b"," + attrs if attrs else b"")
    return region._json


class _FrameIds:
    """The ids of kept region frames, as this file's region lines give them: ops and kernels name
    their region by ``args.region_id`` (a path would cost its depth in bytes on every event)."""

    __slots__ = ("_frames",)

    def __init__(self, frames: list) -> None:
        self._frames = frames

    def __len__(self) -> int:
        return len(self._frames)

    def __getitem__(self, i: int) -> int:
        return self._frames[i][3]


def _span_row(frame: list, unix0: int, tid: int) -> tuple:
    """One written (so identified), ended region frame as an OtelRegionExporter row (Unix ns)."""
    region, parent, start, rid, end = frame[0], frame[1], frame[2], frame[3], frame[5]
    path = frame_path(frame)
    root = frame
    while root[1] is not None:
        root = root[1]
    return (region.name, path, rid, None if parent is None else parent[3], root[3],
            start + unix0, end + unix0, tid, region.attrs)


def _after_fork_in_child() -> None:
    """A forked child inherits no session: the parent's stays the parent's (its file, its
    regions); the child may start its own. Module state the parent's threads held is reset."""
    global _active, _active_lock
    _active_lock = threading.Lock()
    session, _active = _active, None
    if session is not None:
        session._forked()
    _region.set_sampling(None)
    _region.set_recorder(None)        # aggregates and capture windows are the parent's too


os.register_at_fork(after_in_child=_after_fork_in_child)


def rank_path(path: str, rank: int) -> str:
    """``run.trace.json`` -> ``run.rank3.trace.json`` (each rank of a job writes its own file)."""
    stem, suffix = split_trace_path(path)
    return f"{stem}.rank{rank}{suffix}"
