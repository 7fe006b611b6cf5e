"""A two-rank torch.distributed (gloo) job used by test_multirank: each rank profiles its work."""

from __future__ import annotations

import os
import sys
import time

import torch
import torch.distributed as dist

from cuvil_pgc import ProfileRegion, profile


def main(out: str) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    with profile(os.path.join(out, "job.trace.json"), ops=False, compile=False, sample_hz=0, gpu="off"):
        for _ in range(5):
            with ProfileRegion("step"):
                with ProfileRegion("compute"):
                    time.sleep(0.002 * (1 + 4 * rank))   # rank 1 is the straggler
                with ProfileRegion("allreduce"):
                    t = torch.ones(4)
                    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
