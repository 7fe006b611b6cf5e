"""Which rank of a distributed job this process is (sessions and aggregates record it)."""

from __future__ import annotations

import os
import sys


def rank_and_world() -> tuple[int, int]:
    """(rank, world size): torch.distributed when initialised, else torchrun's RANK / WORLD_SIZE."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:
        pass
    env = os.environ
    try:
        return int(env.get("RANK", 0)), int(env.get("WORLD_SIZE", 1))
    except ValueError:
        return 0, 1
