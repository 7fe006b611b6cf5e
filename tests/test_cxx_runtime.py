"""An AOTInductor package loads, and a cpp_wrapper program compiles, with the process's libstdc++
in its global symbol scope.

On the H200 a CUDA package crashed each fresh process that loaded it unless libstdc++ was global
(see :mod:`cuvil_pgc.recompile.cxx_runtime`). The crash needs that GPU machine; these tests pin
what the fix does. Each runs in a fresh process: the test process may have made libstdc++ global
already (importing onnxruntime does).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

# std::locale::classic(): resolvable through dlopen(NULL) only when libstdc++ is in the global scope
PROBE = """
import ctypes, torch
def is_global():
    return hasattr(ctypes.CDLL(None), "_ZNSt6locale7classicEv")
"""

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="libstdc++ and dlopen scopes are Linux's")


def _run(code: str) -> list[str]:
    proc = subprocess.run([sys.executable, "-c", PROBE + code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def test_loading_a_package_first_makes_libstdcxx_global():
    before, during = _run("""
from cuvil_pgc.recompile import aoti_outputs
seen = []
torch._C._aoti.AOTIModelPackageLoader = lambda *args: seen.append(is_global())
print(is_global())
aoti_outputs.aoti_runner("region.pt2", False, None, None)
print(seen[0])
""")
    if before == "True":
        pytest.skip("this Python has libstdc++ in its global scope from the start")
    assert (before, during) == ("False", "True")


def test_sharing_never_loads_a_library_the_process_lacks():
    """glibc's libanl is installed (else skipped) and nothing here loads it."""
    shared, loaded = _run("""
import ctypes, ctypes.util
from cuvil_pgc.recompile import cxx_runtime
if ctypes.util.find_library("anl") is None:
    print("skip skip"); raise SystemExit
cxx_runtime.LIBSTDCXX = "libanl.so.1"
print(cxx_runtime.share_cxx_runtime(), any("libanl" in line for line in open("/proc/self/maps")))
""")
    if shared == "skip":
        pytest.skip("no libanl.so.1 on this machine")
    assert (shared, loaded) == ("False", "False")


def test_a_cpp_wrapper_program_is_compiled_with_libstdcxx_global():
    """torch.compile with cpp_wrapper loads Inductor-compiled C++ into the process, as a package does."""
    before, during = _run("""
from torch import nn
from cuvil_pgc.recompile.apply import ScopeInputs, realize
from cuvil_pgc.recompile.candidates import Candidate
seen = []
torch.compile = lambda module, **kwargs: seen.append(is_global()) or module
print(is_global())
realize(nn.Linear(2, 2), Candidate("", "compile", cpp_wrapper=True), ScopeInputs((torch.zeros(1, 2),)))
print(seen[0])
""")
    if before == "True":
        pytest.skip("this Python has libstdc++ in its global scope from the start")
    assert (before, during) == ("False", "True")
