"""Whole-model plans raced each in processes of their own, as they are deployed.

A plan that runs without the model's Python code, the whole model as one ONNX Runtime session, one
OpenVINO compiled model or one AOTInductor package on the CPU, is described by
:func:`standalone_spec`: its candidate, artifact, captured-input spec and output structure. A
worker (``python -m cuvil_pgc.recompile.standalone SPEC.json``) rebuilds the region the way
:func:`~.load.load_build` does (:func:`~.runtime_build.runtime_region`, or the AOTInductor
package), checks that it answers the captured inputs with the searching process's outputs, and
serves timing requests (:mod:`.process_race`). :func:`race_standalone` writes the inputs and
specs to a private directory and races the plans there; :mod:`.plan` lets that race decide
between whole-model plans (see its docstring for why).

:func:`fresh_process_failures` asks the same worker (``--check``) only to rebuild a region of
any scope, on any device, and answer its captured inputs: the plan that ships must load in a
process that did not build it. On an H200 with torch 2.11, AOTInductor CUDA packages that ran in
the searching process killed every fresh process that loaded them (SIGSEGV inside torch's
``AOTIModelPackageLoader``; :mod:`.cxx_runtime` found the cause), which
``load_build(fallback="eager")`` cannot catch.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import Any

import torch
from torch import nn

from cuvil_pgc.recompile.measure import Samples
from cuvil_pgc.recompile.object_outputs import output_tensors
from cuvil_pgc.recompile.process_race import exit_reason, race_in_processes, serve

#: backends whose whole-model region a worker can rebuild from its artifact alone
STANDALONE_BACKENDS = ("ort", "openvino", "aoti")
#: processes per plan: a process's memory layout alone moved one contender by up to 4%; with three
#: each, a plan faster than the runtime default in every process is so at the 5% level (plan._confident)
REPLICAS = 3


#: seconds a fresh process may take to load a region and answer its inputs
CHECK_TIMEOUT_S = 600.0


def standalone_spec(cand: Any, realized: Any, scope_inputs: Any, device: str, *,
                    check: bool = False) -> dict[str, Any] | None:
    """What a worker needs to run ``cand``'s whole-model region (``realized``) for the captured
    inputs, or None where it needs more (the model's code, a GPU, an output structure not known
    yet). With ``check`` (a load check, not a race), a region of any scope on any device."""
    if cand.backend not in STANDALONE_BACKENDS or not realized.artifact:
        return None
    if check:
        if scope_inputs.kwargs:          # the worker passes positional inputs alone
            return None
    elif cand.scope or device != "cpu":
        return None
    outputs = flat = None
    template = getattr(getattr(realized.module, "compiled", None), "template", None)
    if cand.backend != "aoti" and template is None:
        return None
    if template is not None:        # a runtime's, or an AOTInductor package of the output tensors
        outputs, flat = template.to_json(), _flat(template)
    from cuvil_pgc.recompile.runtime_build import bounds_record

    return {"candidate": cand.to_json(), "artifact": realized.artifact, "signature": scope_inputs.signature,
            "spec": scope_inputs.spec, "outputs": outputs, "flat_outputs": flat, "threads": torch.get_num_threads(),
            "tensor_outputs": cand.backend == "aoti" and template is not None,
            "bounds": bounds_record(realized.module)}      # its index checks, as load_build's region has them


def _flat(template: Any) -> dict[str, Any] | None:
    """A template returning the region's output tensors as one tuple, for a structure the worker
    cannot rebuild (one that cannot be written down, or a Hugging Face ``ModelOutput``, whose
    class the worker has not imported): it then times the runtime and a cheap output instead of
    the structure's, alike for every plan it races."""
    from cuvil_pgc.recompile.output_template import OutputTemplate

    return OutputTemplate.of(tuple(torch.empty(shape, dtype=dtype) for shape, dtype in template.tensors)).to_json()


def race_standalone(specs: dict[str, dict[str, Any]], inputs: tuple[Any, ...], references: dict[str, Any],
                    rounds: int, replicas: int = REPLICAS) -> tuple[dict[str, Samples], dict[str, str]]:
    """Per-call samples of each plan in ``specs`` raced in worker processes (see
    :func:`~.process_race.race_in_processes`), and why a plan could not run there. Every worker
    first checks its outputs for ``inputs`` against its plan's output here (``references``, by
    plan): two plans that each pass the guard against eager may differ from each other by twice
    its tolerance, so only a plan's own output tells whether the worker rebuilt that plan."""
    with tempfile.TemporaryDirectory(prefix="cuvil-race-") as tmp:     # private: mode 0700
        data = os.path.join(tmp, "inputs.pt")
        torch.save({"args": list(inputs), "references": {k: output_tensors(references[k]) for k in specs}}, data)
        commands = {}
        for i, (name, spec) in enumerate(specs.items()):
            path = _write_spec(os.path.join(tmp, f"plan{i}.json"), spec, name, data, references[name])
            commands[name] = [sys.executable, "-m", __name__, path]
        return race_in_processes(commands, rounds, replicas, env=_worker_env())


