"""Reading trace files into the columnar Trace: ours, gzip, partial (crashed) and torch.profiler's.

``load_trace(*paths, weights=None)`` reads each file into one :class:`Source` and merges them:

- **Formats.** Our files (``cuvil`` metadata key or ``cuvil_session`` header event; format
  ``"cuvil"``) and torch.profiler / Kineto Chrome traces, CPU and GPU (format ``"kineto"``), plain
  or gzip (recognised by magic bytes). Kineto ``user_annotation`` ranges are regions (paths from
  their nesting per thread), ``cpu_op``, ``kernel``, ``cuda_runtime``/``cuda_driver``,
  ``gpu_memcpy``, ``gpu_memset`` map to their kinds, ``ac2g`` flows supply missing correlation
  ids, other categories become ``Kind.OTHER`` rows with ``args = {"cat": ...}``.
- **Aggregate summaries** (``{"cuvil_summary": ...}``, instrument.aggregate) load as a source of
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
  memory at once; anything unexpected falls back to reading the file whole.
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
from cuvil_pgc.trace import _decode, _input, _stream, _summary
from cuvil_pgc.trace._args import ArgsMap, RowArgs
from cuvil_pgc.trace._build import SourceColumns, StreamFallback, build_kineto_chunks, build_source
from cuvil_pgc.trace._metadata import check_metadata
from cuvil_pgc.trace._regions import resolve_regions
from cuvil_pgc.trace.columns import COUNTER_COLUMNS, EVENT_COLUMNS, Source, StringTable, Trace

ENV_MAX_TRACE_EVENTS = "CUVIL_MAX_TRACE_EVENTS"
#: Most events accepted in one file (each costs ~150 bytes while parsing).
MAX_TRACE_EVENTS = 50_000_000
EXTRA_COLUMNS = {"external_id": np.dtype(np.int64), "fwdbwd": np.dtype(np.int64)}
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
    if not partial and _summary.looks_like_summary(raw.data):
        return _Loaded(_summary.summary_source(raw.data, file, weight), _summary.no_rows(), None)
    _check_event_count(raw)
    notes = list(raw.notes)
    if partial:
        doc, more = _decode.recover_partial(raw)
        notes += more
    else:
        doc = _decode.decode_document(raw)
    header = _decode.session_header(doc)
    fmt = "cuvil" if isinstance(doc, _decode.Document) else "kineto"
    cols = build_source(doc, fmt, strings, file, lambda: _decode.decode_as_ours(raw).trace_events)
    return _source(file, fmt, doc, header, cols, strings, weight, partial, notes)


def _load_streamed(file: str, strings: StringTable, weight: float) -> _Loaded | None:
    """A large Kineto file read in chunks (``_stream``); None: read it whole instead."""
    streamed = _stream.stream_kineto(file)
    if streamed is None:
        return None
    metadata, chunks = streamed
    try:
        cols = build_kineto_chunks(_limited(chunks, file), strings, file)
        doc = metadata()
    except StreamFallback:
        return None
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
        "devices": list(doc.device_properties or []),
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


def _kineto_origin(doc: _decode.Document, cols: SourceColumns) -> int | None:
    if cols.origin_ns is not None:             # the file counted in Unix ns
        return cols.origin_ns
    if doc.base_time_ns is not None:
        return doc.base_time_ns
    first = _local_min(cols)
    return 0 if first is not None and first > _UNIX_US_FLOOR else None


def _local_min(cols: SourceColumns) -> float | None:
    mins = [float(a.min()) for a in (cols.cols["ts"], cols.counters["ts"]) if len(a)]
    return min(mins) if mins else None


def _merge(loaded: list[_Loaded], strings: StringTable) -> Trace:
    offsets = _align(loaded)
    parts = [item.columns for item in loaded]
    sizes = [len(p.cols["ts"]) for p in parts]
    ts = np.concatenate([p.cols["ts"] + off for p, off in zip(parts, offsets, strict=True)])
    dur = np.concatenate([p.cols["dur"] for p in parts])
    order = np.lexsort((-dur, ts))
    events = {"ts": ts[order], "dur": dur[order]}
    del ts, dur
    for col, dtype in {**EVENT_COLUMNS, **EXTRA_COLUMNS}.items():   # one column at a time: peak ~1x
        if col in events:
            continue
        if col == "source":
            whole = np.concatenate([np.full(n, s, dtype=np.int16) for s, n in enumerate(sizes)])
        else:
            whole = np.concatenate([p.cols.pop(col) for p in parts]).astype(dtype, copy=False)
        events[col] = whole[order]
        del whole
    for p in parts:
        p.cols.pop("ts", None)
        p.cols.pop("dur", None)
        p.cols.pop("lane", None)
    rank_of_row = np.empty(len(order), dtype=np.int64)
    rank_of_row[order] = np.arange(len(order))
    args = _merge_args(parts, sizes, rank_of_row)
    counters = _merge_counters(parts, offsets)
    return Trace(strings=strings, events=events, counters=counters, args=args,
                 sources=[item.source for item in loaded])


def _align(loaded: list[_Loaded]) -> list[float]:
    """Per-source µs offsets putting every source on one clock starting at the earliest event.

    The earliest anchored event is found and subtracted in µs relative to its own file's origin, not
    through whole Unix nanoseconds: a file whose ts carry fractions of a nanosecond (1.6875 µs)
    would otherwise start half a nanosecond off zero."""
    firsts = [_local_min(item.columns) for item in loaded]
    anchored: list[tuple[int, float]] = []          # (origin ns, first µs) of the anchored sources
    for item, first in zip(loaded, firsts, strict=True):
        if item.origin_ns is not None and first is not None:
            anchored.append((item.origin_ns, first))
            if item.source.format == "kineto":
                item.source.metadata["start_unix_ns"] = item.origin_ns + round(first * 1000)
    if anchored:
        base = anchored[0][0]
        zero_origin, zero_first = min(anchored, key=lambda a: (a[0] - base) / 1000.0 + a[1])
    offsets: list[float] = []
    for item, first in zip(loaded, firsts, strict=True):
        if item.origin_ns is None or first is None:
            offset = -(first or 0.0)
            if first is not None and len(loaded) > 1:
                item.source.notes.append("no absolute time anchor in this file; aligned to start at 0")
        else:
            offset = (item.origin_ns - zero_origin) / 1000.0 - zero_first
        item.source.metadata["ts_offset_us"] = offset
        offsets.append(offset)
    return offsets


def _merge_args(parts: list[SourceColumns], sizes: list[int], rank_of_row: np.ndarray) -> ArgsMap:
    """Every source's args as one int32 column of codes (in merged row order) into their values."""
    whole = RowArgs.concat([p.args for p in parts], sizes)
    for p in parts:
        p.args = {}
    codes = np.empty(len(whole.codes), dtype=np.int32)
    codes[rank_of_row] = whole.codes
    return ArgsMap(codes=codes, values=whole.values)


def _merge_counters(parts: list[SourceColumns], offsets: list[float]) -> dict[str, np.ndarray]:
    counters = {col: np.concatenate([p.counters[col] for p in parts]).astype(dtype, copy=False)
                for col, dtype in COUNTER_COLUMNS.items() if col != "source"}
    counters["source"] = np.concatenate([np.full(len(p.counters["ts"]), s, dtype=np.int16)
                                         for s, p in enumerate(parts)])
    counters["ts"] = counters["ts"] + np.concatenate([np.full(len(p.counters["ts"]), off)
                                                      for p, off in zip(parts, offsets, strict=True)])
    order = np.argsort(counters["ts"], kind="stable")
    return {col: arr[order] for col, arr in counters.items()}
