"""A model handed over in training mode (a model built by hand is, until ``.eval()``): builds
compute in eval mode, and recompile and load_build put the model there. Both did so without a word,
so a service that forgot ``.eval()`` saw its outputs change (its dropout gone) at load_build with
nothing saying why. Both now say it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc import load_build
from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate

pytestmark = pytest.mark.usefixtures("build_env")


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Dropout(0.5), nn.Linear(16, 2))      # in training mode


def test_recompile_and_load_build_say_they_put_a_training_model_in_eval_mode(tmp_path, keys, caplog):
    net, x = model(), torch.randn(4, 8)
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.build"):
        build = recompile(net, (x,), plan={"": Candidate("", "eager")}, records=False, deployed_race=False,
                          rounds=3)
    assert any("the model is in training mode" in r.getMessage() for r in caplog.records)
    path = build.save(tmp_path / "m.cuvilpkg", signing_key=str(keys[0]))
    served = model()
    assert served.training
    fast = load_build(path, served, pubkey=str(keys[1]))
    assert not served.training
    assert any(n.startswith("the model was in training mode: load_build put it in eval mode")
               for n in fast.cuvil_load_report.notes), fast.cuvil_load_report.notes
    quiet = load_build(path, model().eval(), pubkey=str(keys[1]))
    assert not any("training mode" in n for n in quiet.cuvil_load_report.notes)


def normed():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 2))      # in training mode


def test_a_model_warmed_up_in_training_mode_is_told_why_its_weights_changed(tmp_path, keys):
    """A service that forgot ``.eval()`` and called its model before load_build moved batch norm's
    running statistics: the build's program holds the ones it was built with, so the region runs
    eagerly, and the warning says what moved them and the fix."""
    pytest.importorskip("onnxruntime")
    net, x = normed(), torch.randn(4, 8)
    build = recompile(net, (x,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    path = build.save(tmp_path / "m.cuvilpkg", signing_key=str(keys[0]))
    served = normed()
    served(torch.randn(4, 8))                     # a warm-up call, in training mode
    with pytest.warns(RuntimeWarning, match=r"weights changed since the build.*came in training mode.*"
                                            r"call model.eval\(\) before its first call"):
        fast = load_build(path, served, pubkey=str(keys[1]))
    assert fast.cuvil_load_report.applied == []
    tuned = normed().eval()
    with torch.no_grad():
        tuned[0].bias.add_(0.5)                   # changed in eval mode: not batch norm's statistics
    with pytest.warns(RuntimeWarning, match="weights changed since the build") as caught:
        load_build(path, tuned, pubkey=str(keys[1]))
    assert not any("training mode" in str(w.message) for w in caught)
    assert load_build(path, normed(), pubkey=str(keys[1])).cuvil_load_report.applied == ["<model>: ort"]
