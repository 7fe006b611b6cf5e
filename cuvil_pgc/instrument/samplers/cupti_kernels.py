"""GPU kernels, launches and memory operations through the CUPTI activity API (cupti-python).

Contract:
- Activity kinds: CONCURRENT_KERNEL, RUNTIME, MEMCPY, MEMSET, and DRIVER (only the launch calls are
  kept: Triton, cuBLAS and cuDNN launch some kernels through the driver API, not the runtime).
- CUPTI hands buffers to ``buffer_completed`` on its own thread. That callback copies each record
  into a plain tuple, asks CUPTI how many records it dropped (``activity_get_num_dropped_records``,
  reported as ``cuvil.dropped["cupti"]`` and always as ``status["dropped_records"]``) and returns;
  all other work happens in ``flush``. Each session flush calls ``activity_flush_all(0)``, which
  returns every buffer whose records are all complete, full or not; the forced flush (which would
  cut records still in flight) runs once, at stop, after ``torch.cuda.synchronize()``. Records
  CUPTI could not complete are counted under ``dropped["cupti_incomplete"]``.
- Clock: one paired reading (``get_timestamp()`` bracketed by ``time.perf_counter_ns()``) at start
  maps CUPTI timestamps onto the session's monotonic clock, hence onto trace microseconds. A second
  pairing at stop is recorded as ``clock_drift_us`` in the sampler status.
- Attribution: kernel / memcpy / memset → runtime (or driver) call with the same correlation id →
  (native thread id, CPU time) → innermost ProfileRegion via ``ctx.region_index()``. Runtime thread
  ids are Linux tids (``set_thread_id_type(SYSTEM)``), the ids regions are recorded with.
  A region is known only once it has ended, and inner regions end before outer ones, so a record
  whose region is not found yet is held back (at most ``HOLD_RECORDS``) until a later flush or stop;
  beyond that the oldest are written with ``region_id: null`` and counted in ``status["held_overflow"]``
  (every event keeps its correlation id, so ``trace.reader`` still attributes them through their
  launch when the file is loaded).
- When another tool already holds CUPTI (torch.profiler with CUDA activities, Nsight Systems,
  compute-sanitizer: ``CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED``) the sampler warns once and
  records itself unavailable with that reason; the session continues (NVML still samples).
- Nothing here raises into the user's program.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import logging
import re
import sys
import time
from typing import Any

from cuvil_pgc.instrument.samplers.base import GPU_EXTRA_FIX, Probe, Sampler, SamplerContext
from cuvil_pgc.trace import schema

log = logging.getLogger("cuvil_pgc")

BUFFER_BYTES = 8 << 20          # CUPTI recommends 1-10 MB activity buffers
HOLD_RECORDS = 1 << 17          # records held back waiting for their region to end
LAUNCH_MAP_MAX = 1 << 19        # correlation ids remembered for GPU records still to come
MULTIPLE_SUBSCRIBERS = "ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"
INSUFFICIENT_PRIVILEGES = "ERROR_INSUFFICIENT_PRIVILEGES"

_DRIVER_LAUNCHES = ("cuLaunchKernel", "cuLaunchKernel_ptsz", "cuLaunchKernelEx", "cuLaunchKernelEx_ptsz",
                    "cuLaunchCooperativeKernel", "cuLaunchCooperativeKernel_ptsz",
                    "cuGraphLaunch", "cuGraphLaunch_ptsz")
_LAUNCH_WORDS = ("Launch", "Memcpy", "Memset")
_VERSION_SUFFIX = re.compile(r"_v\d+$")

# Raw record tags (first field of the tuples copied in the CUPTI callback).
_KERNEL, _RUNTIME, _DRIVER, _MEMCPY, _MEMSET = range(5)

_active: CuptiKernelSampler | None = None
_registered_with: Any = None
_warned: set[str] = set()


def _import_cupti() -> Any:
    """The CUPTI bindings (``cupti.cupti``); the import seam tests replace with a fake."""
    from cupti import cupti

    return cupti


def cupti_status_name(exc: BaseException) -> str | None:
    """The ``Result`` name of a ``cuptiError`` (e.g. ``ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED``)."""
    status = getattr(exc, "status", None)
    if status is not None:
        try:
            return _import_cupti().Result(int(status)).name
        except Exception:
            pass
    text = str(exc)
    return text.split(" ", 1)[0] if text.startswith("ERROR_") else None


def _buffer_requested() -> tuple[int, int]:
    return BUFFER_BYTES, 0


def _buffer_completed(activities: list) -> None:
    sampler = _active
    if sampler is not None:
        sampler._take(activities)


def _no_callbacks(*_args: Any) -> None:
    """Subscriber callback: no callback domain is enabled, the subscription only claims CUPTI."""


class CuptiKernelSampler(Sampler):
    """Kernels, runtime launches and memcpy/memset from CUPTI, attributed to regions."""

    name = "cupti"
    needs_regions = True

    def __init__(self) -> None:
        super().__init__()
        self.devices: list[dict[str, Any]] = []
        self._ctx: SamplerContext | None = None
        self._cupti: Any = None
        self._subscriber: int | None = None
        self._enabled: list[int] = []
        self._raw: collections.deque[tuple] = collections.deque()
        self._dropped_box = ctypes.c_size_t(0)
        self._dropped = 0
        self._reported_dropped = 0
        self._callback_errors = 0
        self._dropped_error: str | None = None
        self._base_ns = 0          # CUPTI ns minus this = trace ns
        self._launches: dict[int, tuple[int, float]] = {}
        self._held_api: list[tuple] = []
        self._held_gpu: list[tuple] = []
        self._streams: set[tuple[int, int]] = set()
        self._names: dict[tuple[int, int], str] = {}
        self._is_launch: dict[tuple[int, int], bool] = {}
        self._tags: dict[int, int] = {}
        self._driver_launch: frozenset[int] = frozenset()
        self._counts = {"kernels": 0, "runtime_calls": 0, "memcpys": 0, "memsets": 0, "unattributed": 0}

    # -- availability and lifecycle -----------------------------------------------------------
    def unavailable(self) -> str | None:
        try:
            cupti = _import_cupti()
        except ImportError as exc:
            return f"cupti-python is not importable ({exc}); install it with `pip install 'cuvil-pgc[gpu]'`"
        try:
            cupti.get_timestamp()
        except Exception as exc:
            return f"CUPTI cannot run here: {type(exc).__name__}: {exc}"
        return None

    def probe(self) -> Probe:
        """cupti-python importable, libcupti and the driver loadable, and CUPTI not held by another
        tool (subscribes and lets go at once); in use by this process's own session counts as ok."""
        try:
            cupti = _import_cupti()
        except ImportError as exc:
            return Probe(False, reason=f"cupti-python is not importable ({exc})", fix=GPU_EXTRA_FIX)
        try:
            cupti.get_timestamp()
        except Exception as exc:
            return Probe(False, reason=f"libcupti cannot run: {exc}",
                         fix="install the NVIDIA driver and run on a GPU machine")
        if _active is not None:
            return Probe(True, "in use by this process's cuvil-pgc session")
        try:
            handle = cupti.subscribe(_no_callbacks, None)
        except Exception as exc:
            status = cupti_status_name(exc)
            if status in (MULTIPLE_SUBSCRIBERS, INSUFFICIENT_PRIVILEGES):
                reason, _, fix = _reason_for(status).partition("; ")
                return Probe(False, reason=reason, fix=fix)
            return Probe(False, reason=f"cuptiSubscribe failed: {exc}", fix="see the CUPTI documentation")
        cupti.unsubscribe(handle)
        return Probe(True, "activity API ready (kernels, runtime, memcpy, memset)")

    def start(self, ctx: SamplerContext) -> None:
        global _active
        self._ctx = ctx
        cupti = self._cupti = _import_cupti()
        if not self._claim(cupti):
            return
        try:
            self._set_system_thread_ids(cupti)
            self._base_ns = _pair_offset(cupti) + ctx.clock.start_mono_ns
            self._learn_kinds(cupti)
            self._register(cupti)
            _active = self
            for kind in self._tags:
                cupti.activity_enable(kind)
                self._enabled.append(kind)
        except Exception as exc:
            self._release()
            name = cupti_status_name(exc)
            if name in (MULTIPLE_SUBSCRIBERS, INSUFFICIENT_PRIVILEGES):
                self._mark_unavailable(_reason_for(name))
                return
            raise

    def flush(self) -> None:
        self._flush_cupti(forced=False)
        self._process(final=False)

    def stop(self) -> None:
        _synchronize_torch()
        self._flush_cupti(forced=True)
        drift_ns = None
        try:
            drift_ns = _pair_offset(self._cupti) + self._ctx.clock.start_mono_ns - self._base_ns
        except Exception:
            pass
        self._release()
        self._process(final=True)
        self._ctx.emit(self._metadata_events())
        self.status.update(self._counts, callback_errors=self._callback_errors,
                           clock_drift_us=None if drift_ns is None else round(drift_ns / 1000.0, 3),
                           dropped_records=None if self._dropped_error else self._dropped)
        if self._dropped_error:
            self.status["dropped_query_error"] = self._dropped_error

    def _flush_cupti(self, forced: bool) -> None:
        cupti = self._cupti
        try:
            cupti.activity_flush_all(int(cupti.ActivityFlag.FLUSH_FORCED) if forced else 0)
        except Exception as exc:
            self._log_once("flush", f"cuvil-pgc: CUPTI flush failed ({type(exc).__name__}: {exc})")

    # -- claiming and releasing CUPTI ---------------------------------------------------------
    def _claim(self, cupti: Any) -> bool:
        try:
            self._subscriber = cupti.subscribe(_no_callbacks, None)
        except cupti.cuptiError as exc:
            name = cupti_status_name(exc)
            if name in (MULTIPLE_SUBSCRIBERS, INSUFFICIENT_PRIVILEGES):
                self._mark_unavailable(_reason_for(name))
                return False
            raise
        return True

    def _set_system_thread_ids(self, cupti: Any) -> None:
        try:
            cupti.set_thread_id_type(int(cupti.ActivityThreadIdType.SYSTEM))
        except cupti.cuptiError as exc:
            self.status["note"] = (f"set_thread_id_type(SYSTEM) failed ({exc}): runtime calls carry "
                                   "pthread ids and cannot be matched to regions")

    def _register(self, cupti: Any) -> None:
        # cupti-python keeps one pair of buffer callbacks per process; ours dispatch to `_active`.
        global _registered_with
        if _registered_with is not cupti:
            cupti.activity_register_callbacks(_buffer_requested, _buffer_completed)
            _registered_with = cupti

    def _learn_kinds(self, cupti: Any) -> None:
        kinds = cupti.ActivityKind
        # Enable order: launches before the GPU records that refer to them.
        self._tags = {int(kinds.RUNTIME): _RUNTIME, int(kinds.DRIVER): _DRIVER,
                      int(kinds.CONCURRENT_KERNEL): _KERNEL, int(kinds.MEMCPY): _MEMCPY,
                      int(kinds.MEMSET): _MEMSET}
        cbids = cupti.driver_api_trace_cbid
        self._driver_launch = frozenset(int(getattr(cbids, n)) for n in _DRIVER_LAUNCHES if hasattr(cbids, n))

    def _release(self) -> None:
        global _active
        cupti = self._cupti
        for kind in self._enabled:
            _quietly(cupti.activity_disable, kind)
        self._enabled.clear()
        if self._subscriber is not None:
            _quietly(cupti.unsubscribe, self._subscriber)
            self._subscriber = None
        if _active is self:
            _active = None

    def _mark_unavailable(self, reason: str) -> None:
        if reason not in _warned:
            _warned.add(reason)
            log.warning("cuvil-pgc: GPU kernel capture is off: %s", reason)
        self.status.clear()
        self.status.update(status=schema.STATUS_UNAVAILABLE, reason=reason)

    # -- CUPTI's thread: copy and return ------------------------------------------------------
    def _take(self, activities: list) -> None:
        try:
            append, tags, launches = self._raw.append, self._tags, self._driver_launch
            for a in activities:
                tag = tags.get(a.kind)
                if tag == _KERNEL:
                    append((_KERNEL, a.start, a.end, a.correlation_id, a.device_id, a.stream_id,
                            a.grid_x, a.grid_y, a.grid_z, a.block_x, a.block_y, a.block_z,
                            a.registers_per_thread, a.static_shared_memory + a.dynamic_shared_memory, a.name))
                elif tag == _RUNTIME or (tag == _DRIVER and a.cbid in launches):
                    append((tag, a.start, a.end, a.correlation_id, a.thread_id, a.cbid))
                elif tag == _MEMCPY:
                    append((_MEMCPY, a.start, a.end, a.correlation_id, a.device_id, a.stream_id, a.bytes, a.copy_kind))
                elif tag == _MEMSET:
                    append((_MEMSET, a.start, a.end, a.correlation_id, a.device_id, a.stream_id, a.bytes,
                            a.memory_kind))
        except Exception:
            self._callback_errors += 1
        try:
            self._dropped += self._dropped_since_last()
        except Exception as exc:
            self._dropped_error = f"{type(exc).__name__}: {exc}"

    def _dropped_since_last(self) -> int:
        box = self._dropped_box
        box.value = 0
        ret = self._cupti.activity_get_num_dropped_records(0, 0, ctypes.addressof(box))
        return int(ret) if isinstance(ret, int) else int(box.value)

    # -- writer thread: convert, attribute, emit -----------------------------------------------
    def _process(self, final: bool) -> None:
        self._split_raw()
        if self._held_api or self._held_gpu:
            self._attribute(final)
        new = self._dropped - self._reported_dropped
        if new:
            self._ctx.count_dropped("cupti", new)
            self._reported_dropped += new

    def _split_raw(self) -> None:
        raw, base = self._raw, self._base_ns
        launches, held_api, held_gpu = self._launches, self._held_api, self._held_gpu
        is_launch = self._is_launch
        while raw:
            rec = raw.popleft()
            if rec[0] in (_RUNTIME, _DRIVER):
                ts = (rec[1] - base) / 1000.0
                held_api.append((rec, ts))
                launching = is_launch.get((rec[0], rec[5]))
                if launching is None:
                    name = self._api_name(rec[0], rec[5])
                    launching = is_launch[rec[0], rec[5]] = any(w in name for w in _LAUNCH_WORDS)
                if launching:
                    launches[rec[3]] = (rec[4], ts)
            elif rec[2] == 0 or rec[2] < rec[1]:   # not timed, or cut by the final forced flush
                self._ctx.count_dropped("cupti_incomplete", 1)
            else:
                held_gpu.append(rec)
        if len(launches) > LAUNCH_MAP_MAX:
            for corr in list(launches)[: len(launches) // 2]:
                del launches[corr]

    def _attribute(self, final: bool) -> None:
        index, ids = self._ctx.region_index()
        self._held_api = self._emit_found(self._held_api, self._api_points, self._api_event, index, ids, final)
        self._held_gpu = self._emit_found(self._held_gpu, self._gpu_points, self._gpu_event, index, ids, final)

    def _emit_found(self, held: list, points, make, index, ids, final: bool) -> list:
        """Emit the held records whose region is known (all of them when final); keep the rest."""
        tids, times = points(held)
        found = index.innermost(tids, times).tolist() if len(index) else [-1] * len(held)
        overflow = len(held) - HOLD_RECORDS     # the oldest beyond the cap are written now
        events, kept = [], []
        for i, (rec, where) in enumerate(zip(held, found, strict=True)):
            if where >= 0 or final or i < overflow:
                if where < 0 and not final:
                    self.status["held_overflow"] = self.status.get("held_overflow", 0) + 1
                events.append(make(rec, ids[where] if where >= 0 else None))
            else:
                kept.append(rec)
        if events:
            self._ctx.emit(events)
        return kept

    def _api_points(self, held: list) -> tuple[list[int], list[float]]:
        return [r[0][4] for r in held], [r[1] for r in held]

    def _gpu_points(self, held: list) -> tuple[list[int], list[float]]:
        missing = (-1, -1.0)    # launch not seen (yet): no thread matches -1
        launches = [self._launches.get(rec[3], missing) for rec in held]
        return [t for t, _ in launches], [ts for _, ts in launches]

    # -- event builders ------------------------------------------------------------------------
    def _api_event(self, held: tuple, region: int | None) -> dict[str, Any]:
        rec, ts = held
        self._counts["runtime_calls"] += 1
        cat = schema.CAT_RUNTIME if rec[0] == _RUNTIME else "cuda_driver"
        return {"ph": "X", "cat": cat, "name": self._api_name(rec[0], rec[5]), "pid": self._ctx.pid,
                "tid": rec[4], "ts": ts, "dur": (rec[2] - rec[1]) / 1000.0,
                "args": {"correlation": rec[3], "region_id": region}}

    def _gpu_event(self, rec: tuple, region: int | None) -> dict[str, Any]:
        if region is None:
            self._counts["unattributed"] += 1
        self._streams.add((rec[4], rec[5]))
        return self._kernel_event(rec, region) if rec[0] == _KERNEL else self._copy_event(rec, region)

    def _kernel_event(self, rec: tuple, region: int | None) -> dict[str, Any]:
        _, start, end, corr, device, stream, gx, gy, gz, bx, by, bz, registers, shared, name = rec
        self._counts["kernels"] += 1
        return {"ph": "X", "cat": schema.CAT_KERNEL, "name": _demangle(name or "?"), "pid": device, "tid": stream,
                "ts": (start - self._base_ns) / 1000.0, "dur": (end - start) / 1000.0,
                "args": {"region_id": region, "correlation": corr, "grid": [gx, gy, gz], "block": [bx, by, bz],
                         "registers": registers, "shared_memory": shared, "device": device, "stream": stream}}

    def _copy_event(self, rec: tuple, region: int | None) -> dict[str, Any]:
        tag, start, end, corr, device, stream, nbytes, kind_value = rec
        if tag == _MEMCPY:
            self._counts["memcpys"] += 1
            kind = self._enum_name("ActivityMemcpyKind", kind_value)
            cat, name = schema.CAT_MEMCPY, f"Memcpy {kind}"
        else:
            self._counts["memsets"] += 1
            kind = self._enum_name("ActivityMemoryKind", kind_value)
            cat, name = schema.CAT_MEMSET, f"Memset ({kind})"
        return {"ph": "X", "cat": cat, "name": name, "pid": device, "tid": stream,
                "ts": (start - self._base_ns) / 1000.0, "dur": (end - start) / 1000.0,
                "args": {"region_id": region, "correlation": corr, "bytes": nbytes, "kind": kind,
                         "device": device, "stream": stream}}

    def _metadata_events(self) -> list[dict[str, Any]]:
        events = []
        for device in sorted({d for d, _ in self._streams}):
            events.append({"ph": "M", "name": "process_name", "pid": device, "tid": 0,
                           "args": {"name": f"GPU {device}"}})
        for device, stream in sorted(self._streams):
            events.append({"ph": "M", "name": "thread_name", "pid": device, "tid": stream,
                           "args": {"name": f"stream {stream}"}})
        return events

    def _api_name(self, tag: int, cbid: int) -> str:
        key = (tag, cbid)
        name = self._names.get(key)
        if name is None:
            enum = self._cupti.runtime_api_trace_cbid if tag == _RUNTIME else self._cupti.driver_api_trace_cbid
            try:
                name = _VERSION_SUFFIX.sub("", enum(cbid).name)
            except ValueError:
                name = f"cbid_{cbid}"
            self._names[key] = name
        return name

    def _enum_name(self, enum_name: str, value: int) -> str:
        try:
            return getattr(self._cupti, enum_name)(value).name
        except (ValueError, AttributeError):
            return str(value)

    def _log_once(self, key: str, message: str) -> None:
        if key not in _warned:
            _warned.add(key)
            log.warning(message)


def _reason_for(status_name: str) -> str:
    if status_name == MULTIPLE_SUBSCRIBERS:
        return ("CUPTI is already in use by another tool (CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED: "
                "torch.profiler with CUDA activities, Nsight Systems or compute-sanitizer); "
                "run without it to capture kernels, NVML utilization is still sampled")
    return ("CUPTI_ERROR_INSUFFICIENT_PRIVILEGES: GPU tracing needs admin rights here; run as root or "
            "set the nvidia module parameter NVreg_RestrictProfilingToAdminUsers=0")


def _pair_offset(cupti: Any, tries: int = 5) -> int:
    """CUPTI timestamp minus perf_counter_ns at the same instant, from the tightest of a few brackets."""
    best = None
    for _ in range(tries):
        before = time.perf_counter_ns()
        stamp = cupti.get_timestamp()
        after = time.perf_counter_ns()
        if best is None or after - before < best[0]:
            best = (after - before, stamp - (before + after) // 2)
    return best[1]


def _synchronize_torch() -> None:
    """Let launched work finish so its records are complete (only if the program uses CUDA already)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.synchronize()
    except Exception:
        pass


def _quietly(fn, *args: Any) -> None:
    try:
        fn(*args)
    except Exception:
        pass


@functools.lru_cache(maxsize=1)
def _cxa_demangle():
    try:
        fn = ctypes.CDLL("libstdc++.so.6").__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_void_p
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    return fn


@functools.lru_cache(maxsize=1 << 14)
def _demangle(name: str) -> str:
    """Readable C++ kernel names (``_Z...`` → ``void at::native::...``); other names pass through."""
    fn = _cxa_demangle()
    if fn is None or not name.startswith("_Z"):
        return name
    status = ctypes.c_int(0)
    ptr = fn(name.encode(), None, None, ctypes.byref(status))
    if not ptr or status.value != 0:
        return name
    try:
        return ctypes.string_at(ptr).decode("utf-8", "replace")
    finally:
        ctypes.CDLL(None).free(ctypes.c_void_p(ptr))
