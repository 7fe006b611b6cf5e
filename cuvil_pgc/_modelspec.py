"""Resolve ``MODULE:FACTORY`` references to ``(model, example_inputs)``.

MODULE is a dotted module name or a path to a .py file; FACTORY is a function in it returning
``(model, example_inputs)`` where example_inputs is a tuple of positional arguments (or one
argument, or a mapping of the forward's parameter names: :mod:`cuvil_pgc._example_inputs`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from typing import Any

from cuvil_pgc._buffers import buffers_kept
from cuvil_pgc._example_inputs import input_objects_kept, inputs_hint, positional_inputs
from cuvil_pgc.errors import ConfigError, ModelSpecError, one_line


def load_model_spec(spec: str, *, check: bool = True) -> tuple[Any, tuple[Any, ...]]:
    """Import MODULE, call FACTORY() and check what it returns (with ``check``, by calling the
    model once on its example inputs)."""
    module_ref, sep, factory_name = spec.rpartition(":")
    if not sep or not module_ref or not factory_name:
        raise ModelSpecError(f"model reference {spec!r} is not MODULE:FACTORY",
                             fix="e.g. --model cuvil_pgc.zoo:mlp or --model ./my_model.py:build")
    module = _import(module_ref)
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise ModelSpecError(f"{module_ref} has no function {factory_name!r}",
                             fix=f"define def {factory_name}(): return model, (example_input,)")
    try:
        result = factory()
    except Exception as exc:
        raise ModelSpecError(f"{spec}: the factory raised {_one_line(exc)}",
                             fix="fix the factory (run it on its own, or rerun as `cuvil-pgc --debug <command> ...` for the traceback)") from exc
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ModelSpecError(f"{spec} returned {type(result).__name__}, not (model, example_inputs)",
                             fix="return a 2-tuple: the module and a tuple of its positional inputs")
    model, given = result
    if not callable(model):
        raise ModelSpecError(f"{spec} returned a model of type {type(model).__name__} that is not callable")
    try:
        inputs = positional_inputs(model, given)
    except ConfigError as exc:
        raise ModelSpecError(f"{spec}: {exc.problem}", fix=exc.fix) from None
    if check:
        _call_once(spec, model, inputs, given)
    return model, inputs


def _call_once(spec: str, model: Any, inputs: tuple[Any, ...], given: Any) -> None:
    """One call of the model on its example inputs, so that a model failing on them is reported
    as the user's model failing, not as cuvil-pgc's internal error deep in a profile or search."""
    import torch

    restore = input_objects_kept(inputs)     # a decoding step's cache, which the call extends
    put_back = buffers_kept(model)
    try:
        with torch.no_grad():
            model(*inputs)
    except Exception as exc:
        hint = inputs_hint(given, model, exc)
        if not isinstance(given, (list, Mapping)):
            hint += " (rerun as `cuvil-pgc --debug <command> ...` for the traceback)"
        raise ModelSpecError(f"{spec}: the model raised on its example inputs: {_one_line(exc)}", fix=hint) from exc
    finally:
        restore()
        put_back()


def _one_line(exc: BaseException) -> str:
    """The exception's type and message (:func:`~cuvil_pgc.errors.one_line`), or its type alone."""
    return f"{type(exc).__name__}: {one_line(exc, 300)}" if str(exc).strip() else type(exc).__name__


def _import(module_ref: str):
    if module_ref.endswith(".py") or os.sep in module_ref:
        path = os.path.abspath(module_ref)
        if not os.path.isfile(path):
            raise ModelSpecError(f"model file {module_ref} does not exist", path=module_ref)
        return import_file(path, module_ref)
    try:
        return importlib.import_module(module_ref)
    except ModuleNotFoundError as exc:
        if exc.name and (module_ref == exc.name or module_ref.startswith(exc.name + ".")):
            raise ModelSpecError(f"cannot import module {module_ref!r} ({exc})",
                                 fix="check the name, or pass a path to a .py file") from None
        raise _import_raised(module_ref, exc) from exc
    except Exception as exc:
        raise _import_raised(module_ref, exc) from exc


def _import_raised(module_ref: str, exc: BaseException) -> ModelSpecError:
    """The user's module failed while being imported (a missing dependency, a syntax error, code at
    its top level that raised): their error, reported as such rather than as cuvil-pgc's."""
    fix = (f"install the package that provides {exc.name!r}" if isinstance(exc, ModuleNotFoundError) and exc.name
           else "fix the module (import it on its own, or rerun as `cuvil-pgc --debug <command> ...` for the traceback)")
    return ModelSpecError(f"importing {module_ref} raised {_one_line(exc)}", fix=fix)


def import_file(path: str, module_ref: str):
    """Import a .py file under the dotted name a program would import it by, where it has one.

    ``shop/ranker.py`` inside package ``shop`` (an ``__init__.py`` beside it) is imported as
    ``shop.ranker`` with the directory above the package on ``sys.path``, as ``python -c "import
    shop.ranker"`` run there would; a lone file ``models.py`` as ``models``. So the model's classes
    are the ones a service importing them normally gets. Only where that name is taken by another
    file already imported is the file loaded under a private name (``_cuvil_model_<stem>``); the
    structural hash does not depend on the name either way (cuvil_pgc._structure).
    """
    root, dotted = _package_root(path)
    existing = sys.modules.get(dotted)
    if existing is None or _same_file(getattr(existing, "__file__", None), path):
        if root not in [os.path.abspath(p or os.curdir) for p in sys.path]:
            sys.path.insert(0, root)
        try:
            module = importlib.import_module(dotted)
        except ImportError:      # not importable under that name: loaded under a private one below
            module = None
        except Exception as exc:
            raise _import_raised(module_ref, exc) from exc
        if module is not None and _same_file(getattr(module, "__file__", None), path):
            return module
    name = "_cuvil_model_" + os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ModelSpecError("cannot import this file as a Python module", path=module_ref)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise _import_raised(module_ref, exc) from exc
    return module


def _package_root(path: str) -> tuple[str, str]:
    """The directory to put on sys.path and the dotted module name of the file at ``path``."""
    directory, filename = os.path.split(path)
    parts = [os.path.splitext(filename)[0]]
    while os.path.isfile(os.path.join(directory, "__init__.py")):
        directory, package = os.path.split(directory)
        parts.insert(0, package)
    return directory, ".".join(parts)


def _same_file(a: str | None, b: str) -> bool:
    try:
        return a is not None and os.path.samefile(a, b)
    except OSError:
        return False
