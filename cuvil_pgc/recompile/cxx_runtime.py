"""Put the process's C++ runtime in its global symbol scope before an AOTInductor package loads.

Python loads torch's libraries, and with them libstdc++, with ``RTLD_LOCAL``, so libstdc++ is
loaded but not in the process's global symbol scope. An AOTInductor package is a shared library
that the process loads afterwards. Seen on the lent H200 (torch 2.11.0+cu130, Inductor's compiler
GCC 13.3, the system libstdc++ 6.0.33; 2026-12-04):

- Every AOTInductor CUDA package crashed the process that loaded it, a tiny Linear's included.
  cuda-gdb put the SIGSEGV in ``std::regex`` code inside the package's library, which ran as the
  package built its model (``torch::aot_inductor::parse_device_str``).
- The same package loaded and ran in a process that had promoted libstdc++ with ``RTLD_GLOBAL``
  (what :func:`share_cxx_runtime` does). It also ran where libstdc++ was in ``LD_PRELOAD``, and
  where onnxruntime had been imported first.
- It crashed after importing pyarrow, or cuvil-pgc's CLI and recompiler, first.
- The searching process imports onnxruntime to ask which providers it has. That is the likely
  reason the packages it measured ran there and crashed only the processes that loaded the build.

Our reading is that, with no libstdc++ in the global scope, the package's library binds the
standard library's shared inline objects to its own copies. The evidence above does not settle
the mechanism; promoting libstdc++ gives the order of an ordinary C++ program, whose executable
links it.

A torch.compile program with ``cpp_wrapper`` loads Inductor-compiled C++ into the process too;
``apply.realize`` promotes libstdc++ before it builds one. None was seen to crash (the H200's
searching process had libstdc++ global already): a precaution for the processes that load a build.
"""

from __future__ import annotations

import ctypes
import os
import sys

LIBSTDCXX = "libstdc++.so.6"
_shared = False


def share_cxx_runtime() -> bool:
    """Promote the libstdc++ this process has loaded into its global symbol scope (once); False
    where there is none loaded to promote (not Linux, a libc++ build). Never loads a library the
    process does not have already."""
    global _shared
    if _shared or not sys.platform.startswith("linux"):
        return _shared
    try:
        ctypes.CDLL(LIBSTDCXX, mode=os.RTLD_GLOBAL | os.RTLD_NOLOAD)
    except OSError:        # not loaded: nothing to promote
        return False
    _shared = True
    return True
