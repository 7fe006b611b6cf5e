"""Traces as Arrow tables: flattened, one row per event, every row carrying its trace's key.

``to_arrow(trace)`` turns a :class:`~cuvil_pgc.trace.columns.Trace` (ours, Kineto or aggregate
summaries) into the tables below; ``from_arrow(tables)`` rebuilds a Trace that analyses the same.
:mod:`cuvil_pgc.trace.parquet` writes and reads them as a partitioned Parquet dataset.

Schema version :data:`SCHEMA_VERSION` (in every table's schema metadata ``cuvil.schema_version``
and in the ``traces`` table). Versions: 1, the first; 2 adds ``fwdbwd`` to the event tables and
``warnings`` to ``traces``. Readers take every version up to theirs: a column an older file lacks
reads as its :data:`ADDED_COLUMNS` default (``fwdbwd`` -1, ``warnings`` empty). Tables (each also
has ``trace_key``, ``run_id``, ``rank``):

- ``traces``: one row per source file: ``world_size``, ``host``, ``pid``, ``window`` (the schedule
  window index, from ``run.<N>.trace.json``), ``start_time`` (UTC timestamp of ``ts_us = 0``, the
  source's earliest row; null when the file has no wall-clock anchor), ``start_unix_ns``, ``format``
  (cuvil, kineto, summary), ``tool`` / ``tool_version`` (what recorded it), ``path``, ``weight``,
  ``recovered``, ``events``, ``counters``, ``duration_us``, ``notes``, ``warnings`` (events not
  analysed, with counts), ``metadata`` (the source's
  metadata as JSON), ``strings`` (interned strings in first-seen order), ``schema_version``,
  ``exported_by``.
- ``regions`` (kind ``region``), ``ops`` (``cpu_op``, ``runtime``, ``other``), ``kernels``
  (``kernel``, ``memcpy``, ``memset``; ``pid`` = device, ``tid`` = stream) and ``compile``
  (``compile``, plus ``compile_id``, ``phase``, ``cache``, ``reason``) share the event columns:
  ``row`` (position in the source, in time order), ``kind``, ``name``, ``ts_us``, ``dur_us`` (µs;
  ``ts_us`` from the source's earliest row), ``pid``, ``tid``, ``pid_label`` / ``tid_label``
  (string lanes such as Kineto's "Spans"), ``region`` (path of the row's region: its own for
  regions, the innermost enclosing one otherwise), ``region_id``, ``parent_id``, ``flops``,
  ``bytes`` (null when unknown), ``correlation``, ``external_id`` (-1 none), ``fwdbwd`` (the
  ``fwdbwd`` flow id from a forward op to its backward op; -1 none), ``args`` (JSON).
- ``counters``: ``row``, ``name``, ``ts_us``, ``value``, ``pid``.
- ``histograms`` (aggregate summaries): ``path``, ``count``, ``sum_ns``, ``min_ns``, ``max_ns``,
  ``buckets`` (list of {bucket, count}, 8 log-linear buckets per octave of ns).

``trace_key`` is a digest of the source's host, pid, rank, start time and file name: the same
trace exported twice gets the same key (and overwrites its own files).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
from typing import Any

import numpy as np
import orjson

from cuvil_pgc.errors import ConfigError, TraceError
from cuvil_pgc.trace._args import ArgsMap
from cuvil_pgc.trace._arrow_args import args_json, dumps_json
from cuvil_pgc.trace.columns import COUNTER_COLUMNS, EVENT_COLUMNS, EXTRA_COLUMNS, Source, StringTable, Trace
from cuvil_pgc.trace.merge import first_ts
from cuvil_pgc.trace.schema import Kind

SCHEMA_VERSION = 2     # 2: events carry fwdbwd, traces carry warnings (version 1 still reads)
#: Columns added after version 1: table -> {column: the value rows of older files read as}.
ADDED_COLUMNS: dict[str, dict[str, Any]] = {
    **{name: {"fwdbwd": -1} for name in ("regions", "ops", "kernels", "compile")},
    "traces": {"warnings": []},
}
EVENT_TABLES: dict[str, tuple[Kind, ...]] = {
    "regions": (Kind.REGION,),
    "ops": (Kind.CPU_OP, Kind.RUNTIME, Kind.OTHER),
    "kernels": (Kind.KERNEL, Kind.MEMCPY, Kind.MEMSET),
    "compile": (Kind.COMPILE,),
}
TABLES = ("traces", *EVENT_TABLES, "counters", "histograms")
COMPILE_FIELDS = ("compile_id", "phase", "cache", "reason")
_KIND_NAMES = [k.name.lower() for k in Kind]
_RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_STEM = re.compile(r"^(?P<run>.*?)(?:\.rank(?P<rank>\d+))?(?:\.(?P<window>\d+))?$")
_SUFFIXES = (".partial", ".gz", ".json", ".trace", ".summary", ".pt")


def pyarrow() -> Any:
    """The pyarrow module, or a ConfigError saying how to install it."""
    try:
        import pyarrow as pa
    except ImportError:
        raise ConfigError("Parquet and SQL need pyarrow", fix="pip install 'cuvil-pgc[fleet]'") from None
    return pa


def schemas() -> dict[str, Any]:
    """The Arrow schema of every table (partition columns ``run_id`` and ``rank`` included)."""
    pa = pyarrow()
    key = [("trace_key", pa.string()), ("run_id", pa.string()), ("rank", pa.int32())]
    event = key + [("row", pa.int64()), ("kind", pa.string()), ("name", pa.string()), ("ts_us", pa.float64()),
                   ("dur_us", pa.float64()), ("pid", pa.int64()), ("tid", pa.int64()), ("pid_label", pa.string()),
                   ("tid_label", pa.string()), ("region", pa.string()), ("region_id", pa.int64()),
                   ("parent_id", pa.int64()), ("flops", pa.float64()), ("bytes", pa.float64()),
                   ("correlation", pa.int64()), ("external_id", pa.int64()), ("fwdbwd", pa.int64()),
                   ("args", pa.string())]
    bucket = pa.struct([("bucket", pa.int32()), ("count", pa.int64())])
    fields = {
        "traces": key + [("world_size", pa.int32()), ("host", pa.string()), ("pid", pa.int64()),
                         ("window", pa.int32()), ("start_time", pa.timestamp("us", tz="UTC")),
                         ("start_unix_ns", pa.int64()), ("format", pa.string()), ("tool", pa.string()),
                         ("tool_version", pa.string()), ("path", pa.string()), ("weight", pa.float64()),
                         ("recovered", pa.bool_()), ("events", pa.int64()), ("counters", pa.int64()),
                         ("duration_us", pa.float64()), ("notes", pa.list_(pa.string())),
                         ("warnings", pa.list_(pa.string())),
                         ("metadata", pa.string()), ("strings", pa.list_(pa.string())),
                         ("schema_version", pa.int32()), ("exported_by", pa.string())],
        **{name: event for name in EVENT_TABLES},
        "counters": key + [("row", pa.int64()), ("name", pa.string()), ("ts_us", pa.float64()),
                           ("value", pa.float64()), ("pid", pa.int64())],
        "histograms": key + [("path", pa.string()), ("count", pa.int64()), ("sum_ns", pa.int64()),
                             ("min_ns", pa.int64()), ("max_ns", pa.int64()), ("buckets", pa.list_(bucket))],
    }
    fields["compile"] = event + [(f, pa.string()) for f in COMPILE_FIELDS]
    meta = {b"cuvil.schema_version": str(SCHEMA_VERSION).encode()}
    return {name: pa.schema(f, metadata={**meta, b"cuvil.table": name.encode()}) for name, f in fields.items()}


def fill_added_columns(name: str, table: Any) -> Any:
    """``table`` (of table ``name``, in its full schema) with the nulls that files older than a
    column leave in it replaced by the column's :data:`ADDED_COLUMNS` default."""
    pa = pyarrow()
    import pyarrow.compute as pc

    for column, default in ADDED_COLUMNS.get(name, {}).items():
        i = table.schema.get_field_index(column)
        values = table.column(i)
        if values.null_count:
            table = table.set_column(i, table.schema.field(i),
                                     pc.coalesce(values, pa.scalar(default, type=values.type)))
    return table


