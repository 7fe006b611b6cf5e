"""Reading trace files into the columnar Trace: ours, gzip, partial (crashed) and torch.profiler's.

``load_trace(*paths, weights=None)`` reads each file into one :class:`Source` and merges them:

- **Formats.** Our files (``cuvil`` metadata key or ``cuvil_session`` header event; format
  ``"cuvil"``) and torch.profiler / Kineto Chrome traces, CPU and GPU (format ``"kineto"``), plain
  or gzip (recognised by magic bytes). Kineto ``user_annotation`` ranges are regions (paths from
  their nesting per thread), ``cpu_op``, ``kernel``, ``cuda_runtime``/``cuda_driver``,
  ``gpu_memcpy``, ``gpu_memset`` map to their kinds, ``ac2g`` flows supply missing correlation
  ids, other categories become ``Kind.OTHER`` rows with ``args = {"cat": ...}``.
- **Aggregate summaries** (``{"cuvil_summary": ...}``, :mod:`.summary`) load as a source of
  format ``"summary"`` with no rows; their histograms are in ``metadata["summary_regions"]``.
- **Sampling.** A session that sampled root regions (``cuvil.sampling.scale`` = N) loads with its
  weight multiplied by N, so counts and totals stand for the whole run.
- **Crash recovery.** ``load_trace("x.trace.json")`` reads ``x.trace.json.partial`` when only that
  exists (or pass the partial path): every complete line is recovered, ``Source.recovered`` is
  True and ``Source.notes`` says what was dropped. The ``cuvil_session`` header gives metadata.
- **Time.** ``ts`` is µs from the earliest event (rows and counters) of all sources. Sources are
  aligned on absolute time: ours on ``cuvil.start_unix_ns``, Kineto on ``baseTimeNanoseconds``
  (``ts`` is µs after it, as torch 2.x writes) or on absolute Unix µs (older exports). A source
  whose absolute time cannot be known starts at 0, with a note. ``Source.metadata`` gains
  ``start_unix_ns`` (Kineto: the earliest event's wall time) and ``ts_offset_us`` (trace ts =
  file ts + offset).
- **Attribution** (see ``_regions``): ops and runtime calls get the innermost enclosing region on
  their thread, GPU rows the region of their launch (correlation id); a region our files already
  name in ``args.region`` is kept.
- **Kineto generations** (see ``_build``): capitalised torch 1.8-1.10 categories, ``ac2g``,
  ``async``/``launch`` and ``fwdbwd`` flows, Unix-µs, ``baseTimeNanoseconds`` and Unix-ns
  timestamps. What is not analysed is counted in ``Source.warnings`` (and ``notes``).
- **Streaming.** Kineto files of :data:`~cuvil_pgc.trace._stream.STREAM_MIN_BYTES` or more are read
  in chunks (``_stream``): the same Trace, without the file's bytes and every event's struct in
  memory at once; anything unexpected falls back to reading the file whole. Plain files are read
  by forked worker processes side by side where there are cores for them (``_parallel``).
- **Columns.** EVENT_COLUMNS plus ``events["external_id"]`` (int64, Kineto ``External id``, -1
  none) and ``events["fwdbwd"]`` (int64, the ``fwdbwd`` flow id linking a forward op and its
  backward op, -1 none), sorted by ``ts`` (longer first on ties, so parents precede children). ``region_id`` is
  unique within a source (``(source, region_id)`` across files). String pids/tids (Kineto's
  ``"Spans"``) are negative: ``trace.strings[-2 - pid]``. ``Trace.args`` is an
  :class:`~cuvil_pgc.trace._args.ArgsMap`, a ``dict[int, dict]`` whose rows are decoded when first
  read (until then they point into the file's bytes; ``trace.args.materialize()`` decodes all and
  lets them go): region user attributes, kernel launch configuration, op shapes/dtypes, compile
  details, with the key names listed in ``_args``. Counters: one row per series, named as in
  ``_build`` (``sm_util.gpu0``, ``cpu_util.total``, or the plain name for ``value`` keys).
- **Errors.** Unreadable input raises TraceError naming the file, the problem, the event index or
  JSON path where one applies, and the fix. Limits: :func:`~cuvil_pgc.trace._input.max_trace_bytes`
  (``CUVIL_MAX_TRACE_BYTES``, default a quarter of the memory available) decompressed bytes and :data:`MAX_TRACE_EVENTS`
  (``CUVIL_MAX_TRACE_EVENTS``) events per file.
"""

