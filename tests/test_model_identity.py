"""A model's identity is what its code is, not the name its module was imported under (issue 22).

``recompile --model pkg/file.py:factory`` and a service doing ``from pkg.file import Model`` must
see the same structural hash; a real change (forward source, shapes, dtypes) must still show.
"""

from __future__ import annotations

import importlib.util
import sys
import textwrap

import pytest

from cuvil_pgc._modelspec import load_model_spec
from cuvil_pgc._structure import structural_hash

SOURCE = textwrap.dedent('''
    import torch
    from torch import nn


    class Ranker(nn.Module):
        def __init__(self, hidden=16):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, hidden), nn.Linear(hidden, 4)

        def forward(self, x):
            return self.fc2(torch.relu(self.fc1(x)))


    def factory():
        torch.manual_seed(0)
        return Ranker().eval(), (torch.randn(2, 8),)
''')


def _load_as(name: str, path) -> object:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def clean_imports(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        sys.modules.pop(name, None)


def test_the_hash_does_not_depend_on_the_module_name(tmp_path):
    path = tmp_path / "models.py"
    path.write_text(SOURCE)
    a = _load_as("_cuvil_model_models", path).factory()[0]
    b = _load_as("shop.ranker", path).factory()[0]
    assert type(a).__module__ != type(b).__module__
    assert structural_hash(a) == structural_hash(b)


def test_a_class_written_under_a_main_guard_is_the_same_code(tmp_path):
    """A script defining the model under ``if __name__ == "__main__":`` recompiles it; the service
    imports the same class from its package."""
    guarded = SOURCE.split("\n\n\ndef factory")[0].replace("\n", "\n    ").replace(
        "    import torch", 'if __name__ == "guarded_m":\n    import torch', 1)
    a = _load_as("guarded_m", _write(tmp_path / "guarded.py", guarded)).Ranker()
    b = _load_as("plain_m", _write(tmp_path / "plain.py", SOURCE)).Ranker()
    assert structural_hash(a) == structural_hash(b)


def test_hashes_of_unchanged_code_are_those_of_earlier_versions():
    """Builds and traces made before the hash learned the forward's callees still match models
    whose forwards call no function of the user's: the forward's text is hashed as it was, for a
    ModuleList too (its forward is a module-level function of torch's, written at column 0)."""
    import inspect

    from torch import nn

    from cuvil_pgc._structure import _forward_source

    for module in (nn.ModuleList([nn.ReLU()]), nn.Sequential(nn.Linear(4, 4)), nn.Linear(4, 4)):
        assert _forward_source(module) == inspect.getsource(type(module).forward)


def test_real_changes_still_change_the_hash(tmp_path):
    base = _load_as("base_m", _write(tmp_path / "base.py", SOURCE)).factory()[0]
    edited = _load_as("edited_m", _write(tmp_path / "edited.py", SOURCE.replace("torch.relu", "torch.tanh")))
    assert structural_hash(edited.factory()[0]) != structural_hash(base)            # another forward
    assert structural_hash(type(base)(hidden=32)) != structural_hash(base)          # other shapes
    assert structural_hash(base.double()) != structural_hash(type(base)())          # other dtypes
    renamed = _load_as("renamed_m", _write(tmp_path / "renamed.py", SOURCE.replace("Ranker", "Scorer")))
    assert structural_hash(renamed.factory()[0]) != structural_hash(type(base)())   # another class


def _write(path, text):
    path.write_text(text)
    return path


def test_a_file_in_a_package_is_imported_under_its_dotted_name(tmp_path, clean_imports):
    package = tmp_path / "shop_ident"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "ranker.py").write_text(SOURCE)
    model, _ = load_model_spec(f"{package / 'ranker.py'}:factory")
    assert type(model).__module__ == "shop_ident.ranker"
    import shop_ident.ranker  # what a service does: the same module object

    assert type(model) is shop_ident.ranker.Ranker


