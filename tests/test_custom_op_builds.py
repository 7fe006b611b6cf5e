"""Models calling a Python custom operator (``torch.library.custom_op``): an AOTInductor package
calls it through torch's dispatcher, so a process loading the package needs the operator defined.
The search's worker processes define it as a service does, by importing the module that defined it;
a service that loads the build first is told which operator to define, not to rebuild."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile import aoti_loader
from cuvil_pgc.recompile.candidates import Candidate

OPS = textwrap.dedent('''
    import torch

    @torch.library.custom_op("cuviltest_ops::soft_clip", mutates_args=())
    def soft_clip(x: torch.Tensor, limit: float) -> torch.Tensor:
        return limit * torch.tanh(x / limit)

    @soft_clip.register_fake
    def _(x, limit):
        return torch.empty_like(x)
''')

MODEL = textwrap.dedent('''
    import torch
    from torch import nn

    class Clipped(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

        def forward(self, x):
            from cuviltest_clip_ops import soft_clip      # the kernels load on first use
            return self.b(soft_clip(self.a(x), 2.0))

    def factory():
        torch.manual_seed(0)
        return Clipped().eval(), (torch.randn(3, 16),)
''')

SERVICE = textwrap.dedent('''
    import sys
    import torch
    sys.path.insert(0, sys.argv[1])
    if sys.argv[3] == "define":
        import cuviltest_clip_ops            # noqa: F401  the service imports its kernels first
    from cuviltest_clip_model import factory
    from cuvil_pgc import load_build
    from cuvil_pgc.errors import BuildError
    model, inputs = factory()
    try:
        built = load_build(sys.argv[2], model, pubkey=sys.argv[4])
    except BuildError as exc:
        print("REFUSED", exc)
        sys.exit(0)
    with torch.no_grad():
        print("RAN", built.fallback_calls, float((built(*inputs) - model(*inputs)).abs().max()))
''')


def fresh_worker_failures(model, inputs) -> dict[str, str]:
    """What the search's worker check says of ``model``'s AOTInductor plan: a process that did not
    build it loads it and answers ``inputs`` as this one does (empty: it does)."""
    from cuvil_pgc.recompile.apply import ScopeInputs, realize
    from cuvil_pgc.recompile.standalone import fresh_process_failures, standalone_spec

    cand = Candidate("", "aoti")
    realized = realize(model, cand, ScopeInputs(inputs))
    with torch.no_grad():
        reference = model(*inputs)
    spec = standalone_spec(cand, realized, ScopeInputs(inputs), "cpu", check=True)
    return fresh_process_failures({"aoti": spec}, {"aoti": inputs}, {"aoti": reference})


@pytest.fixture
def clip_model(tmp_path):
    """The model's factory, its module imported from files in ``tmp_path`` as a service imports
    them (the operator's module only once the model is called)."""
    (tmp_path / "cuviltest_clip_ops.py").write_text(OPS)
    (tmp_path / "cuviltest_clip_model.py").write_text(MODEL)
    from cuvil_pgc._modelspec import import_file

    module = import_file(str(tmp_path / "cuviltest_clip_model.py"), "cuviltest_clip_model.py")
    model, inputs = module.factory()
    with torch.no_grad():
        model(*inputs)           # defines the operator in this process, as the profiled run did
    return model, inputs


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_an_aoti_build_calling_a_custom_operator_loads_where_the_operator_is_defined(clip_model, tmp_path, keys):
    from cuvil_pgc.recompile.build import recompile
    from cuvil_pgc.recompile.standalone import custom_op_modules

    model, inputs = clip_model
    assert ["cuviltest_clip_ops", str(tmp_path / "cuviltest_clip_ops.py")] in custom_op_modules()
    # the search's check that the plan loads in a process that did not build it (it failed on the
    # operator's schema, and the 1.5x plan was refused as unloadable)
    assert fresh_worker_failures(model, inputs) == {}

    build = recompile(model, inputs, plan={"": Candidate("", "aoti")}, records=False, deployed_race=False, rounds=3)
    assert [c.candidate.backend for c in build.plan.choices] == ["aoti"]
    path = build.save(tmp_path / "clip.cuvilpkg", signing_key=str(keys[0]))
    service = tmp_path / "service.py"
    service.write_text(SERVICE)

    def serve(how: str) -> str:
        proc = subprocess.run([sys.executable, str(service), str(tmp_path), str(path), how, str(keys[1])],
                              capture_output=True, text=True, timeout=300, env=dict(os.environ))
        assert proc.returncode == 0, proc.stderr[-2000:]
        return proc.stdout.strip().splitlines()[-1]

    ran = serve("define")
    assert ran.startswith("RAN 0 ") and float(ran.split()[-1]) < 1e-5, ran
    refused = serve("load first")       # the kernels not imported yet: told which operator, not to rebuild
    assert refused.startswith(f"REFUSED {path}: ") and "cuviltest_ops::soft_clip" in refused, refused
    assert "torch.library.custom_op" in refused and "rebuild" not in refused, refused


def test_a_package_loader_missing_an_operator_raises_a_build_error_naming_it(monkeypatch):
    """torch's loader raises a RuntimeError whose first line names the operator; the fix is in
    the user's process, so it becomes a BuildError saying what to import."""
    class Loader:
        def __init__(self, *args):
            raise RuntimeError("Could not find schema for mylib::soft_clip. Custom operators created via "
                               "torch.library.custom_op cannot be run via AOTI without Python environment.")

    monkeypatch.setattr(aoti_loader, "_direct_parts", lambda: (Loader, None))
    with pytest.raises(BuildError, match=r"custom operator mylib::soft_clip, which this process has not defined"):
        aoti_loader.load_aoti_package("model.pt2")

    class Broken:
        def __init__(self, *args):
            raise RuntimeError("PytorchStreamReader failed reading zip archive")

    monkeypatch.setattr(aoti_loader, "_direct_parts", lambda: (Broken, None))
    with pytest.raises(RuntimeError, match="zip archive"):          # any other failure stays as it was
        aoti_loader.load_aoti_package("model.pt2")


def test_an_aoti_worker_loads_the_operator_libraries_the_searching_process_loaded(tmp_path, monkeypatch):
    """A service's C++ kernels (``TORCH_LIBRARY``, loaded with ``torch.ops.load_library``) are called
    by an AOTInductor package as Python custom operators are: its worker loads them first."""
    import json

    from cuvil_pgc.recompile import standalone

    library = tmp_path / "libkernels.so"
    library.write_bytes(b"")
    monkeypatch.setattr(torch.ops, "loaded_libraries", {str(library)})
    for backend, expected in (("aoti", [str(library)]), ("ort", [])):
        path = standalone._write_spec(str(tmp_path / f"{backend}.json"), {"candidate": {"backend": backend}},
                                      "plan", "inputs.pt", torch.zeros(1))
        assert json.loads(open(path).read())["op_libraries"] == expected

    loaded = []

    def load_library(path):
        loaded.append(path)
        raise OSError("undefined symbol")          # a library that fails to load is left out

    monkeypatch.setattr(torch.ops, "load_library", load_library)
    standalone.load_op_libraries([str(library), str(tmp_path / "gone.so")])
    assert loaded == [str(library)]


LIBRARY_OPS = textwrap.dedent('''
    import torch

    lib = torch.library.Library("cuviltest_legacy", "DEF")
    lib.define("clip3(Tensor x) -> Tensor")
    lib.impl("clip3", lambda x: 3.0 * torch.tanh(x / 3.0), "CPU")
    lib.impl("clip3", lambda x: torch.empty_like(x), "Meta")
''')

DEFINED_OPS = textwrap.dedent('''
    import torch

    torch.library.define("cuviltest_defined::twice", "(Tensor x) -> Tensor")

    @torch.library.impl("cuviltest_defined::twice", "cpu")
    def twice(x):
        return x * 2

    @torch.library.register_fake("cuviltest_defined::twice")
    def _(x):
        return torch.empty_like(x)
''')


@pytest.mark.slow
@pytest.mark.usefixtures("build_env")
def test_an_aoti_worker_defines_operators_made_with_a_library_or_torch_library_define(tmp_path):
    """Older kernels libraries define operators with ``torch.library.Library("ns", "DEF")`` or
    ``torch.library.define`` + ``register_fake``, which torch records by the file that made them,
    not in ``custom_op``'s table: their AOTInductor plan (1.7x over eager) was refused as one no fresh
    process loads, because the worker had not imported that file."""
    from cuvil_pgc._modelspec import import_file
    from cuvil_pgc.recompile.standalone import custom_op_modules

    for name, source in (("cuviltest_library_ops", LIBRARY_OPS), ("cuviltest_defined_ops", DEFINED_OPS)):
        (tmp_path / f"{name}.py").write_text(source)
        import_file(str(tmp_path / f"{name}.py"), f"{name}.py")
        assert [name, str(tmp_path / f"{name}.py")] in custom_op_modules()

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(16, 8)

        def forward(self, x):
            return torch.ops.cuviltest_defined.twice(torch.ops.cuviltest_legacy.clip3(self.a(x)))

    torch.manual_seed(0)
    model, inputs = Net().eval(), (torch.randn(3, 16),)
    assert fresh_worker_failures(model, inputs) == {}