from __future__ import annotations

import gc
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cuvil_pgc.errors import ConfigError, CuvilError, TraceError
from cuvil_pgc.trace import _decode, _input, _parallel, _stream, _summary_source
from cuvil_pgc.trace._build import SourceColumns, build_source
from cuvil_pgc.trace._chunks import StreamFallback, build_kineto_chunks
from cuvil_pgc.trace._dynamo_timed import compile_rows
from cuvil_pgc.trace._metadata import check_metadata
from cuvil_pgc.trace._regions import resolve_regions
from cuvil_pgc.trace.columns import EXTRA_COLUMNS, Source, StringTable, Trace
from cuvil_pgc.trace.merge import Part, align, combine, first_ts

ENV_MAX_TRACE_EVENTS = "CUVIL_MAX_TRACE_EVENTS"
#: Most events accepted in one file (each costs ~150 bytes while parsing).
MAX_TRACE_EVENTS = 50_000_000
_UNIX_US_FLOOR = 1e14      # ts above this (1973 in Unix µs) is taken as absolute Unix µs


@dataclass
class _Loaded:
    source: Source
    columns: SourceColumns
    origin_ns: int | None      # Unix ns of the file's ts = 0, if knowable


def load_trace(*paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
               weights: Sequence[float] | None = None) -> Trace:
    """Read trace files (ours, ``.gz``, ``.partial``, torch.profiler) into one columnar Trace.

    Args:
        *paths: trace files (a single list of paths is accepted too).
        weights: one weight per file (repeated runs, ranks); default 1.0 each.

    Returns:
        Trace with one Source per file, rows sorted by ``ts`` (see the module docstring).

    Raises:
        TraceError: a file is missing, unreadable, or not a valid trace.
        ConfigError: ``weights`` does not match ``paths``.
    """
    files = _flatten(paths)
    if not files:
        raise TraceError("no trace files given", fix="pass one or more .trace.json files")
    if len(files) > np.iinfo(np.int16).max:
        raise TraceError(f"{len(files)} files given; at most {np.iinfo(np.int16).max} can be merged")
    ws = _weights(weights, len(files))
    strings = StringTable()
    # Loading allocates millions of objects and no cycles: the cyclic GC would only re-scan them
    # (measured: 22 s -> 14 s of CPU for 3M events). Reference counting still frees everything.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        loaded = [_load_guarded(f, strings, w) for f, w in zip(files, ws, strict=True)]
        return _merge(loaded, strings)
    finally:
        if gc_was_enabled:
            gc.enable()


def _flatten(paths: Iterable[Any]) -> list[str]:
    out: list[str] = []
    for p in paths:
        if isinstance(p, (list, tuple)):
            out.extend(_flatten(p))
        elif isinstance(p, (str, os.PathLike)):
            out.append(os.fspath(p))
        else:
            raise TraceError(f"{p!r} is not a path", fix="pass file paths as str or pathlib.Path")
    return out


def _weights(weights: Sequence[float] | None, n: int) -> list[float]:
    if weights is None:
        return [1.0] * n
    ws = list(weights)
    if len(ws) != n:
        raise ConfigError(f"{len(ws)} weights given for {n} trace files", fix="give one weight per file")
    for w in ws:
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ConfigError(f"weight {w!r} must be a positive finite number")
    return [float(w) for w in ws]


def _load_guarded(path: str, strings: StringTable, weight: float) -> _Loaded:
    try:
        return _load_one(path, strings, weight)
    except CuvilError:
        raise
    except RecursionError:
        raise TraceError("holds JSON nested too deeply to read (more than ~1,000 levels)", path=path,
                         fix="trace events nest a few levels at most; the file is damaged or hostile") from None
    except MemoryError:
        raise TraceError("does not fit in memory", path=path,
                         fix="load fewer files at once or use a machine with more memory") from None
    except Exception as exc:  # a reader bug must still name the file, not dump a traceback
        raise TraceError(f"could not be read: the reader failed unexpectedly ({type(exc).__name__}: {exc})",
                         path=path, fix="please report this with the file") from exc


