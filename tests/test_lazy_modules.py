"""A model built from lazy modules (``nn.LazyLinear``) has no weights until its first call or its
checkpoint: load_build onto such a model failed deep inside with torch's "Can't access the shape of
an uninitialized parameter", reported as a build that "could not be loaded" and should be rebuilt;
given its checkpoint but not called, it is still a ``LazyLinear`` with ``in_features`` 0, and was
refused as "made for another model". Both now get the lazy modules named and the fix (load the
checkpoint, call the model once), and the model loads once it is done."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc import load_build
from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate

pytestmark = pytest.mark.usefixtures("build_env")


def lazy_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.LazyLinear(8), nn.ReLU(), nn.LazyLinear(2)).eval()


def test_load_build_onto_unmade_lazy_weights_names_them_and_the_fix(tmp_path, keys, caplog):
    pytest.importorskip("onnxruntime")
    model, x = lazy_model(), torch.randn(4, 5)
    with caplog.at_level("WARNING"):
        build = recompile(model, (x,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False,
                          rounds=3)
    # the first call made the weights: it rewrote none in place
    assert not any("changed its weights in place" in r.getMessage() for r in caplog.records)
    path = build.save(tmp_path / "l.cuvilpkg", signing_key=str(keys[0]))
    with pytest.raises(BuildError, match=r"lazy modules have not been called yet \(0, 2\).*load the model's "
                                         r"checkpoint into it and call it once"):
        load_build(path, lazy_model(), pubkey=str(keys[1]))
    with pytest.warns(RuntimeWarning, match="running the model in eager mode: .*lazy modules"):
        load_build(path, lazy_model(), pubkey=str(keys[1]), fallback="eager")
    served = lazy_model()
    served.load_state_dict(model.state_dict())            # the service's checkpoint makes the weights
    with pytest.raises(BuildError, match=r"lazy modules have not been called yet \(0, 2\)"):
        load_build(path, served, pubkey=str(keys[1]))
    with torch.no_grad():
        served(x)                                         # and its first call the rest
    fast = load_build(path, served, pubkey=str(keys[1]))
    assert fast.cuvil_load_report.applied == ["<model>: ort"]
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))


class OwnLazy(torch.nn.modules.lazy.LazyModuleMixin, nn.Module):
    """A lazy module of the user's with no class to become: lazy still after its first call."""

    cls_to_become = None

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.parameter.UninitializedParameter()

    def initialize_parameters(self, x):
        if self.has_uninitialized_params():
            with torch.no_grad():
                self.weight.materialize((x.shape[-1],))
                self.weight.fill_(0.5)

    def forward(self, x):
        return x * self.weight


def test_a_called_lazy_module_without_a_class_to_become_loads(tmp_path, keys):
    pytest.importorskip("onnxruntime")
    model, x = OwnLazy().eval(), torch.randn(3, 4)
    build = recompile(model, (x,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    path = build.save(tmp_path / "o.cuvilpkg", signing_key=str(keys[0]))
    served = OwnLazy().eval()
    with torch.no_grad():
        served(x)
    assert isinstance(served, torch.nn.modules.lazy.LazyModuleMixin)
    assert load_build(path, served, pubkey=str(keys[1])).cuvil_load_report.applied == ["<model>: ort"]