def to_arrow(trace: Trace) -> dict[str, Any]:
    """The tables of ``trace`` (every source), keyed by table name (see the module docstring)."""
    parts = [source_tables(trace, i) for i in range(len(trace.sources))]
    pa = pyarrow()
    out = {}
    for name, schema in schemas().items():
        tables = [p[name] for p in parts]
        out[name] = pa.concat_tables(tables) if tables else schema.empty_table()
    return out


def source_tables(trace: Trace, i: int) -> dict[str, Any]:
    """The tables of source ``i`` of ``trace`` alone."""
    pa = pyarrow()
    sch = schemas()
    source = trace.sources[i]
    rows = np.flatnonzero(trace.events["source"] == i)
    crow = np.flatnonzero(trace.counters["source"] == i)
    base = _first_ts(trace, rows, crow)
    key_cols = _identity(source, trace)
    n_keys = {"trace_key": key_cols["trace_key"], "run_id": key_cols["run_id"], "rank": key_cols["rank"]}
    events = _event_columns(trace, rows, base)
    out: dict[str, Any] = {}
    kinds = trace.events["kind"][rows]
    for name, members in EVENT_TABLES.items():
        take = np.flatnonzero(np.isin(kinds, np.array(members, dtype=np.uint8)))
        cols = {c: v.take(take) if isinstance(v, pa.Array) else v[take] for c, v in events.items()}
        if name == "compile":
            cols.update(_compile_fields(cols["args"]))
        out[name] = _table(pa, sch[name], cols, n_keys, len(take))
    counters = {"row": np.arange(len(crow), dtype=np.int64), "name": _strings(trace, trace.counters["name"][crow]),
                "ts_us": trace.counters["ts"][crow] - base, "value": trace.counters["value"][crow],
                "pid": trace.counters["pid"][crow]}
    out["counters"] = _table(pa, sch["counters"], counters, n_keys, len(crow))
    hist = _histogram_columns(source)
    out["histograms"] = _table(pa, sch["histograms"], hist, n_keys, len(hist["path"]))
    facts = _trace_row(trace, source, key_cols, rows, crow, base)
    out["traces"] = pa.Table.from_pylist([facts], schema=sch["traces"])
    return out