def _load_one(path: str, strings: StringTable, weight: float) -> _Loaded:
    file, partial = _input.resolve(path)
    streamed = None if partial else _load_streamed(file, strings, weight)
    if streamed is not None:
        return streamed
    raw = _input.read_bytes(file, partial)
    if not partial and _summary_source.looks_like_summary(raw.data):
        return _Loaded(_summary_source.summary_source(raw.data, file, weight), _summary_source.no_rows(), None)
    _check_event_count(raw)
    notes = list(raw.notes)
    if partial:
        doc, more = _decode.recover_partial(raw)
        notes += more
    else:
        doc = _decode.decode_document(raw)
    header = _decode.session_header(doc)
    fmt = "cuvil" if isinstance(doc, _decode.Document) else "kineto"
    cols = build_source(doc, fmt, strings, file, lambda: _decode.decode_as_ours(raw).trace_events,
                        lambda: _decode.exact_ns_times(raw))
    return _source(file, fmt, doc, header, cols, strings, weight, partial, notes)


def _load_streamed(file: str, strings: StringTable, weight: float) -> _Loaded | None:
    """A large Kineto file read in chunks (``_stream``); None: read it whole instead."""
    try:
        read = _parallel.read_parallel(file, strings, _max_events())
    except StreamFallback:
        read = None
    if read is None:
        streamed = _stream.stream_kineto(file)
        if streamed is None:
            return None
        metadata, chunks = streamed
        try:
            cols = build_kineto_chunks(_limited(chunks, file), strings, file)
            read = metadata(), cols
        except StreamFallback:
            return None
    doc, cols = read
    return _source(file, "kineto", doc, None, cols, strings, weight, False, [])


def _limited(chunks: Iterable[tuple[list[Any], Any]], file: str) -> Iterable[tuple[list[Any], Any]]:
    limit, seen = _max_events(), 0
    for events, raw in chunks:
        seen += len(events)
        if seen > limit:
            raise StreamFallback("over the event limit")     # the whole-file path says so
        yield events, raw


def _source(file: str, fmt: str, doc: Any, header: dict[str, Any] | None, cols: SourceColumns,
            strings: StringTable, weight: float, partial: bool, notes: list[str]) -> _Loaded:
    if fmt == "kineto":
        compile_rows(cols, strings)       # torch.compile's own ranges: compile rows, not ops and regions
    resolve_regions(cols, strings)
    if fmt == "cuvil":
        meta = check_metadata(doc.cuvil if doc.cuvil is not None else header or {}, file, notes)
        drops = _decode.partial_drop_counts(doc) if doc.cuvil is None else None
        if drops is not None:                  # a partial: its latest drop counters stand in
            meta.setdefault("dropped", drops)
        origin = _int_or_none(meta.get("start_unix_ns"))
    else:
        meta = _kineto_metadata(doc)
        origin = _kineto_origin(doc, cols)
    meta["thread_names"] = cols.thread_names
    meta["process_names"] = cols.process_names
    weight *= _sampling_scale(meta)
    source = Source(path=file, format=fmt, metadata=meta, rank=_rank(meta), weight=weight,
                    recovered=partial, notes=notes + cols.notes, warnings=list(cols.warnings))
    if partial:
        source.notes.insert(0, f"recovered {len(cols.cols['ts'])} events from a partial file "
                               "(the session did not finish)")
    return _Loaded(source, cols, origin)


def _sampling_scale(meta: dict[str, Any]) -> float:
    """What one recorded root-region call stands for in a sampled session (1.0 when not sampled)."""
    sampling = meta.get("sampling")
    scale = sampling.get("scale") if isinstance(sampling, dict) else None
    if isinstance(scale, (int, float)) and not isinstance(scale, bool) and math.isfinite(scale) and scale >= 1:
        return float(scale)
    return 1.0


def _check_event_count(raw: _input.RawInput) -> None:
    limit = _max_events()
    if len(raw.data) // 3 <= limit:      # every event takes at least 3 bytes: "{}" and a comma
        return
    upper = raw.data.count(b"{")
    if upper > limit:
        raise TraceError(f"holds up to {upper:,} JSON objects, more than the {limit:,} events one trace may "
                         "have", path=raw.path,
                         fix=f"set {ENV_MAX_TRACE_EVENTS} higher if this machine has the memory")


def _max_events() -> int:
    text = os.environ.get(ENV_MAX_TRACE_EVENTS)
    if not text:
        return MAX_TRACE_EVENTS
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"environment variable {ENV_MAX_TRACE_EVENTS}={text!r} is not an integer") from None
    if value <= 0:
        raise ConfigError(f"environment variable {ENV_MAX_TRACE_EVENTS}={value} must be positive")
    return value


