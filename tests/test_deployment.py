"""The deployment flow, each step in its own process: a build recompiled through the CLI from
``pkg/file.py:factory`` applies in a service that imports ``pkg.file`` the usual way.

Before issue 22 the file was imported as ``_cuvil_model_file`` and the structural hash included the
module name, so the service's model (``pkg.file.Ranker``) never matched the build: load_build warned
"module changed since the build" and applied nothing.

The recompile process fakes timings at the measurement seam (``time_interleaved``: a rewritten
module measures faster than eager) so the plan it chooses does not depend on this machine's load,
and skips the per-machine backend calibration (an AOTInductor compile) it does not need.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

MODEL_SOURCE = '''
import torch
from torch import nn


class Ranker(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Linear(8 * 8 * 8, 4)

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))).flatten(1))


def factory():
    torch.manual_seed(0)
    model = Ranker().eval()
    with torch.no_grad():                      # non-trivial statistics, so folding changes the weights
        model.bn.running_mean.uniform_(-1, 1)
        model.bn.running_var.uniform_(0.5, 2)
    return model, (torch.randn(1, 3, 8, 8),)
'''

# The CLI, in a process whose timings are scripted: eager 1 ms, everything else 0.5 ms.
RECOMPILE_CLI = textwrap.dedent('''
    import sys
    import cuvil_pgc.recompile.calibrate as calibrate
    import cuvil_pgc.recompile.plan as plan
    import cuvil_pgc.recompile.search as search
    from cuvil_pgc.recompile.measure import Samples

    def fake_time(fns, rounds, **kw):
        return {k: Samples(k, [1e-3 if k == "eager" or k.endswith("::eager") else 5e-4]) for k in fns}

    search.time_interleaved = plan.time_interleaved = fake_time
    calibrate.calibrate_backends = lambda *a, **k: 0
    from cuvil_pgc.cli import main
    main(sys.argv[1:])
''')

SERVICE = textwrap.dedent('''
    import json, sys, warnings
    import torch
    from cuvil_pgc import load_build
    from {package}.ranker import factory        # the service imports the model as a package module

    model, inputs = factory()
    with torch.no_grad():
        eager_out = model(*inputs).clone()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fast = load_build(sys.argv[1], model, pubkey=sys.argv[2])
    with torch.no_grad():
        out = fast(*inputs)
    print(json.dumps({{"applied": fast.cuvil_load_report.applied, "skipped": fast.cuvil_load_report.skipped,
                      "warnings": [str(w.message) for w in caught], "module": type(model).__module__,
                      "max_diff": float((out - eager_out).abs().max()), "same_object": fast is model}}))
''')


def _run(args: list[str], cwd, env) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{args[:4]} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture
def service_dir(tmp_path):
    package = f"shop_{os.getpid()}"        # a name no other test imports
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "ranker.py").write_text(MODEL_SOURCE)
    env = {**os.environ, "CUVIL_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("CUVIL_TRUSTED_KEY", None)
    env.pop("CUVIL_ALLOW_UNSIGNED", None)
    return tmp_path, package, env


@pytest.mark.slow
def test_a_build_from_a_file_spec_applies_in_a_service_importing_the_package(service_dir):
    root, package, env = service_dir
    spec = f"{package}/ranker.py:factory"
    cli = [sys.executable, "-m", "cuvil_pgc"]
    _run([*cli, "profile", "--model", spec, "-o", "run.trace.json", "--no-ops", "--sample-hz", "0",
          "--iters", "5", "--warmup", "1"], root, env)
    _run([*cli, "keygen", "-o", "release.key"], root, env)
    _run([sys.executable, "-c", RECOMPILE_CLI, "recompile", "run.trace.json", "--model", spec, "-o", "ranker.cuvilpkg",
          "--backends", "eager", "--sign", "release.key", "--json"], root, env)
    service = root / "service.py"
    service.write_text(SERVICE.format(package=package))
    proc = _run([sys.executable, str(service), "ranker.cuvilpkg", "release.key.pub"], root,
                {**env, "PYTHONPATH": os.pathsep.join(p for p in (str(root), env.get("PYTHONPATH")) if p)})
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["module"] == f"{package}.ranker"
    assert report["applied"] and all("rewrite" in a for a in report["applied"]), report
    assert report["skipped"] == [] and not any("changed" in w for w in report["warnings"]), report
    assert not report["same_object"]              # the build's module runs, not the plain model
    assert report["max_diff"] < 1e-4             # with the model's outputs