def _table(pa: Any, schema: Any, cols: dict[str, Any], keys: dict[str, Any], n: int) -> Any:
    arrays = []
    for field in schema:
        if field.name in keys:
            arrays.append(pa.repeat(pa.scalar(keys[field.name], type=field.type), n))
        elif isinstance(cols[field.name], pa.Array):
            arrays.append(cols[field.name].cast(field.type))
        else:
            arrays.append(pa.array(cols[field.name], type=field.type, from_pandas=True))
    return pa.Table.from_arrays(arrays, schema=schema)


def _first_ts(trace: Trace, rows: np.ndarray, crow: np.ndarray) -> float:
    first = first_ts(trace.events["ts"][rows], trace.counters["ts"][crow])
    return 0.0 if first is None else first


def _strings(trace: Trace, idx: np.ndarray) -> Any:
    """The strings of interned ids (-1: null) as an Arrow array, taken in C from the string table."""
    pa = pyarrow()
    idx = np.asarray(idx, dtype=np.int64)
    return pa.array(trace.strings.strings, type=pa.string()).take(pa.array(idx, mask=idx < 0))


def _labels(trace: Trace, ids: np.ndarray) -> np.ndarray:
    """Names of string lanes (ids <= -2 point into the string table), None for numeric lanes."""
    return _strings(trace, np.where(ids <= -2, -2 - ids, -1))