def _int_or_none(value: Any) -> int | None:
    return value if type(value) is int and -(2**63) <= value < 2**63 else None


def _rank(meta: dict[str, Any]) -> int:
    rank = meta.get("rank")
    return rank if type(rank) is int and 0 <= rank < 2**31 else 0


def _kineto_metadata(doc: _decode.Document) -> dict[str, Any]:
    """What a Kineto file says of itself, in the shape of our ``cuvil`` object where it can."""
    dist = doc.distributed_info or {}
    meta: dict[str, Any] = {
        "host": doc.host_name,
        "rank": dist.get("rank", 0),
        "world_size": dist.get("world_size", 1),
        "devices": _devices(doc),
    }
    kineto = {k: v for k, v in (
        ("schemaVersion", doc.schema_version), ("baseTimeNanoseconds", doc.base_time_ns),
        ("displayTimeUnit", doc.display_time_unit), ("traceName", doc.trace_name), ("trace_id", doc.trace_id),
        ("record_shapes", doc.record_shapes), ("distributedInfo", doc.distributed_info),
        ("cuda_driver_version", doc.cuda_driver_version), ("cuda_runtime_version", doc.cuda_runtime_version),
        ("cupti_version", doc.cupti_version), ("hip_runtime_version", doc.hip_runtime_version),
        ("roctracer_version", doc.roctracer_version)) if v is not None}
    meta["kineto"] = kineto
    return meta


#: torch 1.8's Kineto wrote ``computeProperties`` with these keys; later ones ``deviceProperties``
_OLD_DEVICE_KEYS = {"major": "computeMajor", "minor": "computeMinor", "multiProcessorCount": "numSms",
                    "maxThreadsPerMultiProcessor": "maxThreadsPerMultiprocessor"}


def _devices(doc: _decode.Document) -> list[Any]:
    """The file's GPUs: ``deviceProperties``, or torch 1.8's ``computeProperties`` under today's keys."""
    if doc.device_properties is not None or not doc.compute_properties:
        return list(doc.device_properties or [])
    return [{_OLD_DEVICE_KEYS.get(k, k): v for k, v in d.items()} if isinstance(d, dict) else d
            for d in doc.compute_properties]


def _kineto_origin(doc: _decode.Document, cols: SourceColumns) -> int | None:
    if cols.origin_ns is not None:             # the file counted in Unix ns
        return cols.origin_ns
    shift_ns = cols.shift_us * 1000            # the file's ts = shift_us is 0 in its columns
    if doc.base_time_ns is not None:
        return doc.base_time_ns + shift_ns
    first = _local_min(cols)
    return shift_ns if first is not None and first + cols.shift_us > _UNIX_US_FLOOR else None


def _local_min(cols: SourceColumns) -> float | None:
    return first_ts(cols.cols["ts"], cols.counters["ts"])


def _merge(loaded: list[_Loaded], strings: StringTable) -> Trace:
    """The files as one Trace through the one merge (:mod:`.merge`): aligned on absolute time."""
    firsts = [_local_min(item.columns) for item in loaded]
    offsets = align([item.origin_ns for item in loaded], firsts)
    _note_alignment(loaded, firsts, offsets)
    parts = [_part(item) for item in loaded]
    return combine(parts, offsets, strings, [item.source for item in loaded])


def _note_alignment(loaded: list[_Loaded], firsts: list[float | None], offsets: list[float]) -> None:
    """What the alignment did, in each source: ``ts_offset_us``, a Kineto file's ``start_unix_ns``
    (its earliest event's wall time) and a note on a file without a time anchor."""
    for item, first, offset in zip(loaded, firsts, offsets, strict=True):
        anchored = item.origin_ns is not None and first is not None
        if anchored and item.source.format == "kineto":
            item.source.metadata["start_unix_ns"] = item.origin_ns + round(first * 1000)
        if not anchored and first is not None and len(loaded) > 1:
            item.source.notes.append("no absolute time anchor in this file; aligned to start at 0")
        item.source.metadata["ts_offset_us"] = offset


def _part(item: _Loaded) -> Part:
    """The file's columns handed over to the merge (the source keeps no reference to them)."""
    cols = item.columns
    part = Part(events=cols.cols, counters=cols.counters, args=cols.args, origin_ns=item.origin_ns,
                extra=tuple(EXTRA_COLUMNS))
    cols.cols, cols.counters, cols.args = {}, {}, {}
    return part
