"""A fake ``cupti.cupti`` module: activity records made on demand, delivered like CUPTI does.

The CUPTI clock is ``time.perf_counter_ns() + OFFSET_NS``, so tests know exactly where a record
must land on the trace clock. Thread ids follow ``set_thread_id_type``: Linux tids with SYSTEM,
pthread ids (``threading.get_ident()``) otherwise, as real CUPTI on Linux.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import threading
import time
from types import SimpleNamespace
from typing import Any

from cupti import cupti as real

OFFSET_NS = 1_700_000_000_000_000_000 - 123_456_789   # CUPTI ns = perf_counter ns + this


class FakeCupti:
    """Stands in for ``cupti.cupti``; public non-``sim_`` callables mirror the real functions."""

    ActivityKind = real.ActivityKind
    ActivityFlag = real.ActivityFlag
    ActivityThreadIdType = real.ActivityThreadIdType
    ActivityMemcpyKind = real.ActivityMemcpyKind
    ActivityMemoryKind = real.ActivityMemoryKind
    Result = real.Result
    cuptiError = real.cuptiError
    runtime_api_trace_cbid = real.runtime_api_trace_cbid
    driver_api_trace_cbid = real.driver_api_trace_cbid

    def __init__(self, *, taken: bool = False, no_driver: bool = False) -> None:
        self.taken = taken
        self.no_driver = no_driver
        self.enabled: set[int] = set()
        self.subscribers: dict[int, Any] = {}
        self.thread_id_type = int(real.ActivityThreadIdType.DEFAULT)
        self.requested = None
        self.completed = None
        self.open_buffer: list[Any] = []
        self.closed_buffers: list[list[Any]] = []
        self.dropped_pending = 0
        self.flushes: list[int] = []
        self._ids = itertools.count(1)

    # -- the real API (names and signatures of cupti.cupti) -------------------------------------
    def get_timestamp(self) -> int:
        if self.no_driver:
            raise RuntimeError("CUDA driver is not found (libcuda.so.1: cannot open shared object file)")
        return time.perf_counter_ns() + OFFSET_NS

    def subscribe(self, callback, userdata) -> int:
        if self.taken or self.subscribers:
            raise real.cuptiError(real.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
        handle = next(self._ids)
        self.subscribers[handle] = callback
        return handle

    def unsubscribe(self, subscriber) -> None:
        if self.subscribers.pop(subscriber, None) is None:
            raise real.cuptiError(real.Result.ERROR_INVALID_PARAMETER)

    def set_thread_id_type(self, type) -> None:  # noqa: A002 - the real parameter name
        self.thread_id_type = int(type)

    def activity_register_callbacks(self, func_buffer_requested, func_buffer_completed) -> None:
        self.requested, self.completed = func_buffer_requested, func_buffer_completed

    def activity_enable(self, kind) -> None:
        self.enabled.add(int(kind))

    def activity_disable(self, kind) -> None:
        self.enabled.discard(int(kind))

    def activity_flush_all(self, flag) -> None:
        """0: every buffer whose records are all complete; FLUSH_FORCED: all, in-flight ones cut."""
        self.flushes.append(int(flag))
        forced = bool(int(flag) & int(real.ActivityFlag.FLUSH_FORCED))
        if forced:
            for rec in self.open_buffer:
                if getattr(rec, "in_flight", False):
                    rec.end = 0
        if forced or not any(getattr(rec, "in_flight", False) for rec in self.open_buffer):
            self.sim_close_buffer()
        buffers, self.closed_buffers = self.closed_buffers, []
        for records in buffers:
            for rec in records:
                rec.__dict__.pop("in_flight", None)
            size, _max_records = self.requested()
            assert size > 0
            self.completed(records)

    def activity_get_num_dropped_records(self, context, stream_id, dropped) -> None:
        ctypes.c_size_t.from_address(dropped).value = self.dropped_pending
        self.dropped_pending = 0

    # -- test controls ---------------------------------------------------------------------------
    def sim_close_buffer(self, dropped: int = 0) -> None:
        """The open buffer is full: it waits for the next flush; ``dropped`` records did not fit."""
        if self.open_buffer:
            self.closed_buffers.append(self.open_buffer)
            self.open_buffer = []
        self.dropped_pending += dropped

    def sim_launch(self, name: str, *, stream: int = 7, device: int = 0, grid=(4, 2, 1), block=(128, 1, 1),
                   registers: int = 32, static_smem: int = 1024, dynamic_smem: int = 512, queue_ns: int = 3_000,
                   dur_ns: int = 20_000, driver: bool = False, kernel_first: bool = False,
                   in_flight: bool = False) -> SimpleNamespace:
        """A kernel launched now from this thread: one runtime (or driver) record and one kernel record.

        ``in_flight``: the kernel has not finished; its buffer is held back until ``sim_finish``.
        """
        corr = next(self._ids)
        now = time.perf_counter_ns() + OFFSET_NS
        api = self._api_record(corr, now, "cuLaunchKernel" if driver else "cudaLaunchKernel_v7000", driver)
        kernel = SimpleNamespace(
            kind=int(real.ActivityKind.CONCURRENT_KERNEL), start=now + queue_ns, end=now + queue_ns + dur_ns,
            correlation_id=corr, device_id=device, stream_id=stream, context_id=1,
            grid_x=grid[0], grid_y=grid[1], grid_z=grid[2], block_x=block[0], block_y=block[1], block_z=block[2],
            registers_per_thread=registers, static_shared_memory=static_smem,
            dynamic_shared_memory=dynamic_smem, name=name)
        for record in ((kernel, api) if kernel_first else (api, kernel)):
            self._record(record)
        if in_flight:
            kernel.in_flight = True     # a test-only marker, removed before delivery
        return kernel

    def sim_finish(self) -> None:
        """Every in-flight kernel completes."""
        for rec in self.open_buffer:
            rec.__dict__.pop("in_flight", None)

    def sim_memcpy(self, nbytes: int, *, copy_kind: str = "HTOD", stream: int = 7, device: int = 0) -> SimpleNamespace:
        corr = next(self._ids)
        now = time.perf_counter_ns() + OFFSET_NS
        self._record(self._api_record(corr, now, "cudaMemcpyAsync_v3020", False))
        rec = SimpleNamespace(kind=int(real.ActivityKind.MEMCPY), start=now + 2_000, end=now + 9_000,
                              correlation_id=corr, device_id=device, stream_id=stream, context_id=1, bytes=nbytes,
                              copy_kind=int(getattr(real.ActivityMemcpyKind, copy_kind)),
                              src_kind=int(real.ActivityMemoryKind.PAGEABLE),
                              dst_kind=int(real.ActivityMemoryKind.DEVICE))
        self._record(rec)
        return rec

    def sim_memset(self, nbytes: int, *, stream: int = 7, device: int = 0) -> SimpleNamespace:
        corr = next(self._ids)
        now = time.perf_counter_ns() + OFFSET_NS
        self._record(self._api_record(corr, now, "cudaMemsetAsync_v3020", False))
        rec = SimpleNamespace(kind=int(real.ActivityKind.MEMSET), start=now + 1_000, end=now + 4_000,
                              correlation_id=corr, device_id=device, stream_id=stream, context_id=1, bytes=nbytes,
                              value=0, memory_kind=int(real.ActivityMemoryKind.DEVICE))
        self._record(rec)
        return rec

    def sim_api_call(self, cbid_name: str = "cudaGetDevice_v3020") -> SimpleNamespace:
        """A runtime call that launches nothing."""
        rec = self._api_record(next(self._ids), time.perf_counter_ns() + OFFSET_NS, cbid_name, False)
        self._record(rec)
        return rec

    def _api_record(self, corr: int, now: int, cbid_name: str, driver: bool) -> SimpleNamespace:
        system = self.thread_id_type == int(real.ActivityThreadIdType.SYSTEM)
        enum = real.driver_api_trace_cbid if driver else real.runtime_api_trace_cbid
        return SimpleNamespace(kind=int(real.ActivityKind.DRIVER if driver else real.ActivityKind.RUNTIME),
                               start=now, end=now + 1_500, correlation_id=corr, cbid=int(getattr(enum, cbid_name)),
                               thread_id=threading.get_native_id() if system else threading.get_ident(),
                               process_id=os.getpid(), return_value=0)

    def _record(self, record: SimpleNamespace) -> None:
        if record.kind in self.enabled:
            self.open_buffer.append(record)


# The record fields each fake record kind uses, and the real class that carries them (checked in tests).
RECORD_CLASSES = {
    "kernel": ("ActivityKernel9", "sim_launch"),
    "api": ("ActivityAPI", "sim_api_call"),
    "memcpy": ("ActivityMemcpy6", "sim_memcpy"),
    "memset": ("ActivityMemset4", "sim_memset"),
}
