"""Structural hash of an nn.Module: what a profile region and a model must share to match.

(And :func:`weights_digest` and :func:`settings_digest`, its counterparts over the weight values
and the attribute values, for compiled artifacts that embed them.)

Recorded by ``instrument_module`` on every region (a 16-hex-digit prefix, ``args.structure``),
copied into the analysis evidence, and compared by the recompiler (recompile.matching) so that a
profile of a slightly different model version applies to the unchanged regions only. It lives
here, outside both stages, because instrument (upstream) and recompile (downstream) both need it.

A module's identity is what its code is, not where it was imported from: the class's
``__qualname__`` and forward source (with the sources of the methods and module-level functions
the forward calls by name, transitively, and of the methods it calls on a child module, as in
``self.block.helper(x)``: a build of ``forward: return self.head(act(x))`` must not run once ``act``
or ``head`` changed), and its parameter and buffer names, shapes and dtypes. The
module name is left out on purpose: ``recompile --model models.py:build`` imports the file under
one name and a service doing ``from shop.models import Ranker`` under another, and a build must
apply to both (issue 22). ``STRUCTURE_VERSION`` is hashed in, so hashes of another definition never
collide with these.
"""

from __future__ import annotations

import contextlib
import dis
import hashlib
import inspect
import textwrap
import types
from collections.abc import Iterable, Iterator
from typing import Any

SHORT = 16      # hex digits recorded per region: 64 bits, enough to tell module versions apart
STRUCTURE_VERSION = 2    # 2: the class's __qualname__ without __module__ (1 hashed the import name too)


def structural_hash(module: Any) -> str:
    """sha256 of the module's structure: class names, forward sources, parameter/buffer shapes and dtypes.

    Independent of the name the module's file was imported under (see the module docstring).
    """
    h = hashlib.sha256(f"cuvil-structure {STRUCTURE_VERSION}\n".encode())
    for name, sub in module.named_modules(remove_duplicate=False):
        h.update(f"M {name} {class_name(sub)}\n".encode())
        h.update(_forward_source(sub).encode())
        for pname, p in sub.named_parameters(recurse=False):
            h.update(f"P {pname} {tuple(p.shape)} {p.dtype}\n".encode())
        for bname, b in sub.named_buffers(recurse=False):
            h.update(f"B {bname} {tuple(b.shape)} {b.dtype}\n".encode())
    return h.hexdigest()


def module_tree_digest(module: Any) -> str:
    """sha256 of the module tree alone: each submodule's name and class ``__qualname__``.

    Coarser than :func:`structural_hash` on purpose. An edited forward, changed shapes or new
    weights keep the tree (an earlier version of the same model: its changed regions run eagerly),
    while another architecture that merely shares the class name (``Model``, ``Net``) changes it, so
    a build made for it is refused instead of timing the eager model against itself (issue 22).
    """
    h = hashlib.sha256(b"cuvil-module-tree 1\n")
    for name, sub in module.named_modules(remove_duplicate=False):
        h.update(f"M {name} {class_name(sub)}\n".encode())
    return h.hexdigest()


def class_name(module: Any) -> str:
    """The class ``__qualname__`` of ``module``; for a TorchScript module (whose class is always
    ``RecursiveScriptModule``) the scripted class's name, marked as scripted."""
    original = _script_name(module)
    return type(module).__qualname__ if original is None else f"script:{original}"


def weights_digest(module: Any) -> str:
    """sha256 of the values of the module's parameters and buffers (names, dtypes, shapes, bytes).

    What the structural hash leaves out on purpose: an AOTInductor package bakes the weights in, so
    two modules of one structure (``layers.0`` and ``layers.1``, or a model before and after
    fine-tuning) need different packages.
    """
    h = hashlib.sha256()
    for kind, named in (("P", module.named_parameters()), ("B", module.named_buffers())):
        for name, t in named:
            h.update(f"{kind} {name} {tuple(t.shape)} {t.dtype}\n".encode())
            h.update(_tensor_bytes(t))
    return h.hexdigest()


def _tensor_bytes(t: Any) -> bytes:
    """A tensor's values as raw bytes (on the CPU, contiguous); a sparse tensor's, those of its
    parts (:func:`strided_parts`)."""
    import torch

    if t.layout is not torch.strided:
        return b"".join(_tensor_bytes(part) for part in strided_parts(t))
    data = t.detach().to("cpu").contiguous()
    return data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b""