def test_a_lone_file_is_imported_under_its_stem_unless_that_name_is_taken(tmp_path, clean_imports):
    (tmp_path / "lone_ident.py").write_text(SOURCE)
    model, _ = load_model_spec(f"{tmp_path / 'lone_ident.py'}:factory")
    assert type(model).__module__ == "lone_ident"
    (tmp_path / "json.py").write_text(SOURCE)                # a name already imported from elsewhere
    model, _ = load_model_spec(f"{tmp_path / 'json.py'}:factory")
    assert type(model).__module__ == "_cuvil_model_json" and "Ranker" not in dir(sys.modules["json"])


HELPERS = textwrap.dedent('''
    import torch
    from torch import nn


    def act(x):
        return torch.relu(x)


    class Ranker(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(8, 16), nn.Linear(16, 4)

        def head(self, h):
            return self.fc2(h)

        def forward(self, x):
            return self.head(act(self.fc1(x)))
''')


def test_a_changed_function_or_method_the_forward_calls_changes_the_hash(tmp_path):
    """The forward's text alone is not the model's code: an ONNX or AOTInductor build of the old
    helper returned the old numbers, silently, for a model whose forward text was unchanged."""
    def ranker(name, source):
        return _load_as(name, _write(tmp_path / f"{name}.py", source)).Ranker()

    base = structural_hash(ranker("helpers_a", HELPERS))
    assert structural_hash(ranker("helpers_b", HELPERS)) == base                    # same code, another module
    assert structural_hash(ranker("helper_edit", HELPERS.replace("torch.relu(x)", "torch.tanh(x)"))) != base
    assert structural_hash(ranker("method_edit", HELPERS.replace("self.fc2(h)", "self.fc2(h) * 2"))) != base
    # a script's unrelated global named like an attribute the forward reads (``self.head``) is not its code
    unrelated = HELPERS + "\n\ndef head(request):\n    return request.headers\n"
    assert structural_hash(ranker("script_globals", unrelated)) == base


def test_a_changed_function_of_another_module_the_forward_calls_changes_the_hash(tmp_path, clean_imports):
    sys.path.insert(0, str(tmp_path))
    uses = HELPERS.replace("import torch\n", "import torch\nimport user_layers\n").replace(
        "self.head(act(", "self.head(user_layers.act(")
    _write(tmp_path / "user_layers.py", "import torch\n\n\ndef act(x):\n    return torch.relu(x)\n")
    base = structural_hash(_load_as("uses_layers", _write(tmp_path / "uses_layers.py", uses)).Ranker())
    _write(tmp_path / "user_layers.py", "import torch\n\n\ndef act(x):\n    return torch.nn.functional.gelu(x)\n")
    sys.modules.pop("user_layers")
    assert structural_hash(_load_as("uses_layers_2", tmp_path / "uses_layers.py").Ranker()) != base


CHILD_HELPER = textwrap.dedent('''
    import torch
    from torch import nn


    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)

        def helper(self, x):
            return self.scale(self.fc(x))

        def scale(self, h):
            return h * 2

        def forward(self, x):
            return self.fc(x)


    class Ranker(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = Block()

        def forward(self, x):
            return self.block.helper(x) + self.block.fc.weight.sum()
''')


def test_a_changed_method_the_forward_calls_on_a_child_module_changes_the_hash(tmp_path):
    """``self.block.helper(x)`` runs the child's helper as the parent's code: the child's own
    forward is hashed with the child, but not the helper (nor what the helper calls)."""
    def ranker(name, source):
        return _load_as(name, _write(tmp_path / f"{name}.py", source)).Ranker()

    base = structural_hash(ranker("child_a", CHILD_HELPER))
    assert structural_hash(ranker("child_b", CHILD_HELPER)) == base                 # same code, another module
    assert structural_hash(ranker("child_helper_edit", CHILD_HELPER.replace(
        "return self.scale(self.fc(x))", "return self.scale(self.fc(x) + 1)"))) != base
    assert structural_hash(ranker("child_callee_edit", CHILD_HELPER.replace("h * 2", "h * 3"))) != base
