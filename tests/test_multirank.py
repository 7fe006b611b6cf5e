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
    files = [tmp_path / f"job.rank{rank}.trace.json" for rank in (0, 1)]
    for rank, path in enumerate(files):
        doc = json.loads(path.read_text())
        assert doc["cuvil"]["rank"] == rank and doc["cuvil"]["world_size"] == 2
        names = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "region"]
        assert names.count("step") == 5 and names.count("allreduce") == 5

    # analyze and report on the set merge the ranks and name the straggler (rank 1 computes 5x longer)
    from cuvil_pgc.analyze import analyze
    from cuvil_pgc.viewer import render_html

    analysis = analyze([str(f) for f in files])
    compute = next(r for r in analysis.ranks["regions"] if r["path"] == "step/compute")
    assert compute["slowest_rank"] == 1 and compute["skew_us"] > 0
    assert analysis.ranks["stragglers"][0]["path"] in ("step/compute", "step", "step/allreduce")
    assert analysis.region("step/compute").calls == 10
    html = render_html(analysis)
    assert 'id="ranks"' in html