def strided_parts(t: Any) -> list[Any]:
    """The dense tensors that hold ``t``'s values: ``[t]`` for a strided tensor; a sparse one's
    indices and values (COO coalesced; CSR, CSC, BSR and BSC by their compressed and plain
    indices), which value reads (``bytes``, ``torch.equal``) cannot take whole: a GCN holding its
    adjacency as a sparse buffer failed recompile's first check with "Could not run 'aten::equal'
    with arguments from the 'SparseCPU' backend"."""
    import torch

    t = t.detach()
    if t.layout is torch.strided:
        return [t]
    if t.layout is torch.sparse_coo:
        t = t.coalesce()
        return [t.indices(), t.values()]
    if t.layout in (torch.sparse_csr, torch.sparse_bsr):
        return [t.crow_indices(), t.col_indices(), t.values()]
    return [t.ccol_indices(), t.row_indices(), t.values()]      # sparse_csc, sparse_bsc


def settings_digest(module: Any, skip: Iterable[str] = ()) -> str:
    """sha256 of the module tree's settings: each submodule's plain attribute values (numbers,
    flags, strings, dtypes, tuples and dicts of them, a Hugging Face config's fields, small tensor
    constants), which neither the structural hash nor the weights cover; ``skip``: attributes left
    out, as ``submodule.name`` paths from ``module`` (those its forward writes, see
    :func:`recorded_writes`).

    What an exported program bakes in besides the weights: a ``temperature``, ``need_weights``, a
    LayerNorm's ``eps``, a convolution's stride, ``config.use_return_dict``. A build made with one
    value must not run a model with another (it would return the other model's numbers). Private
    attributes (``_parameters``, hooks, caches) and ``training`` are left out, and so are where and
    by which version a model or config was loaded (``name_or_path``, ``_name_or_path``): a service
    loads the same checkpoint from another directory. So are the tensors a dict attribute holds: a
    cache that the forward fills from the weights, which a model's own state (parameters and
    buffers) does not hold (timm's LeViT keeps its attention biases per device in one, empty on a
    fresh model and after ``eval()``: a service that called its model once before loading the build
    ran every region eagerly, "settings changed since the build").
    """
    h = hashlib.sha256(b"cuvil-settings 1\n")
    for name, key, value in _settings(module, skip):
        h.update(f"S {name} {key} {_setting(value)}\n".encode())
    return h.hexdigest()


def _settings(module: Any, skip: Iterable[str]) -> Iterator[tuple[str, str, Any]]:
    """(submodule path, attribute, value) of each setting :func:`settings_digest` covers, in order."""
    skipped = frozenset(skip)
    for name, sub in module.named_modules(remove_duplicate=False):
        for key, value in sorted(vars(sub).items()):
            if not key.startswith(_SKIP) and key != "training" and f"{name}.{key}".lstrip(".") not in skipped:
                yield name, key, value


def settings_by_name(module: Any, skip: Iterable[str] = ()) -> dict[str, str]:
    """The settings :func:`settings_digest` covers, grouped by attribute name (a Hugging Face
    config's fields each as ``config.<field>``), each group as a short digest over every
    submodule's value: what a build records so that a load whose settings differ can name which
    (a few hundred bytes where one entry per submodule would be thousands of lines)."""
    groups: dict[str, Any] = {}

    def add(key: str, line: str) -> None:
        groups.setdefault(key, hashlib.sha256()).update(line.encode())
    for name, key, value in _settings(module, skip):
        fields = _config_fields(value)
        if fields is None:
            add(key, f"{name} {_setting(value)}\n")
        else:
            for field, inner in fields.items():
                if not (isinstance(field, str) and field.startswith(_SKIP)):
                    add(f"{key}.{field}", f"{name} {_setting(inner)}\n")
    return {key: h.hexdigest()[:12] for key, h in sorted(groups.items())}


def changed_settings(built: dict[str, str], now: dict[str, str]) -> list[str]:
    """The names whose settings differ between two :func:`settings_by_name` (added or gone ones too)."""
    return sorted(k for k in set(built) | set(now) if built.get(k) != now.get(k))


def _config_fields(value: Any) -> dict[str, Any] | None:
    """A Hugging Face config's fields (``to_dict()``), or None where ``value`` is none."""
    to_dict = getattr(value, "to_dict", None)
    if not callable(to_dict) or isinstance(value, type):
        return None
    try:
        fields = to_dict()
    except Exception:
        return None
    return fields if isinstance(fields, dict) else None


def written_under(written: Iterable[str], scope: str) -> list[str]:
    """The paths of ``written`` inside the submodule ``scope`` ("" the whole model), from it."""
    if not scope:
        return sorted(written)
    return sorted(w[len(scope) + 1:] for w in written if w.startswith(scope + "."))


