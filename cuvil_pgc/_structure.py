"""Structural hash of an nn.Module: what a profile region and a model must share to match.

(And :func:`weights_digest`, its counterpart over the weight values, for compiled artifacts that
embed them.)

Recorded by ``instrument_module`` on every region (a 16-hex-digit prefix, ``args.structure``),
copied into the analysis evidence, and compared by the recompiler (recompile.matching) so that a
profile of a slightly different model version applies to the unchanged regions only. It lives
here, outside both stages, because instrument (upstream) and recompile (downstream) both need it.

A module's identity is what its code is, not where it was imported from: the class's
``__qualname__`` and forward source, and its parameter and buffer names, shapes and dtypes. The
module name is left out on purpose: ``recompile --model models.py:build`` imports the file under
one name and a service doing ``from shop.models import Ranker`` under another, and a build must
apply to both (issue 22). ``STRUCTURE_VERSION`` is hashed in, so hashes of another definition never
collide with these.
"""

from __future__ import annotations

import hashlib
import inspect
from typing import Any

SHORT = 16      # hex digits recorded per region: 64 bits, enough to tell module versions apart
STRUCTURE_VERSION = 2    # 2: the class's __qualname__ without __module__ (1 hashed the import name too)


def structural_hash(module: Any) -> str:
    """sha256 of the module's structure: class names, forward sources, parameter/buffer shapes and dtypes.

    Independent of the name the module's file was imported under (see the module docstring).
    """
    h = hashlib.sha256(f"cuvil-structure {STRUCTURE_VERSION}\n".encode())
    for name, sub in module.named_modules(remove_duplicate=False):
        cls = type(sub)
        h.update(f"M {name} {cls.__qualname__}\n".encode())
        h.update(_forward_source(cls).encode())
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
        h.update(f"M {name} {type(sub).__qualname__}\n".encode())
    return h.hexdigest()


def weights_digest(module: Any) -> str:
    """sha256 of the values of the module's parameters and buffers (names, dtypes, shapes, bytes).

    What the structural hash leaves out on purpose: an AOTInductor package bakes the weights in, so
    two modules of one structure (``layers.0`` and ``layers.1``, or a model before and after
    fine-tuning) need different packages.
    """
    import torch

    h = hashlib.sha256()
    for kind, named in (("P", module.named_parameters()), ("B", module.named_buffers())):
        for name, t in named:
            data = t.detach().to("cpu").contiguous()
            h.update(f"{kind} {name} {tuple(data.shape)} {data.dtype}\n".encode())
            h.update(data.reshape(-1).view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return h.hexdigest()


_SOURCES: dict[type, str] = {}


def _forward_source(cls: type) -> str:
    if cls not in _SOURCES:
        try:
            _SOURCES[cls] = inspect.getsource(cls.forward)
        except (OSError, TypeError):
            _SOURCES[cls] = f"{cls.__qualname__}.forward"     # no source (a C extension's class)
    return _SOURCES[cls]