def _event_columns(trace: Trace, rows: np.ndarray, base: float) -> dict[str, Any]:
    ev = trace.events
    ext, fwdbwd = ev.get("external_id"), ev.get("fwdbwd")
    cols: dict[str, Any] = {
        "row": np.arange(len(rows), dtype=np.int64),
        "kind": pyarrow().array(_KIND_NAMES, type=pyarrow().string()).take(ev["kind"][rows].astype(np.int64)),
        "name": _strings(trace, ev["name"][rows]), "ts_us": ev["ts"][rows] - base, "dur_us": ev["dur"][rows],
        "pid": ev["pid"][rows], "tid": ev["tid"][rows],
        "pid_label": _labels(trace, ev["pid"][rows]), "tid_label": _labels(trace, ev["tid"][rows]),
        "region": _strings(trace, ev["region"][rows]), "region_id": ev["region_id"][rows],
        "parent_id": ev["parent_id"][rows], "flops": ev["flops"][rows], "bytes": ev["bytes"][rows],
        "correlation": ev["correlation"][rows],
        "external_id": ext[rows] if ext is not None else np.full(len(rows), -1, dtype=np.int64),
        "fwdbwd": fwdbwd[rows] if fwdbwd is not None else np.full(len(rows), -1, dtype=np.int64),
    }
    cols["args"] = args_json(pyarrow(), trace, rows)
    return cols


def _compile_fields(args: Any) -> dict[str, list]:
    out: dict[str, list] = {f: [] for f in COMPILE_FIELDS}
    for text in args.to_pylist():
        doc = orjson.loads(text) if text else {}
        for f in COMPILE_FIELDS:
            v = doc.get(f) if isinstance(doc, dict) else None
            out[f].append(None if v is None else str(v))
    return out


def _histogram_columns(source: Source) -> dict[str, list]:
    rows = source.metadata.get("summary_regions", []) if source.format == "summary" else []
    cols: dict[str, list] = {c: [] for c in ("path", "count", "sum_ns", "min_ns", "max_ns", "buckets")}
    for row in rows:
        for c in ("path", "count", "sum_ns", "min_ns", "max_ns"):
            cols[c].append(row[c])
        cols["buckets"].append([{"bucket": int(b), "count": int(n)} for b, n in row["buckets"]])
    return cols


def _identity(source: Source, trace: Trace) -> dict[str, Any]:
    meta = source.metadata if isinstance(source.metadata, dict) else {}
    run_raw, window = _run_and_window(source, meta)
    run_id = _RUN_ID_UNSAFE.sub("_", run_raw).strip("._")[:100] or "run"
    start = meta.get("start_unix_ns")
    digest = hashlib.sha256(orjson.dumps([meta.get("host"), meta.get("pid"), source.rank, start,
                                          os.path.basename(source.path), source.format], default=str))
    return {"trace_key": digest.hexdigest()[:20], "run_id": run_id, "rank": int(source.rank), "window": window}


def _run_and_window(source: Source, meta: dict[str, Any]) -> tuple[str, int | None]:
    """The run a source belongs to (``run_id`` metadata, else the file name without rank, window and
    suffixes, so the ranks and windows of one run share it) and its schedule window index."""
    name = os.path.basename(source.path)
    while True:
        stem, ext = os.path.splitext(name)
        if ext not in _SUFFIXES or not stem:
            break
        name = stem
    m = _STEM.match(name)
    window = None
    if m and m["window"] is not None and source.format == "cuvil" and len(m["window"]) < 9:
        window = int(m["window"])                   # run.<N>.trace.json of a schedule
    elif m and m["window"] is not None:             # not a window (torch.profiler's .<ms>.pt.trace.json)
        m = _STEM.match(name.rpartition(".")[0]) if m["rank"] is None else m
    if type(meta.get("window")) is int and 0 <= meta["window"] < 2**31:
        window = meta["window"]
    run = meta.get("run_id")
    return (str(run) if run else (m["run"] if m and m["run"] else name)), window