@contextlib.contextmanager
def recorded_writes(module: Any) -> Iterator[set[str]]:
    """The attributes of ``module``'s tree that code inside assigns (``submodule.name`` paths from
    ``module``), whatever the value. A forward that keeps a call's scratch values on a submodule
    (Funnel's attention structure sets ``seq_len`` and ``pooling_mult`` on each call) changes no
    setting: a digest taken after a call differed from one taken on a fresh model, and every load
    of the build ran the model eagerly, "settings changed since the build"."""
    import torch

    paths = {id(sub): name for name, sub in module.named_modules(remove_duplicate=False)}
    written: set[str] = set()
    assign = torch.nn.Module.__setattr__

    def recording(self: Any, name: str, value: Any) -> None:
        where = paths.get(id(self))
        if where is not None and not name.startswith(_SKIP):
            written.add(f"{where}.{name}".lstrip("."))
        assign(self, name, value)

    torch.nn.Module.__setattr__ = recording      # type: ignore[method-assign]
    try:
        yield written
    finally:
        torch.nn.Module.__setattr__ = assign     # type: ignore[method-assign]


#: attribute and config field names left out: private ones, where and by which version a model was loaded,
#: and cuvil-pgc's own (``cuvil_load_report``, which a loaded decoding step's model carries: loading its build
#: again found "settings changed since the build")
_SKIP = ("_", "name_or_path", "transformers_version", "cuvil_")


def _setting(value: Any, depth: int = 0) -> str:
    """A stable text for one attribute value (see :func:`settings_digest`)."""
    import enum

    import torch

    if value is None or isinstance(value, (bool, int, float, complex, str, bytes, enum.Enum, torch.dtype,
                                           torch.device)):
        return repr(value)
    if depth > 4:
        return type(value).__qualname__
    if isinstance(value, (tuple, list)):
        if len(value) > 256:
            return f"{type(value).__name__}[{len(value)}] {hashlib.sha256(repr(value).encode()).hexdigest()[:16]}"
        return f"{type(value).__name__}(" + ", ".join(_setting(v, depth + 1) for v in value) + ")"
    if isinstance(value, dict):     # its tensors are a cache its forward fills (see settings_digest)
        return "{" + ", ".join(f"{k!r}: {_setting(v, depth + 1)}" for k, v in sorted(value.items(), key=lambda kv: repr(kv[0]))
                               if not (isinstance(k, str) and k.startswith(_SKIP)) and not isinstance(v, torch.Tensor)) + "}"
    if isinstance(value, torch.Tensor):
        if value.numel() > 4096 or value.device.type == "meta":
            return f"tensor{tuple(value.shape)} {value.dtype}"
        return f"tensor{tuple(value.shape)} {value.dtype} {hashlib.sha256(_tensor_bytes(value)).hexdigest()[:16]}"
    fields = _config_fields(value)
    if fields is not None:                                     # a Hugging Face PretrainedConfig
        return f"{type(value).__qualname__}{_setting(fields, depth + 1)}"
    if callable(value):
        return getattr(value, "__qualname__", type(value).__qualname__)
    return type(value).__qualname__


_SOURCES: dict[type, tuple[str, tuple[tuple[str, str], ...]]] = {}
_CHILD_SOURCES: dict[tuple[type, str, type, str], str] = {}


def _forward_source(module: Any) -> str:
    """The source of the module's forward: its class's Python source (with the code it calls, see
    the module docstring), or for a TorchScript module the compiled code of its forward (reading
    ``forward`` on its class raises)."""
    scripted = _script_name(module)
    if scripted is not None:
        try:
            return str(module.code)
        except Exception:        # a scripted module without a forward (only other methods)
            return f"script:{scripted}.forward"
    cls = type(module)
    if cls not in _SOURCES:
        try:
            source = _as_method(inspect.getsource(cls.forward))
        except (OSError, TypeError, AttributeError):
            source = f"{cls.__qualname__}.forward"     # no source (a C extension's class)
        forward = getattr(cls, "forward", None)
        found, chains = _called_sources([forward] if isinstance(forward, types.FunctionType) else [], cls)
        _SOURCES[cls] = (source + "".join(f"C {name}\n{text}" for name, text in found), tuple(chains))
    source, chains = _SOURCES[cls]
    return source + "".join(_child_method_source(module, child, method) for child, method in chains)


def _child_method_source(module: Any, child: str, method: str) -> str:
    """The source of ``self.<child>.<method>`` (and what it calls) where ``child`` is a submodule of
    the user's code: its forward is hashed as that submodule's, but a helper method the parent calls
    on it is the parent's code too. Cached per (class, child, child's class, method)."""
    sub = getattr(module, "_modules", {}).get(child)
    key = (type(module), child, type(sub), method)
    if key not in _CHILD_SOURCES:
        target = getattr(type(sub), method, None) if sub is not None else None
        text = ""
        if isinstance(target, types.FunctionType) and method != "forward" and not _is_framework(target):
            found, _ = _called_sources([target], type(sub))
            text = f"C self.{child}.{method}\n{_source_text(target)}" + "".join(
                f"C {name}\n{body}" for name, body in found)
        _CHILD_SOURCES[key] = text
    return _CHILD_SOURCES[key]


