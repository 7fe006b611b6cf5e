"""Keep torch's thread-local dispatch state as it was across a candidate's build and calls.

torch.compile of a forward decorated with ``@torch.inference_mode()`` (Meta's reference Llama code)
fails in torch 2.13 and 2.14 ("Cannot set version_counter for inference tensor"), and its error path
leaves the Python, PythonTLSSnapshot and PythonDispatcher keys in the thread's included set,
Functionalize in its excluded set and grad mode off. Every later call of any module in the process
then fails ("Hit PythonDispatcher dispatch key but PythonDispatcherTLS was not set"): the search's
next eager call did, and ``cuvil-pgc recompile`` ended with an internal error. The keys are set when
the failed call's frames are freed (torch's guards held there restore their state out of order), so
only once the exception is gone. :func:`kept` clears the finished frames of an exception leaving
its block, then puts the dispatch keys and grad mode back as they were when it was entered: a failed
candidate is a rejected candidate, and the search goes on.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager

import torch

log = logging.getLogger(__name__)

#: torch's calls for the thread's dispatch state (private: a torch without one leaves it unchecked)
_READ_WRITE = ("_dispatch_tls_local_include_set", "_dispatch_tls_local_exclude_set", "_dispatch_is_alias_key",
               "_dispatch_tls_is_dispatch_key_included", "_dispatch_tls_set_dispatch_key_included",
               "_dispatch_tls_is_dispatch_key_excluded", "_dispatch_tls_set_dispatch_key_excluded")
#: the runtime keys (an alias key such as Autograd stands for others: a set "has" it through them)
_KEYS = tuple(k for k in torch._C.DispatchKey.__members__.values()
              if k.name != "Undefined" and not torch._C._dispatch_is_alias_key(k)) \
    if all(hasattr(torch._C, name) for name in _READ_WRITE) else ()


def _state() -> tuple[frozenset[str], frozenset[str], bool]:
    included, excluded = torch._C._dispatch_tls_local_include_set(), torch._C._dispatch_tls_local_exclude_set()
    return (frozenset(k.name for k in _KEYS if included.has(k)), frozenset(k.name for k in _KEYS if excluded.has(k)),
            torch.is_grad_enabled())


@contextmanager
def kept(what: str) -> Iterator[None]:
    """Run the block, then put the thread's dispatch keys and grad mode back where it changed them
    (``what``, the candidate, names it in the log)."""
    if not _KEYS:
        yield
        return
    before = _state()
    try:
        yield
    except BaseException as exc:
        _drop_frames(exc)
        raise
    finally:
        after = _state()
        if after != before:
            log.info("%s left torch's dispatch state changed (included %s, excluded %s, grad %s): put back",
                     what, sorted(after[0] ^ before[0]), sorted(after[1] ^ before[1]), after[2])
            _put_back(*before)


def _put_back(included: frozenset[str], excluded: frozenset[str], grad: bool) -> None:
    for key in _KEYS:
        if torch._C._dispatch_tls_is_dispatch_key_included(key) != (key.name in included):
            torch._C._dispatch_tls_set_dispatch_key_included(key, key.name in included)
        if torch._C._dispatch_tls_is_dispatch_key_excluded(key) != (key.name in excluded):
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, key.name in excluded)
    torch.set_grad_enabled(grad)


def _drop_frames(exc: BaseException) -> None:
    """Clear the locals of the finished frames ``exc`` and the exceptions behind it hold: torch's
    dispatch guards held there put their state back when freed, out of order, which left the keys
    set only once the exception was gone (after this block had checked)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        traceback.clear_frames(exc.__traceback__)
        exc = exc.__cause__ or exc.__context__
