"""The import rules of ARCHITECTURE.md, checked on the source (an AST walk; imports inside
functions count as much as those at the top of a module).

- A stage imports only the layers below it: foundation < trace < instrument < analyze < recompile
  < viewer < cli. Nothing imports the ``cuvil_pgc`` root package (it only re-exports).
- No import circles between modules.
- typer and rich stay in viewer and cli; trace, instrument, analyze, recompile and the
  foundation modules import neither (nor click).
- No private name crosses modules: no ``from m import _x`` of another module's ``_x``, no
  ``m._x`` on an imported module, no ``_private`` module imported from outside its package.
- No "import it if it exists": a cuvil_pgc module is never imported (``import`` or
  ``importlib.import_module("cuvil_pgc...")``) under ``except ImportError``.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "cuvil_pgc"

#: bottom to top; a module may import modules of its own layer and of the layers below
LAYERS = ("foundation", "trace", "instrument", "analyze", "recompile", "viewer", "cli")
STAGES = set(LAYERS) - {"foundation"}
#: layers that must not present anything on a terminal themselves
NO_PRESENTATION = ("foundation", "trace", "instrument", "analyze", "recompile")
PRESENTATION_LIBRARIES = ("typer", "rich", "click")
#: optional C extensions (setup.py): importing them under ``except ImportError`` is the point
OPTIONAL_MODULES = {"cuvil_pgc.instrument._fastregion", "cuvil_pgc.recompile._leancall"}


@dataclass(frozen=True)
class Edge:
    source: str         # importing module
    target: str         # imported cuvil_pgc module (or third-party top-level name)
    line: int
    top_level: bool     # at module level (not inside a function or class body)

    def __str__(self) -> str:
        return f"{self.source}:{self.line} imports {self.target}"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(root: Path) -> dict[str, Path]:
    return {_module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}


def _extensions(root: Path) -> set[str]:
    """Compiled or optional modules (``_fastregion.c``) that have no .py file."""
    return {_module_name(p.with_suffix(".py"), root) for p in (root / PACKAGE).rglob("*.c")}


def layer_of(module: str) -> str:
    """The layer of a cuvil_pgc module: its stage package, else foundation (top-level helpers,
    ``errors``, ``zoo``); ``cuvil_pgc`` itself and ``__main__`` stand above every layer."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] == "__main__":
        return "entry"
    return parts[1] if parts[1] in STAGES else "foundation"


def _is_package(module: str, modules: dict[str, Path]) -> bool:
    return modules[module].name == "__init__.py"


def _resolve(node: ast.ImportFrom, module: str, modules: dict[str, Path]) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".")
    if not _is_package(module, modules):
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, bool, bool]]:
    """Every node with (at module level?, inside a try whose handler catches ImportError?)."""
    def visit(node: ast.AST, top: bool, guarded: bool) -> Iterator[tuple[ast.AST, bool, bool]]:
        yield node, top, guarded
        if isinstance(node, ast.Try):
            catches = any(_catches_import_error(h) for h in node.handlers)
            for child in node.body:
                yield from visit(child, top, guarded or catches)
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                yield from visit(child, top, guarded)
            return
        inner = top and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner, guarded)
    return visit(tree, True, False)


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in ("ImportError", "ModuleNotFoundError") for k in kinds)


@dataclass
class Source:
    module: str
    tree: ast.Module
    edges: list[Edge]                  # imports of cuvil_pgc modules
    third_party: list[Edge]            # imports of other top-level packages
    guarded: list[Edge]                # cuvil_pgc imports under `except ImportError`
    private_names: list[str]           # cuvil_pgc private names taken from another module


def _scan(root: Path) -> dict[str, Source]:
    modules = _modules(root)
    known = set(modules) | _extensions(root)
    out = {}
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        out[module] = _scan_module(module, tree, modules, known)
    return out


def _scan_module(module: str, tree: ast.Module, modules: dict[str, Path], known: set[str]) -> Source:
    src = Source(module, tree, [], [], [], [])
    aliases: dict[str, str] = {}
    own_package = module if _is_package(module, modules) else module.rpartition(".")[0]
    for node, top, guarded in _walk(tree):
        targets: list[tuple[str, str | None]] = []      # (module imported, name bound)
        if isinstance(node, ast.Import):
            targets = [(a.name, a.asname) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node, module, modules)
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in known:                                   # a submodule
                    targets.append((full, a.asname or a.name))
                else:
                    targets.append((base, None))
                    if a.name.startswith("_") and not a.name.startswith("__") and base != module \
                            and base.startswith(PACKAGE):
                        src.private_names.append(f"{module}:{node.lineno} takes {base}.{a.name}")
        for target, bound in targets:
            edge = Edge(module, target, node.lineno, top)
            if target == PACKAGE or target.startswith(PACKAGE + "."):
                src.edges.append(edge)
                if guarded and target not in OPTIONAL_MODULES:
                    src.guarded.append(edge)
                if bound is not None:
                    aliases[bound] = target
                if not _private_module_allowed(target, own_package):
                    src.private_names.append(f"{module}:{node.lineno} imports private module {target}")
            else:
                src.third_party.append(Edge(module, target.split(".")[0], node.lineno, top))
    for node, top, guarded in _walk(tree):
        named = _imported_by_name(node)
        if guarded and named is not None and named not in OPTIONAL_MODULES:
            src.guarded.append(Edge(module, named, node.lineno, top))
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            target = aliases[node.value.id]
            name = f"{target}.{node.attr}"
            if node.attr.startswith("_") and not node.attr.startswith("__") and target != module \
                    and name not in known:
                src.private_names.append(f"{module}:{node.lineno} reads {name}")
    return src