def _as_method(source: str) -> str:
    """A method's source indented as in a class at the top of a module (4 spaces): the same class
    written under ``if __name__ == "__main__":`` in a script is the same code."""
    indent = len(source) - len(source.lstrip(" \t"))
    if indent in (0, 4):     # a class's method, or a module-level function used as one (ModuleList's)
        return source
    return textwrap.indent(textwrap.dedent(source), "    ")


#: how far and how wide :func:`_called_sources` follows calls; the packages whose code is the
#: framework (pinned by the build's torch version), not the model's
_CALL_DEPTH, _CALL_LIMIT, _FRAMEWORK = 4, 64, ("torch", "builtins")


def _called_sources(start: list[Any], cls: type) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(name, dedented source) of each Python function the functions ``start`` (methods of ``cls``)
    call by name: a global function, a method through ``self``, a function through a module of the
    user's it names (``layers.act(x)``), and those they call in turn (breadth-first, bounded); and
    the ``self.<child>.<method>`` calls among them, which need the instance to resolve. Identical
    code gives identical text wherever the class was defined (``__main__`` of a script or a package)."""
    seen: set[int] = {id(inspect.unwrap(fn)) for fn in start}
    frontier, found, chains = [inspect.unwrap(fn) for fn in start], [], []
    for _ in range(_CALL_DEPTH):
        following = []
        for fn in frontier:
            callees, fn_chains = _callees(fn, cls)
            chains += [c for c in fn_chains if c not in chains]
            for name, target in callees:
                target = inspect.unwrap(target)
                if id(target) in seen or _is_framework(target):
                    continue
                seen.add(id(target))
                found.append((name, _source_text(target)))
                following.append(target)
                if len(found) >= _CALL_LIMIT:
                    return found, chains
        frontier = following
    return found, chains


def _is_framework(fn: Any) -> bool:
    return str(getattr(fn, "__module__", "")).split(".")[0] in _FRAMEWORK


def _source_text(fn: Any) -> str:
    try:
        return textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError):
        return fn.__qualname__


def _callees(fn: Any, cls: type) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
    """(name, Python function) for each global, ``self.<name>`` and ``<module>.<name>`` reference
    in ``fn``'s code (nested code included) that is a function, and (child, name) for each
    ``self.<child>.<name>``: read from the bytecode, so an attribute such as ``x.view`` never picks
    up a script's unrelated global ``view``."""
    out, chains = [], []
    for kind, owner, name in _references(fn.__code__):
        if kind == "chain":
            if getattr(cls, owner, None) is None:       # an instance attribute (a submodule), not a method
                chains.append((owner, name))
            continue
        if kind == "global":
            target = fn.__globals__.get(name)
        elif owner == "self":
            target = getattr(cls, name, None)
        else:
            module = fn.__globals__.get(owner)
            target = getattr(module, name, None) if isinstance(module, types.ModuleType) else None
        if isinstance(target, types.FunctionType):
            out.append((name if kind == "global" else f"{owner}.{name}", target))
    return out, chains


#: opcodes that load a local or a closure's variable (``self`` in a method, or in its comprehensions)
_LOAD_LOCAL = ("LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW", "LOAD_DEREF")


def _references(code: Any) -> list[tuple[str, str, str]]:
    """("global", "", name) for each global a code object (and the code nested in it) loads,
    ("attr", owner, name) for each attribute loaded straight off ``self`` or a global ``owner``, and
    ("chain", child, name) for each attribute loaded off ``self.<child>``."""
    refs, before, previous = [], None, None
    for ins in dis.get_instructions(code):
        if ins.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
            refs.append(("global", "", ins.argval))
        elif ins.opname in ("LOAD_ATTR", "LOAD_METHOD") and previous is not None:
            if _loads_self(previous):
                refs.append(("attr", "self", ins.argval))
            elif previous.opname in ("LOAD_GLOBAL", "LOAD_NAME"):
                refs.append(("attr", previous.argval, ins.argval))
            elif previous.opname in ("LOAD_ATTR", "LOAD_METHOD") and before is not None and _loads_self(before):
                refs.append(("chain", previous.argval, ins.argval))
        before, previous = previous, ins
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            refs += _references(const)
    return list(dict.fromkeys(refs))


def _loads_self(ins: Any) -> bool:
    return ins.opname in _LOAD_LOCAL and ins.argval == "self"


def _script_name(module: Any) -> str | None:
    """The scripted class's name of a TorchScript module, else None."""
    import torch

    if isinstance(module, torch.jit.ScriptModule):
        return str(getattr(module, "original_name", None) or type(module).__qualname__)
    return None
