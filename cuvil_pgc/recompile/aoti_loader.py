"""Load an AOTInductor package in the time a deployment can afford: without torch's ISA probe.

``torch._inductor.aoti_load_package`` reads the package through ``torch.export``'s pt2 loader,
which compares the package's device metadata with this machine's before it loads the model, only
to log a warning where they differ (``codecache.get_device_information``). Telling this machine's
CPU vector ISA (``cpu_vec_isa.pick_vec_isa``) compiles a test library for each ISA the CPU
claims and loads each in a child Python. Measured in fresh processes:

- on the lent H200 (torch 2.11, whose child Python imports torch, 4-5 s there; 2026-12-04),
  ``aoti_load_package`` of a small model's package took 49.4 s, 48 of them in those children.
  The race's ``load_build`` took 42-54 s;
- here (torch 2.13, 2-vCPU AMD EPYC, a tiny package), 9.6-9.9 s with an empty Inductor cache
  (a new container) and 1.2 s with a warm one, against 0.04 s for the package loader itself.

:func:`load_aoti_package` builds torch's package loader directly, as ``load_package`` does for
packages of older layouts. Nothing is lost: a build's manifest records the CPU capability and
the GPU it was made for, and ``load_build`` refuses a build made for another
(``load._check_environment``), where torch's check only warns. Where this torch's loader
takes other arguments, the public call runs instead.

One thing the probe did that a package needs: asking Linux for AMX (``torch.cpu._init_amx``, the
``arch_prctl`` request a process makes before its first AMX instruction, which the probe makes as
it tests the AMX ISA). Inductor's bf16 GEMM kernels use AMX where the CPU has it (max-autotune's
C++ GEMM template); without the request the first call dies of SIGILL. Measured here (an Intel
Xeon with AMX, a bf16 MLP's aoti+max-autotune+freezing package): ``load_build`` in a fresh
process, then the first call, exit code 132. :func:`load_aoti_package` makes the request itself. :class:`FastAOTI` calls a loaded package with
the captured positional tensors without parsing its call spec each time.
"""

from __future__ import annotations

import re
from typing import Any

import torch

from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile.cxx_runtime import share_cxx_runtime
from cuvil_pgc.recompile.output_template import OutputTemplate

#: the model name ``aoti_compile_and_package`` gives a package's only model
MODEL_NAME = "model"


def load_aoti_package(path: str) -> Any:
    """The AOTInductor package at ``path``, loaded for this process's current device, as
    ``torch._inductor.aoti_load_package(path)`` returns it. The process's libstdc++ goes into its
    global symbol scope first (:mod:`.cxx_runtime`: without that, CUDA packages crashed fresh
    processes on the H200)."""
    share_cxx_runtime()
    init_amx = getattr(torch.cpu, "_init_amx", None)
    if init_amx is not None:          # False, and nothing asked, where the CPU has no AMX
        init_amx()
    try:
        parts = _direct_parts()
        if parts is not None:
            loader_class, compiled_class = parts
            try:
                loader = loader_class(path, MODEL_NAME, False, 1, -1)  # single-threaded off, 1 runner, current device
            except TypeError:         # pybind refused the arguments: another torch's signature
                pass
            else:
                return compiled_class(loader)
        return torch._inductor.aoti_load_package(path)
    except RuntimeError as exc:
        if (op := _undefined_operator(str(exc))) is None:
            raise
        raise BuildError(f"the build's AOTInductor program calls the custom operator {op}, which this process has "
                         "not defined", fix=f"import the module that defines {op} (its torch.library.custom_op or "
                         "Library), or load the library that registers it (torch.ops.load_library), before loading the build, as the "
                         "process that made it had") from exc


_UNDEFINED_OPERATOR = re.compile(r"Could not find schema for (\S+?)\.?(?:\s|$)")


def _undefined_operator(message: str) -> str | None:
    """The operator an AOTInductor loader's error says this process has not defined (its proxy
    executor looks the schema of each custom operator up when the package loads), or None."""
    match = _UNDEFINED_OPERATOR.search(message)
    return match.group(1) if match else None


def _direct_parts() -> tuple[Any, Any] | None:
    """torch's package loader class and the callable model that wraps it, or None where this
    torch has not both."""
    loader_class = getattr(getattr(torch._C, "_aoti", None), "AOTIModelPackageLoader", None)
    try:
        from torch._inductor.package.package import AOTICompiledModel
    except ImportError:
        return None
    return None if loader_class is None else (loader_class, AOTICompiledModel)


class FastAOTI:
    """Calls an AOTInductor runner with positional tensors without re-parsing its call spec each time.

    ``AOTICompiledModel.__call__`` deserializes both tree specs on every call (tens of µs); for
    inputs that are exactly the captured positional tensors, the flat input list is the args (for
    a region captured with nested arguments, the tensors in the order the export flattened them).
    """

    def __init__(self, compiled: Any) -> None:
        self.loader = compiled.loader
        self.out_spec = torch.utils._pytree.treespec_loads(self.loader.get_call_spec()[1])
        self.single = self.out_spec.is_leaf()
        # a tuple, list or dict of the outputs without the pytree's rebuild (a dict's: 2.1 µs warm)
        self.build = OutputTemplate(self.out_spec, [("t", i) for i in range(self.out_spec.num_leaves)], []).build

    def __call__(self, args: tuple[Any, ...] | list[Any]) -> Any:
        out = self.loader.boxed_run(list(args))
        return out[0] if self.single else self.build(out)
