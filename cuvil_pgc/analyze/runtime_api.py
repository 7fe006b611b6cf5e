"""What a CUDA runtime / driver call, an op or a kernel is, by its name.

Runtime time is not all launch overhead: :func:`runtime_category` splits CUDA (and HIP) runtime
and driver calls by API into
- ``launch``: kernel launches and graph launches (``cudaLaunchKernel``, ``cuLaunchKernel``,
  ``cudaLaunchKernelExC``, ``cudaGraphLaunch``, ...), and the asynchronous copies and memsets
  that only enqueue work;
- ``sync``: calls that make the host wait for the device: device / stream / event synchronize,
  blocking copies (``cudaMemcpy``; ``cudaMemcpyAsync`` longer than BLOCKING_COPY_US, or whatever
  its length when it launched a device-to-pageable copy, which waits for the stream: see
  ``gpu_windows``); ``cudaStreamWaitEvent`` is *not* one (the GPU waits, not the host);
- ``alloc``: device, host and managed memory allocation and release (``cudaMalloc``,
  ``cudaFree``, ``cudaHostAlloc``, ``cuMemAlloc``, ...);
- ``setup``: context and device setup and queries (``cudaGetDeviceProperties``,
  ``cudaDeviceGetStreamPriorityRange`` — the first CUDA call, which creates the context —,
  ``cudaSetDevice``, module loading, ...);
- ``other``: anything else (event record/query, stream creation, ...): counted, not blamed.

:data:`COMM_NAMES` recognises collective communication (NCCL kernels ``ncclKernel_*`` /
``ncclDevKernel_*``, ``nccl:`` / ``gloo:`` record_function ranges, ``c10d::`` ops,
``record_param_comms``); :data:`COMPUTE_NAMES` the matmul / convolution families (a ``mm`` only
as its own word part, so ``ncclDevComm`` is not a matmul).
"""

from __future__ import annotations

import re

import numpy as np

CATEGORIES = ("launch", "sync", "alloc", "setup", "other")
#: a cudaMemcpy(Async) lasting longer than this (µs) waited for the stream: it is a sync
BLOCKING_COPY_US = 50.0

_LAUNCH = re.compile(r"^(cuda|cu|hip)(LaunchKernel|LaunchCooperativeKernel|LaunchKernelExC|LaunchKernelEx"
                     r"|GraphLaunch|LaunchHostFunc|ModuleLaunchKernel|ExtModuleLaunchKernel|LaunchKernel_v\d+)"
                     r"|^cuLaunch|^hipLaunch|^(cuda|hip)Memset.*Async|^cuMemset.*Async", re.I)
_COPY = re.compile(r"^(cuda|cu|hip)Memcpy", re.I)
_SYNC = re.compile(r"^(cuda|cu|hip)(DeviceSynchronize|StreamSynchronize|EventSynchronize|CtxSynchronize"
                   r"|ThreadSynchronize|StreamQuery_blocking)|^(cuda|hip)Memset$|^cuMemset(D\d+)?(_v\d+)?$", re.I)
_ALLOC = re.compile(r"^(cuda|cu|hip)(Malloc|Free|HostAlloc|HostRegister|HostUnregister|MallocHost|FreeHost"
                    r"|MallocManaged|MallocAsync|FreeAsync|MallocPitch|Malloc3D|MallocArray|MemAlloc|MemFree"
                    r"|MemHostAlloc|MemCreate|MemRelease|MemMap|MemUnmap|MemAddressReserve|MemAddressFree"
                    r"|MemPool|ExtMalloc|HostMalloc)", re.I)
_SETUP = re.compile(r"^(cuda|cu|hip)(GetDeviceProperties|DeviceGetAttribute|DeviceGetStreamPriorityRange"
                    r"|SetDevice|GetDevice|GetDeviceCount|Init|DeviceGet|CtxCreate|CtxGet|CtxSet|DevicePrimaryCtx"
                    r"|ModuleLoad|ModuleGetFunction|ModuleUnload|LibraryLoad|FuncGetAttribute|FuncSetAttribute"
                    r"|DriverGetVersion|RuntimeGetVersion|GetExportTable|DeviceSetLimit|DeviceGetLimit"
                    r"|DeviceReset|ChooseDevice|StreamCreate|StreamDestroy|EventCreate|EventDestroy"
                    r"|GraphInstantiate|GraphCreate|GraphDestroy|GraphExecDestroy|StreamBeginCapture"
                    r"|StreamEndCapture|OccupancyMaxActiveBlocksPerMultiprocessor)", re.I)

COMM_NAMES = re.compile(r"nccl|gloo|^c10d::|record_param_comms|ProcessGroup|all_?reduce|all_?gather"
                        r"|reduce_?scatter|all_?to_?all|sendrecv", re.I)
COMPUTE_NAMES = re.compile(r"(?:^|[^a-z])(?:add|b|baddb|addb|int_|scaled_)?mm(?:[^a-z]|$)|matmul|linear|conv|gemm"
                           r"|einsum|attention|sdpa|flash_|xmma|cutlass|(?:^|[^a-z])h?mma|wgmma|sm\d+_|scudnn"
                           r"|cudnn.*(?:fprop|dgrad|wgrad)", re.I)


def runtime_category(name: str, dur_us: float = 0.0) -> str:
    """The category (one of CATEGORIES) of a runtime / driver call named ``name`` lasting ``dur_us``."""
    if _COPY.match(name):
        blocking = "Async" not in name or dur_us > BLOCKING_COPY_US
        return "sync" if blocking else "launch"
    for category, rx in (("launch", _LAUNCH), ("sync", _SYNC), ("alloc", _ALLOC), ("setup", _SETUP)):
        if rx.search(name):
            return category
    return "other"


def categorise(names: list[str], name_ids: np.ndarray, dur: np.ndarray) -> np.ndarray:
    """Per runtime row (``name_ids`` index ``names``): the index of its category in CATEGORIES."""
    out = np.zeros(len(name_ids), dtype=np.int8)
    if not len(name_ids):
        return out
    uniq, inv = np.unique(name_ids, return_inverse=True)
    copies = np.array([bool(_COPY.match(names[int(u)])) and "Async" in names[int(u)] for u in uniq])
    fixed = np.array([CATEGORIES.index(runtime_category(names[int(u)])) for u in uniq], dtype=np.int8)
    out[:] = fixed[inv]
    async_copy = copies[inv]
    out[async_copy & (dur > BLOCKING_COPY_US)] = CATEGORIES.index("sync")
    return out


def is_comm(name: str) -> bool:
    return COMM_NAMES.search(name) is not None


def is_compute(name: str) -> bool:
    return not is_comm(name) and COMPUTE_NAMES.search(name) is not None
