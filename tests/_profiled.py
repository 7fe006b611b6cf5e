"""A model's trace as ``cuvil-pgc profile`` records it: every submodule a region, CPU only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from cuvil_pgc import instrument_module, profile


def record_trace(model: torch.nn.Module, inputs: tuple[Any, ...], path: str | Path, calls: int = 1) -> str:
    """Profile ``calls`` calls of ``model`` on ``inputs`` into ``path``; the path, as a string."""
    handle = instrument_module(model)
    try:
        with profile(str(path), ops=True, gpu="off", sample_hz=0), torch.no_grad():
            for _ in range(calls):
                model(*inputs)
    finally:
        handle.remove()
    return str(path)
