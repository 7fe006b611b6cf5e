"""OpenVINO's CPU plugin replaces the loading thread's alternate signal stack with one it frees when
it goes: a build dropped on another thread then left the process to die of SIGSEGV on its next
signal (:mod:`cuvil_pgc.recompile._signal_stack`)."""

from __future__ import annotations

import ctypes

import pytest

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile._signal_stack import _SIGALTSTACK, _Stack, current_signal_stack, kept_signal_stack
from tests._service import run_service

needs_sigaltstack = pytest.mark.skipif(current_signal_stack() is None, reason="no sigaltstack here")


@needs_sigaltstack
def test_the_thread_gets_its_own_alternate_stack_back():
    before = current_signal_stack()
    other = ctypes.create_string_buffer(64 * 1024)
    with kept_signal_stack():
        assert _SIGALTSTACK(ctypes.byref(_Stack(ctypes.addressof(other), 0, len(other))), None) == 0
        assert current_signal_stack()[0] == ctypes.addressof(other)      # what the plugin does
    assert current_signal_stack() == before


SERVICE = """
import faulthandler, gc, json, os, signal, sys, threading
import torch
from torch import nn
if sys.argv[1] == "faulthandler":
    faulthandler.enable()          # as pytest and many services do: an alternate stack of its own
from cuvil_pgc.recompile._signal_stack import current_signal_stack
from cuvil_pgc.recompile.apply import ScopeInputs, realize
from cuvil_pgc.recompile.candidates import Candidate

before = current_signal_stack()
model = nn.Sequential(nn.Linear(8, 8)).eval()
regions = [realize(model, Candidate("", "openvino"), ScopeInputs((torch.randn(2, 8),)), machine="t").module]
after = current_signal_stack()
dropper = threading.Thread(target=lambda: (regions.clear(), gc.collect()))    # dropped on another thread
dropper.start()
dropper.join()
handled = []
signal.signal(signal.SIGUSR1, lambda *_: handled.append(True))
os.kill(os.getpid(), signal.SIGUSR1)      # a shutdown or capture signal, handled on the alternate stack
print(json.dumps({"handled": handled, "kept": before == after}))
"""


@pytest.mark.skipif(not runtimes.check("openvino").ok, reason="openvino not installed")
@needs_sigaltstack
@pytest.mark.parametrize("stack", ["faulthandler", "none"])
def test_a_signal_after_an_openvino_region_went_on_another_thread_is_handled(stack, tmp_path, monkeypatch):
    """Before: exit 139 (SIGSEGV) with faulthandler's stack replaced by the plugin's."""
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    assert run_service(SERVICE, stack, cwd=tmp_path) == {"handled": [True], "kept": True}
