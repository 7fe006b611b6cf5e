"""The torch intra-op thread count a command measures at: the deployment's, stated and recorded.

A plan measured at one thread count is not the best plan at another (GEMM libraries and Inductor's
kernels scale differently from eager's many small ops), so ``recompile``, ``compare``, ``profile
--model`` and ``demo`` take ``--threads N``. The default is what torch would use in the deploying
process: ``torch.get_num_threads()`` of a fresh process, which follows ``OMP_NUM_THREADS`` and the
cores torch sees. The build's manifest records the count and ``load_build`` warns when the loading
process runs with another one.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from cuvil_pgc.errors import ConfigError

THREADS_HELP = "torch intra-op threads to run at (default: what torch uses in a fresh process here)."


def default_threads() -> int:
    """What torch would use in a process started like this one (torch.get_num_threads())."""
    import torch

    return int(torch.get_num_threads())


def resolve_threads(threads: int | None) -> int:
    """``threads`` checked, or the default when None."""
    if threads is None:
        return default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"threads={threads!r} is not a positive integer", fix="pass --threads 1 or more")
    return threads


@contextmanager
def torch_threads(threads: int | None) -> Iterator[int]:
    """Run the block at ``threads`` intra-op threads (the default when None); restores the count after."""
    import torch

    count = resolve_threads(threads)
    before = torch.get_num_threads()
    if count != before:
        torch.set_num_threads(count)
    try:
        yield count
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
