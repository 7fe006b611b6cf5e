"""Multi-rank profiling: each rank of a torch.distributed job writes its own trace."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cuvil_pgc.instrument.session import rank_path


def test_rank_path_names():
    assert rank_path("run.trace.json", 3) == "run.rank3.trace.json"
    assert rank_path("out/run.trace.json.gz", 0) == os.path.join("out", "run.rank0.trace.json.gz")
    assert rank_path("x", 1) == "x.rank1"


@pytest.mark.slow
def test_two_gloo_ranks_write_one_trace_each(tmp_path):
    worker = os.path.join(os.path.dirname(__file__), "_ddp_worker.py")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(worker)),
                                                      os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           worker, str(tmp_path)]
    subprocess.run(cmd, check=True, env=env, timeout=240, capture_output=True)
    for rank in (0, 1):
        doc = json.loads((tmp_path / f"job.rank{rank}.trace.json").read_text())
        assert doc["cuvil"]["rank"] == rank and doc["cuvil"]["world_size"] == 2
        names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "region"]
        assert names.count("step") == 5 and names.count("allreduce") == 5