def _trace_row(trace: Trace, source: Source, ids: dict[str, Any], rows: np.ndarray, crow: np.ndarray,
               base: float) -> dict[str, Any]:
    from cuvil_pgc._version import __version__

    meta = source.metadata if isinstance(source.metadata, dict) else {}
    start = _start_unix_ns(source, meta, base)
    ts, dur = trace.events["ts"][rows], trace.events["dur"][rows]
    kineto = meta.get("kineto") if isinstance(meta.get("kineto"), dict) else {}
    tool, version = ("kineto", kineto.get("schemaVersion")) if source.format == "kineto" else \
        ("cuvil-pgc", meta.get("version"))
    used = np.unique(np.concatenate([trace.events[c][rows] for c in ("name", "region")]
                                    + [trace.counters["name"][crow]]
                                    + [-2 - trace.events[c][rows][trace.events[c][rows] <= -2] for c in ("pid", "tid")]))
    return {
        **ids, "world_size": _int(meta.get("world_size"), 1), "host": _str(meta.get("host")),
        "pid": _int(meta.get("pid"), None), "start_time": None if start is None else start // 1000,
        "start_unix_ns": start,
        "format": source.format, "tool": tool, "tool_version": _str(version), "path": source.path,
        "weight": float(source.weight), "recovered": bool(source.recovered), "events": int(len(rows)),
        "counters": int(len(crow)), "duration_us": float((ts + dur).max() - ts.min()) if len(rows) else 0.0,
        "notes": [str(n) for n in source.notes], "warnings": [str(w) for w in source.warnings],
        "metadata": dumps_json({k: v for k, v in meta.items() if k != "summary_regions"}) or "{}",
        "strings": [trace.strings[int(i)] for i in used if i >= 0],
        "schema_version": SCHEMA_VERSION, "exported_by": f"cuvil-pgc {__version__}",
    }


def _start_unix_ns(source: Source, meta: dict[str, Any], base: float) -> int | None:
    """Unix ns of the source's ``ts_us = 0`` (its earliest row), when the file anchors its clock."""
    start, offset = meta.get("start_unix_ns"), meta.get("ts_offset_us", 0.0)
    if type(start) is not int or not isinstance(offset, (int, float)):
        return None
    if source.format == "kineto":           # the reader stores the earliest event's wall time
        return start
    if source.format == "summary":
        return start
    return start + round((base - offset) * 1000.0)


def _int(value: Any, default: int | None) -> int | None:
    return value if type(value) is int and -(2**63) <= value < 2**63 else default


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


# ---------------------------------------------------------------- Arrow -> Trace


def from_arrow(tables: dict[str, Any]) -> Trace:
    """A Trace from tables shaped as :func:`to_arrow` returns (one source per ``traces`` row).

    Sources are aligned on ``start_unix_ns`` when every one has it (else each starts at 0)."""
    pa = pyarrow()
    traces = tables.get("traces")
    if traces is None or traces.num_rows == 0:
        raise TraceError("the tables hold no traces", fix="export traces first: cuvil-pgc export TRACE --parquet DIR")
    check_version(traces)
    facts = traces.to_pylist()
    index = {f["trace_key"]: i for i, f in enumerate(facts)}
    if len(index) != len(facts):
        raise TraceError("the traces table lists a trace_key twice", fix="export each trace into one directory once")
    strings = StringTable()
    for f in facts:
        for s in f["strings"] or []:
            strings.intern(s)
    starts = [f["start_unix_ns"] for f in facts]
    zero = min(starts) if all(s is not None for s in starts) else None
    offsets = [0.0 if zero is None else (s - zero) / 1000.0 for s in starts]
    empty = schemas()
    ev_tables = [tables.get(n, empty[n].empty_table()).select(list(empty["regions"].names)) for n in EVENT_TABLES]
    events, args = _rebuild_events(pa.concat_tables(ev_tables), index, offsets, strings)
    counters = _rebuild_counters(tables.get("counters", empty["counters"].empty_table()), index, offsets, strings)
    hist = tables.get("histograms", empty["histograms"].empty_table()).to_pylist()
    sources = [_rebuild_source(f, [h for h in hist if h["trace_key"] == f["trace_key"]]) for f in facts]
    return Trace(strings=strings, events=events, counters=counters, args=args, sources=sources)


def check_version(traces: Any, path: str | None = None) -> None:
    versions = {v for v in traces.column("schema_version").to_pylist() if v is not None}
    if any(v > SCHEMA_VERSION for v in versions):
        raise TraceError(f"uses Parquet schema version {max(versions)}; this cuvil-pgc reads up to {SCHEMA_VERSION}",
                         path=path, fix="upgrade cuvil-pgc")


def _source_index(table: Any, index: dict[str, int]) -> np.ndarray:
    keys = table.column("trace_key").to_pylist()
    try:
        return np.array([index[k] for k in keys], dtype=np.int64)
    except KeyError as exc:
        raise TraceError(f"rows of trace {exc.args[0]} have no row in the traces table",
                         fix="export the trace again or remove its files") from None


