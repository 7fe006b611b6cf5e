"""A TorchScript model, loaded with ``torch.jit.load`` as services load it, gets ONNX Runtime and
OpenVINO candidates: ``torch.export`` refuses ScriptModules ("Exporting a ScriptModule is not
supported"), so such a model had no runtime candidate and every recompile of it shipped eager.
Its region is exported with the TorchScript exporter instead, its number arguments written into
the graph as constants, and the build loads in a service process that has only the ``.pt`` file."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import recompile
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.runtimes import check
from tests._service import run_service

pytestmark = [pytest.mark.usefixtures("build_env"),
              pytest.mark.skipif(not check("ort").ok, reason="needs onnxruntime (the [ort] extra)")]


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb, self.fc, self.out = nn.Embedding(500, 32), nn.Linear(32, 32), nn.Linear(32, 3)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.relu(self.fc(self.emb(ids))).mean(1)
        return self.out(h), h


SERVICE = textwrap.dedent('''
    import json, sys
    import torch
    from cuvil_pgc import load_build

    model = torch.jit.load(sys.argv[1]).eval()
    ids = torch.randint(0, 500, (2, 16), generator=torch.Generator().manual_seed(3))
    fast = load_build(sys.argv[2], model, pubkey=sys.argv[3])
    with torch.no_grad():
        out, ref = fast(ids), model(ids)
    print(json.dumps({"applied": fast.cuvil_load_report.applied, "fallback_calls": fast.fallback_calls,
                      "diff": max(float((a - b).abs().max()) for a, b in zip(out, ref)),
                      "type": type(out).__name__}))
''')


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    path = tmp_path / "tagger.pt"
    torch.jit.save(torch.jit.trace(Tagger().eval(), (torch.randint(0, 500, (2, 16)),)), str(path))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_a_torch_jit_loaded_model_runs_on_a_runtime_in_a_service(tmp_path, keys, saved, backend):
    if not check(backend).ok:
        pytest.skip(f"needs {backend}")
    model = torch.jit.load(str(saved)).eval()
    ids = torch.randint(0, 500, (2, 16))
    build = recompile(model, (ids,), plan={"": Candidate("", backend)}, records=False, deployed_race=False, rounds=3)
    assert [c.candidate.backend for c in build.plan.choices] == [backend]
    with torch.no_grad():
        torch.testing.assert_close(build.module(ids), model(ids), rtol=1e-4, atol=1e-5)
    path = build.save(tmp_path / "tagger.cuvilpkg", signing_key=str(keys[0]))
    report = run_service(SERVICE, saved, path, keys[1], cwd=tmp_path)
    assert report["applied"] == [f"<model>: {backend}"] and report["fallback_calls"] == 0, report
    assert report["diff"] < 1e-4 and report["type"] == "tuple", report


class Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, scale: float = 2.0, shift: int = 3, negate: bool = False) -> torch.Tensor:
        y = self.fc(x) * scale + shift
        return -y if negate else y


def test_a_script_module_s_number_arguments_become_constants_of_its_graph(tmp_path):
    """The TorchScript exporter makes every number argument of a scripted forward a graph input,
    given or left at its default, which no runner feeds: each becomes a constant of the graph, with
    the value the captured call had, so the graph's one input is the region's one tensor."""
    import onnx
    import onnxruntime as ort

    from cuvil_pgc.recompile.apply import ScopeInputs
    from cuvil_pgc.recompile.runtime_build import export_onnx

    model, x = torch.jit.script(Scaled().eval()), torch.randn(2, 8)
    export_onnx(model, ScopeInputs((x, 0.5)), tmp_path / "s.onnx", 1)
    graph = onnx.load(str(tmp_path / "s.onnx")).graph
    assert [i.name for i in graph.input if i.name not in {t.name for t in graph.initializer}] == ["x.1"]
    session = ort.InferenceSession(str(tmp_path / "s.onnx"), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x.1": x.numpy()})
    with torch.no_grad():                 # 0.5 as passed, 3 and False by default
        torch.testing.assert_close(torch.from_numpy(out), model(x, 0.5, 3, False))


@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_a_script_module_with_number_arguments_runs_on_a_runtime_and_other_values_run_eagerly(backend):
    """Built for ``model(x)``: that call runs on the runtime; a call with another number (by
    position or keyword) does not fit the captured signature and runs the original module."""
    if not check(backend).ok:
        pytest.skip(f"needs {backend}")
    torch.manual_seed(0)
    model, x = torch.jit.script(Scaled().eval()), torch.randn(2, 8)
    build = recompile(model, (x,), plan={"": Candidate("", backend)}, records=False, deployed_race=False, rounds=3)
    assert [c.candidate.backend for c in build.plan.choices] == [backend]
    fast = build.module
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))
        assert fast.fallback_calls == 0
        for args, kwargs in [((x, 0.5), {}), ((x,), {"shift": 4}), ((x,), {"negate": True})]:
            torch.testing.assert_close(fast(*args, **kwargs), model(*args, **kwargs))
    assert fast.fallback_calls == 3


SCRIPTED_INSIDE = textwrap.dedent('''
    import torch
    from torch import nn


    class ScriptedInside(nn.Module):
        """An eager model calling a ``torch.jit.script``-ed block, with a dict output."""

        def __init__(self):
            super().__init__()
            self.pre = nn.Linear(16, 32)
            self.block = torch.jit.script(nn.Sequential(nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32)))
            self.post = nn.Linear(32, 4)

        def forward(self, x):
            h = self.block(self.pre(x).tanh())
            return {"logits": self.post(h), "pooled": h.mean(-1)}


    def make():
        torch.manual_seed(0)
        return ScriptedInside().eval(), (torch.randn(8, 16, generator=torch.Generator().manual_seed(1)),)
''')

SCRIPTED_SERVICE = textwrap.dedent('''
    import json, sys
    import torch
    from cuvil_pgc import load_build
    from scripted_model import make

    model, (x,) = make()
    fast = load_build(sys.argv[1], model, pubkey=sys.argv[2])
    with torch.no_grad():
        out, ref = fast(x), model(x)
    print(json.dumps({"applied": fast.cuvil_load_report.applied, "fallback_calls": fast.fallback_calls,
                      "keys": list(out), "diff": max(float((out[k] - ref[k]).abs().max()) for k in ref)}))
''')


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_an_eager_model_calling_a_scripted_block_runs_on_a_runtime_in_a_service(tmp_path, keys, monkeypatch, backend):
    """``torch.export`` fails on the call into a TorchScript submodule (``Sequential.forward() takes
    2 positional arguments but 3 were given``), so a model holding one had no runtime candidate and
    shipped eager. Traced with ``torch.jit.trace`` (which keeps the scripted call) and exported
    by the TorchScript exporter, it runs on each runtime, its dict output rebuilt key by key, and
    the build loads in a service that builds the model itself."""
    if not check(backend).ok:
        pytest.skip(f"needs {backend}")
    (tmp_path / "scripted_model.py").write_text(SCRIPTED_INSIDE)
    monkeypatch.syspath_prepend(str(tmp_path))
    from scripted_model import make

    model, (x,) = make()
    build = recompile(model, (x,), plan={"": Candidate("", backend)}, records=False, deployed_race=False, rounds=3)
    assert [c.candidate.backend for c in build.plan.choices] == [backend]
    with torch.no_grad():
        out, ref = build.module(x), model(x)
    assert list(out) == ["logits", "pooled"] and build.module.fallback_calls == 0
    for k in ref:
        torch.testing.assert_close(out[k], ref[k], rtol=1e-4, atol=1e-5)
    path = build.save(tmp_path / "scripted.cuvilpkg", signing_key=str(keys[0]))
    report = run_service(SCRIPTED_SERVICE, path, keys[1], cwd=tmp_path)
    assert report["applied"] == [f"<model>: {backend}"] and report["fallback_calls"] == 0, report
    assert report["keys"] == ["logits", "pooled"] and report["diff"] < 1e-4, report


class Named(Tagger):
    def forward(self, ids: torch.Tensor) -> dict[str, torch.Tensor]:       # type: ignore[override]
        logits, pooled = super().forward(ids)
        return {"logits": logits, "pooled": pooled}


def test_a_torchscript_model_returning_a_dict_runs_on_a_runtime(tmp_path, keys):
    """A Hugging Face model traced with ``strict=False`` returns its outputs by name: the TorchScript
    exporter has no ONNX for the dict ("Exporting the operator 'prim::DictConstruct' ... is not
    supported"), so no runtime candidate of such a ``torch.jit.load``-ed model was built. It is
    traced inside the output flattening, which reads the dict, and the loaded build returns one."""
    from cuvil_pgc import load_build

    torch.manual_seed(0)
    ids = torch.randint(0, 500, (2, 16))
    torch.jit.save(torch.jit.trace(Named().eval(), (ids,), strict=False), str(tmp_path / "named.pt"))
    model = torch.jit.load(str(tmp_path / "named.pt")).eval()
    build = recompile(model, (ids,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    path = build.save(tmp_path / "named.cuvilpkg", signing_key=str(keys[0]))
    fast = load_build(path, torch.jit.load(str(tmp_path / "named.pt")).eval(), pubkey=str(keys[1]))
    with torch.no_grad():
        fast(ids)                  # (the first call learns the outputs' structure from the original module)
        out, ref = fast(ids), model(ids)
    assert fast.cuvil_load_report.applied == ["<model>: ort"] and fast.fallback_calls == 0
    assert list(out) == ["logits", "pooled"]
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_the_export_leaves_the_user_s_torchscript_model_as_it_was(tmp_path, keys, saved):
    """The TorchScript exporter inlines calls in the graphs it is given, in place: exporting the
    user's ``torch.jit.load``-ed model itself rewrote its code, so its structural hash changed, and
    the build loaded onto that same model in the same process ran it eagerly ("module changed
    since the build"). The export runs on a private copy: the model's code stays as it was, and the
    build applies to the model it was made from."""
    from cuvil_pgc import load_build

    model = torch.jit.load(str(saved)).eval()
    ids = torch.randint(0, 500, (2, 16))
    code = model.code
    build = recompile(model, (ids,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    assert model.code == code
    path = build.save(tmp_path / "tagger.cuvilpkg", signing_key=str(keys[0]))
    fast = load_build(path, model, pubkey=str(keys[1]))
    assert fast.cuvil_load_report.applied == ["<model>: ort"] and not fast.cuvil_load_report.skipped


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["loaded", "calls_a_scripted_block"])
def test_a_torchscript_model_built_for_other_sizes_serves_them_on_its_program(tmp_path, saved, monkeypatch, kind):
    """``--dynamic`` exported the program for other sizes with the dynamo exporter alone, which
    refuses TorchScript: a ``torch.jit.load``-ed model, and an eager one calling a scripted block,
    ran every call at another batch on the original module ("its program for other sizes was left
    out: torch.onnx.export failed"). The TorchScript exporter now names each input dimension a
    size of its own, and the probes find which vary: the batch and the length do, together."""
    if kind == "loaded":
        model, inputs = torch.jit.load(str(saved)).eval(), (torch.randint(0, 500, (2, 16)),)
        other = (torch.randint(0, 500, (5, 9)),)
    else:
        (tmp_path / "scripted_model.py").write_text(SCRIPTED_INSIDE)
        monkeypatch.syspath_prepend(str(tmp_path))
        from scripted_model import make

        model, inputs = make()
        other = (torch.randn(3, 16),)
    build = recompile(model, inputs, plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3,
                      dynamic=True)
    choice, = build.plan.choices
    assert choice.other_sizes_refused is None and choice.other_shapes, choice.other_sizes_refused
    fast = build.module
    with torch.no_grad():
        got, want = fast(*other), model(*other)
    for g, w in zip(got.values() if isinstance(got, dict) else got, want.values() if isinstance(want, dict) else want,
                    strict=True):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert (fast.other_shape_calls, fast.fallback_calls) == (1, 0)