def fresh_process_failures(specs: dict[str, dict[str, Any]], inputs: dict[str, tuple[Any, ...]],
                           references: dict[str, Any], *, timeout: float = CHECK_TIMEOUT_S,
                           python: str = sys.executable) -> dict[str, str]:
    """Why each region of ``specs`` (by name, with its ``inputs`` and this process's output for
    them, ``references``) could not be rebuilt from its artifact and answer in a fresh process;
    empty when every one could. A region whose artifact crashes its process is named with the
    signal."""
    failures = {}
    with tempfile.TemporaryDirectory(prefix="cuvil-check-") as tmp:     # private: mode 0700
        for i, (name, spec) in enumerate(specs.items()):
            data = os.path.join(tmp, f"inputs{i}.pt")
            torch.save({"args": list(inputs[name]), "references": {name: output_tensors(references[name])}}, data)
            path = _write_spec(os.path.join(tmp, f"region{i}.json"), spec, name, data, references[name])
            try:
                proc = subprocess.run([python, "-m", __name__, path, "--check"], env=_worker_env(),
                                      capture_output=True, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                failures[name] = f"a process of its own did not load and run it within {timeout:.0f} s"
                continue
            if proc.returncode < 0:
                failures[name] = (f"a process of its own that loaded it {exit_reason(proc.returncode)}, "
                                  "as a deployment loading the build would")
            elif proc.returncode:
                last = (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
                last = last if len(last) <= 600 else last[:599] + "…"     # whole, where it is an error's message
                failures[name] = f"a process of its own could not load and run it: {last}"
    return failures


def _write_spec(path: str, spec: dict[str, Any], name: str, data: str, reference: Any) -> str:
    """The worker's file at ``path``: ``spec``, under ``name`` in the inputs file ``data``, with the
    modules of its output's classes (``reference``, see :func:`_output_modules`) and, for an
    AOTInductor package, the operator libraries and the modules defining Python custom operators
    this process has (:func:`load_op_libraries`, :func:`custom_op_modules`); returns ``path``."""
    aoti = spec.get("candidate", {}).get("backend") == "aoti"
    with open(path, "w") as f:
        json.dump({**spec, "plan": name, "inputs": data, "imports": _output_modules(reference),
                   "op_libraries": sorted(getattr(torch.ops, "loaded_libraries", ())) if aoti else [],
                   "op_modules": custom_op_modules() if aoti else []}, f)
    return path


def custom_op_modules() -> list[list[str | None]]:
    """``[module, file]`` of each module outside torch that defined a Python operator in this
    process (the model's own file, a library of kernels): with ``torch.library.custom_op``, with a
    ``torch.library.Library("ns", "DEF")`` and its ``define``/``impl``, or with
    ``torch.library.define`` and a ``register_fake``.

    An AOTInductor package calls such an operator through torch's dispatcher, which knows it only
    in a process that ran its definition: a worker loading the package without it failed ("Could
    not find schema for mylib::soft_clip"), and the plan, 1.5x faster than eager, was refused as
    one no fresh process could load, though a service loads a build after importing its model's
    code. Operators defined in ``__main__`` are left out (importing a script runs it)."""
    opdefs = getattr(getattr(torch, "_library", None), "custom_ops", None)
    names = [getattr(getattr(opdef, "_init_fn", None), "__module__", None)
             for opdef in list(getattr(opdefs, "OPDEFS", {}).values())]
    if files := _operator_files():         # most processes have none: no walk over every module
        by_file = {os.path.realpath(path): name for name, module in list(sys.modules.items())
                   if isinstance(path := getattr(module, "__file__", None), str)}
        names += [by_file.get(os.path.realpath(path)) for path in files]
    out = {name: getattr(sys.modules.get(name), "__file__", None) for name in names
           if isinstance(name, str) and name.split(".")[0] not in ("torch", "__main__")}
    return [[name, out[name]] for name in sorted(out)]


def _operator_files() -> set[str]:
    """The Python files outside torch that registered an operator's schema or kernels with the
    dispatcher (a ``Library`` records the file that made it: ``torch._C._dispatch_dump`` shows
    "registered at FILE:LINE") or its fake (``torch.library.register_fake``: the kernel's source,
    where ``torch.library.define`` left torch's own file in the dispatcher)."""
    torch_dir = os.path.dirname(os.path.realpath(torch.__file__)) + os.sep
    sources: list[str] = []
    try:
        for op in torch._C._dispatch_get_all_op_names():
            if not op.startswith("aten::"):
                sources += re.findall(r"registered at (.+?\.py):\d+", torch._C._dispatch_dump(op))
        registry = torch._library.simple_registry.singleton
        for entry in list(getattr(registry, "_data", {}).values()):
            for kernel in getattr(getattr(entry, "fake_impl", None), "kernels", ()) or ():
                sources.append(str(getattr(kernel, "source", "")).rsplit(":", 1)[0])
    except (AttributeError, RuntimeError):     # another torch's internals: the custom_op ones only
        pass
    return {path for path in sources if path.endswith(".py") and os.path.isfile(path)
            and not os.path.realpath(path).startswith(torch_dir)}


def load_op_libraries(paths: list[str]) -> None:
    """Load the operator libraries the searching process loaded (``torch.ops.load_library``: a
    service's C++ kernels, registered with ``TORCH_LIBRARY``), which an AOTInductor package calls
    as it calls Python custom operators (see :func:`custom_op_modules`); one that fails is left out."""
    for path in paths:
        try:
            if os.path.isfile(path):
                torch.ops.load_library(path)
        except Exception:
            pass


def import_op_modules(modules: list[list[str | None]]) -> None:
    """Import the modules :func:`custom_op_modules` named in the searching process, as a service
    imports its model's code: by file where the module has one (:func:`~cuvil_pgc._modelspec.import_file`,
    under the name a program imports it by), else by name. One that fails is left out: the plan
    then fails on its operator, as it would where the service lacks it."""
    from cuvil_pgc._modelspec import import_file

    for name, path in modules:
        try:
            if path and path.endswith(".py") and os.path.isfile(path):
                import_file(path, path)
            elif name:
                importlib.import_module(name)
        except Exception:
            pass


def _output_modules(output: Any) -> list[str]:
    """The modules defining the classes of an output's structure (a Hugging Face ``ModelOutput``:
    ``transformers.modeling_outputs``), which a worker imports before it rebuilds the plan: an
    AOTInductor package's output structure names them, and loading it without them failed ("...
    in pytree is not registered"), so such a plan never raced as deployed."""
    out: set[str] = set()
    pending = [torch.utils._pytree.tree_flatten(output)[1]]
    while pending:
        spec = pending.pop()
        kind = getattr(spec, "type", None)
        if kind is not None and kind.__module__ not in ("builtins", "collections"):
            out.add(kind.__module__)
        pending.extend(spec.children())
    return sorted(out)


def _worker_env() -> dict[str, str]:
    """This process's environment, with this cuvil_pgc first on the path (it may be importable here
    only through ``sys.path``)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))    # above cuvil_pgc/
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    return env


def region(spec: dict[str, Any]) -> nn.Module:
    """The region a standalone spec describes, built as :func:`~.load.load_build` builds it. The
    module it falls back to for other inputs is a stand-in: the worker checks it never does."""
    from cuvil_pgc.recompile.apply import realize
    from cuvil_pgc.recompile.candidates import Candidate
    from cuvil_pgc.recompile.output_template import OutputTemplate
    from cuvil_pgc.recompile.runtime_build import bounds_of, runtime_region

    cand = Candidate.from_json(spec["candidate"])
    template = None
    if spec.get("outputs") or spec.get("flat_outputs"):
        try:
            template = OutputTemplate.from_json(spec["outputs"])
        except Exception:          # not written down, or its class is not imported here (see _flat)
            template = OutputTemplate.from_json(spec["flat_outputs"])
    bounds = bounds_of(spec.get("bounds") or {}, spec["artifact"])
    if cand.backend == "aoti":
        return realize(_NotTheModel(), cand, None, artifact=spec["artifact"], signature=spec["signature"],
                       spec=spec["spec"], tensor_outputs=spec.get("tensor_outputs", False), template=template,
                       index_bounds=bounds).module
    return runtime_region(cand, spec["artifact"], template, _NotTheModel(), spec["signature"], spec["spec"],
                          bounds).module


def _eager_model(ref: str) -> Any:
    """The model ``ref`` (``MODULE:FACTORY``, the reference the search's model came from) makes, in
    eval mode: eager, raced beside the plans; its outputs are checked against the searching
    process's eager outputs like a plan's (a factory that draws other weights does not race)."""
    from cuvil_pgc._eval_mode import eval_mode
    from cuvil_pgc._modelspec import load_model_spec
    from cuvil_pgc.recompile.cache_step import around_cache

    model, inputs = load_model_spec(ref, check=False)
    return around_cache(eval_mode(model), inputs)[0]      # a decoding step's, as the search's


class _NotTheModel(nn.Module):
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("the race worker's inputs do not match the region's captured inputs")


def main(argv: list[str]) -> int:
    from cuvil_pgc.recompile.accuracy import check_outputs

    with open(argv[0]) as f:
        spec = json.load(f)      # written by the searching process into its private directory
    torch.set_num_threads(spec["threads"])
    for name in spec.get("imports", []):       # the output's classes: the plan is rebuilt as load_build does
        try:
            importlib.import_module(name)
        except ImportError:
            pass                   # the runtimes' plans then return their tensors as a tuple (see _flat)
    load_op_libraries(spec.get("op_libraries", []))
    import_op_modules(spec.get("op_modules", []))
    data = torch.load(spec["inputs"], weights_only=True)
    args = tuple(data["args"])
    module = _eager_model(spec["model_ref"]) if spec.get("model_ref") else region(spec)
    with torch.no_grad():
        check = check_outputs(data["references"][spec["plan"]], output_tensors(module(*args)))
        if not check.ok:
            raise RuntimeError(f"the worker's outputs differ from the searching process's: {check.reason}")
        if "--check" not in argv[1:]:
            serve(lambda: module(*args))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