def _interned(values: list, strings: StringTable) -> np.ndarray:
    return np.array([-1 if v is None else strings.intern(v) for v in values], dtype=np.int64)


def _lane(ids: np.ndarray, labels: list, strings: StringTable) -> np.ndarray:
    out = ids.astype(np.int64).copy()
    for k, label in enumerate(labels):
        if label is not None:
            out[k] = -2 - strings.intern(label)
    return out


def _rebuild_events(table: Any, index: dict[str, int], offsets: list[float],
                    strings: StringTable) -> tuple[dict[str, np.ndarray], ArgsMap]:
    src = _source_index(table, index)
    col = {n: table.column(n) for n in table.column_names}
    ts = col["ts_us"].to_numpy() + np.asarray(offsets, dtype=np.float64)[src] if len(src) else np.zeros(0)
    dur = col["dur_us"].to_numpy()
    order = np.lexsort((col["row"].to_numpy(), src, -dur, ts))
    kinds = {name: k for k, name in enumerate(_KIND_NAMES)}
    raw = {
        "kind": np.array([kinds[k] for k in col["kind"].to_pylist()], dtype=np.int64),
        "name": _interned(col["name"].to_pylist(), strings), "ts": ts, "dur": dur,
        "pid": _lane(col["pid"].to_numpy(), col["pid_label"].to_pylist(), strings),
        "tid": _lane(col["tid"].to_numpy(), col["tid_label"].to_pylist(), strings),
        "region": _interned(col["region"].to_pylist(), strings),
        "region_id": col["region_id"].to_numpy(), "parent_id": col["parent_id"].to_numpy(),
        "flops": col["flops"].to_numpy(zero_copy_only=False), "bytes": col["bytes"].to_numpy(zero_copy_only=False),
        "correlation": col["correlation"].to_numpy(), "source": src,
        "external_id": col["external_id"].to_numpy(),
        "fwdbwd": col["fwdbwd"].to_numpy() if "fwdbwd" in col else np.full(len(src), -1, dtype=np.int64),
    }
    dtypes = {**EVENT_COLUMNS, **EXTRA_COLUMNS}
    events = {c: np.asarray(v)[order].astype(dtypes[c]) for c, v in raw.items()}
    texts = col["args"].to_pylist()
    args = ArgsMap({new: orjson.loads(texts[old]) for new, old in enumerate(order.tolist())
                    if texts[old] is not None})
    return events, args


def _rebuild_counters(table: Any, index: dict[str, int], offsets: list[float],
                      strings: StringTable) -> dict[str, np.ndarray]:
    src = _source_index(table, index)
    ts = table.column("ts_us").to_numpy() + np.asarray(offsets, dtype=np.float64)[src] if len(src) else np.zeros(0)
    order = np.lexsort((table.column("row").to_numpy(), src, ts))
    raw = {"name": _interned(table.column("name").to_pylist(), strings), "ts": ts,
           "value": table.column("value").to_numpy(zero_copy_only=False),
           "pid": table.column("pid").to_numpy(), "source": src}
    return {c: np.asarray(v)[order].astype(COUNTER_COLUMNS[c]) for c, v in raw.items()}


def _rebuild_source(facts: dict[str, Any], hist: list[dict[str, Any]]) -> Source:
    meta = orjson.loads(facts["metadata"]) if facts["metadata"] else {}
    if facts["format"] == "summary":
        meta["summary_regions"] = [{"path": h["path"], "count": h["count"], "sum_ns": h["sum_ns"],
                                    "min_ns": h["min_ns"], "max_ns": h["max_ns"],
                                    "buckets": [[b["bucket"], b["count"]] for b in h["buckets"]]} for h in hist]
    weight = facts["weight"]
    return Source(path=facts["path"], format=facts["format"], metadata=meta, rank=int(facts["rank"] or 0),
                  weight=weight if weight is not None and math.isfinite(weight) and weight > 0 else 1.0,
                  recovered=bool(facts["recovered"]), notes=list(facts["notes"] or []),
                  warnings=list(facts.get("warnings") or []))
