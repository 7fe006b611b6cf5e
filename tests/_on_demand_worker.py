"""A long-running process in on-demand mode, used by test_on_demand (writes its pid, then loops)."""

from __future__ import annotations

import os
import signal
import sys
import time

import torch

import cuvil_pgc  # noqa: F401  (CUVIL_PGC_ON_DEMAND=1 starts on-demand mode at import)
from cuvil_pgc import ProfileRegion

host_signals = []
signal.signal(signal.SIGUSR1, lambda s, f: host_signals.append(s))   # the host's own handler stays

ready = sys.argv[1]
with open(ready + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.replace(ready + ".tmp", ready)
deadline = time.monotonic() + float(sys.argv[2])
x = torch.randn(32, 32)
while time.monotonic() < deadline:
    with ProfileRegion("serve"):
        with ProfileRegion("matmul"):
            torch.mm(x, x)
    time.sleep(0.002)
from cuvil_pgc.instrument.on_demand import _auto  # noqa: E402

_auto.stop()
print("windows", _auto.windows)
