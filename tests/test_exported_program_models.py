"""A model deployed the way ``torch.export`` deploys one (``torch.export.load(path).module()``)
recompiles and loads: such a module raises NotImplementedError on ``.eval()`` ("Calling eval()
is not supported yet"), which recompile, load_build and compare called first, so each crashed
before doing anything."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from cuvil_pgc._eval_mode import eval_mode
from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate
from tests._service import run_service

pytestmark = pytest.mark.usefixtures("build_env")

SERVICE = textwrap.dedent('''
    import json, sys
    import torch
    from cuvil_pgc import load_build

    model = torch.export.load(sys.argv[1]).module()
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(3))
    fast = load_build(sys.argv[2], model, pubkey=sys.argv[3])
    with torch.no_grad():
        diff = float((fast(x) - model(x)).abs().max())
    print(json.dumps({"applied": fast.cuvil_load_report.applied, "diff": diff, "fallback_calls": fast.fallback_calls}))
''')


@pytest.fixture
def exported(tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()
    path = tmp_path / "model.pt2"
    torch.export.save(torch.export.export(model, (torch.randn(4, 16),)), str(path))
    return path


def test_eval_mode_leaves_a_module_without_the_switch_as_it_is(exported):
    module = torch.export.load(str(exported)).module()
    with pytest.raises(NotImplementedError):     # what torch does: if it stops, eval_mode can go
        module.eval()
    assert eval_mode(module) is module
    plain = nn.Linear(2, 2).train()
    assert eval_mode(plain) is plain and not plain.training


@pytest.mark.slow
def test_an_exported_program_module_recompiles_and_loads_in_a_service(tmp_path, keys, exported):
    model = torch.export.load(str(exported)).module()
    x = torch.randn(4, 16)
    build = recompile(model, (x,), plan={"": Candidate("", "aoti")}, records=False, deployed_race=False, rounds=3)
    with torch.no_grad():
        torch.testing.assert_close(build.module(x), model(x), rtol=1e-4, atol=1e-5)
    path = build.save(tmp_path / "m.cuvilpkg", signing_key=str(keys[0]))
    report = run_service(SERVICE, exported, path, keys[1], cwd=tmp_path)
    assert report["applied"] == ["<model>: aoti"] and report["diff"] < 1e-4 and report["fallback_calls"] == 0, report
