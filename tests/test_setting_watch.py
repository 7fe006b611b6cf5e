"""A loaded build runs a region's original module while a setting inside it differs from the one it
was built with, and its program again once the setting is back. A service that set the calibrated
temperature on its loaded model (``model.temperature = 2.5``) got the build's softmax at the old
one, 0.06 off, silently; peft's ``disable_adapter()`` and ``set_adapter()`` the same."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch
from torch import nn

from cuvil_pgc import load_build
from cuvil_pgc.recompile import recompile, runtimes
from cuvil_pgc.recompile.candidates import Candidate
from tests._service import run_service

pytestmark = [pytest.mark.skipif(not runtimes.check("ort").ok, reason="needs onnxruntime"),
              pytest.mark.usefixtures("build_env")]


class Calibrated(nn.Module):
    """Divides its logits by a temperature a service sets once it has calibrated; counts the calls
    of another batch size than 4 in a Python attribute its forward writes only then."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))
        self.temperature = 1.0
        self._adapter_off = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] != 4:
            self.other_batches = getattr(self, "other_batches", 0) + 1
        logits = self.body(x) if self._adapter_off else self.body(x) + 1.0
        return (logits / self.temperature).softmax(-1)

    @contextlib.contextmanager
    def adapter_off(self):
        """As peft's ``disable_adapter()``: a private flag set, and set back on leaving."""
        self._adapter_off = True
        try:
            yield
        finally:
            self._adapter_off = False


class WithHead(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 16)
        self.head = Calibrated()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.stem(x)))


def calibrated() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return Calibrated().eval(), torch.randn(4, 16)


def with_head() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return WithHead().eval(), torch.randn(4, 16)


def _built(make, scope: str, tmp_path, keys) -> tuple[nn.Module, nn.Module, torch.Tensor, str]:
    model, x = make()
    build = recompile(model, (x,), records=False, plan={scope: Candidate(scope, "ort")}, rounds=3,
                      deployed_race=False)
    path = str(build.save(tmp_path / "calibrated.cuvilpkg", signing_key=str(keys[0])))
    fresh, _ = make()
    eager, _ = make()
    return load_build(path, fresh, pubkey=str(keys[1])), eager, x, path


def _region(built: nn.Module) -> nn.Module:
    return next(m for m in built.modules() if hasattr(m, "settings_stale"))


def _agrees(built: nn.Module, eager: nn.Module, x: torch.Tensor) -> bool:
    with torch.no_grad():
        return torch.allclose(built(x), eager(x), atol=1e-6)


def test_a_temperature_set_on_the_loaded_model_runs_the_original_until_it_is_set_back(tmp_path, keys, caplog):
    built, eager, x, _ = _built(calibrated, "", tmp_path, keys)
    region = _region(built)
    assert region.settings_stale is None and _agrees(built, eager, x)
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile"):
        built.temperature = eager.temperature = 2.5
    assert built.temperature == 2.5 and region.original.temperature == 2.5       # set where it is read
    assert region.settings_stale == "temperature" and "temperature was set to another value" in caplog.text
    assert _agrees(built, eager, x)
    built.temperature = eager.temperature = 1.0
    assert region.settings_stale is None and region._lean is not None              # the program's call again
    assert _agrees(built, eager, x)


def test_weights_loaded_while_a_setting_differs_keep_the_original_once_it_is_set_back(tmp_path, keys):
    built, eager, x, _ = _built(calibrated, "", tmp_path, keys)
    built.temperature = eager.temperature = 2.5
    with torch.no_grad():
        for p in eager.parameters():
            p.add_(0.1)
    built.load_state_dict(eager.state_dict())
    built.temperature = eager.temperature = 1.0
    assert _region(built).settings_stale is None and _agrees(built, eager, x)


def test_a_private_flag_a_context_manager_sets_and_resets_is_followed(tmp_path, keys):
    built, eager, x, _ = _built(calibrated, "", tmp_path, keys)
    region = _region(built)
    with region.original.adapter_off(), eager.adapter_off():
        assert region.settings_stale == "_adapter_off" and _agrees(built, eager, x)
    assert region.settings_stale is None and _agrees(built, eager, x)


def test_a_setting_of_a_submodule_region_set_through_its_parent(tmp_path, keys):
    built, eager, x, _ = _built(with_head, "head", tmp_path, keys)
    built.head.temperature = eager.head.temperature = 0.5
    assert _region(built).settings_stale == "temperature" and _agrees(built, eager, x)


def test_what_the_original_module_writes_while_the_region_runs_it_is_no_setting(tmp_path, keys):
    built, eager, x, _ = _built(calibrated, "", tmp_path, keys)
    region = _region(built)
    other = torch.randn(8, 16)
    with torch.no_grad():
        assert torch.allclose(built(other), eager(other), atol=1e-6)     # another size: the original runs
    assert region.original.other_batches == 1 and region.fallback_calls == 1
    assert region.settings_stale is None and _agrees(built, eager, x)


def test_a_copy_of_a_loaded_build_watches_its_own_modules(tmp_path, keys):
    built, eager, x, _ = _built(calibrated, "", tmp_path, keys)
    twin = copy.deepcopy(built)
    twin.temperature = 3.0
    assert _region(twin).settings_stale == "temperature" and _region(built).settings_stale is None
    assert built.temperature == 1.0 and _agrees(built, eager, x)


def test_a_build_loaded_again_onto_the_same_model_leaves_no_watch_of_the_one_before(tmp_path, keys):
    """A service reloading a build (a new release) onto the model it keeps: the regions gone, their
    watches go with the next load, and the new region follows the settings."""
    import gc

    from cuvil_pgc.recompile.setting_watch import _WATCHED

    built, eager, x, path = _built(calibrated, "", tmp_path, keys)
    model = _region(built).original
    del built
    gc.collect()
    again = load_build(path, model, pubkey=str(keys[1]))
    assert len(_WATCHED[id(model)][1]) == 1
    again.temperature = eager.temperature = 2.0
    assert _region(again).settings_stale == "temperature" and _agrees(again, eager, x)


SERVICE = """
import json, sys
import torch
from cuvil_pgc import load_build
from tests.test_setting_watch import calibrated
model, x = calibrated()
eager, _ = calibrated()
built = load_build(sys.argv[1], model, pubkey=sys.argv[2])
errors = []
with torch.no_grad():
    for temperature in (1.0, 2.5, 0.7, 1.0):
        built.temperature = eager.temperature = temperature
        errors.append(float((built(x) - eager(x)).abs().max()))
print(json.dumps({"errors": errors, "regions": built.cuvil_load_report.runtime_regions}))
"""


def test_a_service_that_calibrates_its_loaded_model_gets_eager_answers(tmp_path, keys):
    _, _, _, path = _built(calibrated, "", tmp_path, keys)
    report = run_service(SERVICE, path, keys[1], cwd=tmp_path)
    assert report["regions"] == 1 and max(report["errors"]) < 1e-6, report