def _imported_by_name(node: ast.AST) -> str | None:
    """The cuvil_pgc module of an ``importlib.import_module("cuvil_pgc...")`` call, else None."""
    if not (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)):
        return None
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    value = node.args[0].value
    if name == "import_module" and isinstance(value, str) and value.startswith(PACKAGE):
        return value
    return None


def _private_module_allowed(target: str, own_package: str) -> bool:
    """A module with a ``_private`` segment may be imported only from inside the package holding it."""
    parts = target.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            owner = ".".join(parts[:i])
            if not (own_package == owner or own_package.startswith(owner + ".")):
                return False
    return True


def upward_edges(sources: dict[str, Source]) -> list[str]:
    """Imports of a higher layer, of the root package, or of cli from a stage."""
    bad = []
    for src in sources.values():
        here = layer_of(src.module)
        if here == "entry":
            continue
        for e in src.edges:
            there = layer_of(e.target)
            if there == "entry" or LAYERS.index(there) > LAYERS.index(here):
                bad.append(f"{e} ({here} -> {there})")
    return bad


def import_cycles(sources: dict[str, Source], top_level_only: bool) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), or a module importing itself."""
    graph = {m: sorted({e.target for e in s.edges if e.target in sources and (e.top_level or not top_level_only)})
             for m, s in sources.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1 or v in graph[v]:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            connect(v)
    return cycles


def presentation_imports(sources: dict[str, Source]) -> list[str]:
    return [f"{e.source}:{e.line} imports {e.target}" for s in sources.values() if layer_of(s.module) in NO_PRESENTATION
            for e in s.third_party if e.target in PRESENTATION_LIBRARIES]


@pytest.fixture(scope="module")
def sources() -> dict[str, Source]:
    return _scan(ROOT)


def test_the_layers_are_known(sources):
    stages = {m.split(".")[1] for m in sources if len(m.split(".")) > 1 and (ROOT / PACKAGE / m.split(".")[1]).is_dir()}
    assert stages - {"zoo"} == STAGES, "a new package under cuvil_pgc/: give it a layer here and in ARCHITECTURE.md"


def test_no_stage_imports_a_later_stage_the_cli_or_the_root_package(sources):
    bad = upward_edges(sources)
    assert not bad, "imports against the layers of ARCHITECTURE.md:\n" + "\n".join(bad)


def test_no_import_circles_between_modules(sources):
    cycles = import_cycles(sources, top_level_only=False)
    assert not cycles, "modules that import each other:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_only_viewer_and_cli_import_typer_or_rich(sources):
    bad = presentation_imports(sources)
    assert not bad, "terminal presentation belongs in viewer/ and cli/:\n" + "\n".join(bad)


def test_no_private_name_crosses_modules(sources):
    bad = [p for s in sources.values() for p in s.private_names]
    assert not bad, "private names used outside their module (make them public or move the code):\n" + "\n".join(bad)


def test_no_cuvil_pgc_module_is_imported_only_if_it_exists(sources):
    bad = [str(e) for s in sources.values() for e in s.guarded]
    assert not bad, "cuvil_pgc modules always exist: import them plainly:\n" + "\n".join(bad)


def test_the_checks_catch_what_they_forbid(tmp_path):
    """Each rule fails on a small package that breaks it (so a passing run means something)."""
    pkg = tmp_path / PACKAGE
    for folder, files in {"": ["__init__", "errors", "_helper"], "trace": ["__init__", "reader"],
                          "analyze": ["__init__", "a", "b", "_private"], "cli": ["__init__"]}.items():
        (pkg / folder).mkdir(parents=True, exist_ok=True)
        for f in files:
            (pkg / folder / f"{f}.py").write_text("")
    (pkg / "trace" / "reader.py").write_text("import rich\n\ndef f():\n    from cuvil_pgc.analyze import a\n"
                                             "    from cuvil_pgc import load_trace\n")
    (pkg / "analyze" / "a.py").write_text("from cuvil_pgc.analyze import b\nfrom cuvil_pgc.analyze.b import _x\n")
    (pkg / "analyze" / "b.py").write_text("from cuvil_pgc.analyze import a\n_x = 1\n"
                                          "try:\n    from cuvil_pgc.cli import main\nexcept ImportError:\n    main = None\n"
                                          "try:\n    importlib.import_module('cuvil_pgc.trace.reader')\n"
                                          "except ModuleNotFoundError:\n    pass\n")
    (pkg / "cli" / "__init__.py").write_text("from cuvil_pgc.analyze import _private\n")
    scanned = _scan(tmp_path)
    assert len(upward_edges(scanned)) == 3          # trace -> analyze, trace -> root, analyze -> cli
    assert import_cycles(scanned, top_level_only=True) == [["cuvil_pgc.analyze.a", "cuvil_pgc.analyze.b"]]
    assert presentation_imports(scanned) == ["cuvil_pgc.trace.reader:1 imports rich"]
    assert len([p for s in scanned.values() for p in s.private_names]) == 2
    assert [str(e) for s in scanned.values() for e in s.guarded] == ["cuvil_pgc.analyze.b:4 imports cuvil_pgc.cli",
                                                                     "cuvil_pgc.analyze.b:8 imports cuvil_pgc.trace.reader"]
