"""ProfileRegion: a named, nestable span of the user's code.

Contract:
- ``with ProfileRegion("name", **attrs):``, ``@ProfileRegion("name")`` on sync and async
  functions, and ``r = ProfileRegion("name").start(); ...; r.end()``.
- Nesting is tracked with a ContextVar holding the active frame, so it is correct per thread and
  per asyncio task. A frame is a small list, never state on the ProfileRegion itself, so one
  instance may be entered from many threads, tasks or recursive calls at once. The hot path only
  stores (region, parent frame, start); the writer thread gives frames their ids when it writes
  them (the trace carries each region's id, parent id and name, never its path), and
  :func:`frame_path` builds a path only where one is asked for (filters, aggregates, spans).
  Entering a region allocates one list and formats no string, at any nesting depth.
- Regions need not nest: generators and async generators interleave (``zip(g1, g2)``), and a
  region may be ended from another thread or task than the one that started it. So a frame's
  parent is the innermost frame that has not ended: entering skips ended parents, and a region
  that ends while a region started inside it still runs hands that region over to its own
  parent (:func:`_adopt`). Frames of an earlier recording epoch (sinks attached after none were)
  are no parents, so a session starts with a clean stack whatever an earlier one left behind.
- With no session recording, enter/exit test one module global and return: no torch, CUPTI or
  NVML is imported here, and nothing is allocated.
- While a session records, exit hands ``(frame, end_ns)`` to the sinks (:func:`attach`); the
  session's RegionRecorder appends it to the calling thread's buffer. That path never raises into
  the user's code.
- Enter/exit and :func:`frame_path` run in C when the optional accelerator (``_fastregion.c``) is
  built, else in the pure-Python versions below; both behave the same (tests run both), and
  ``CUVIL_PGC_PURE_PYTHON=1`` forces the Python ones.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import itertools
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from cuvil_pgc.errors import RegionError
from cuvil_pgc.instrument._accel import fastregion as _accel

ACCELERATED = _accel is not None
"""Whether regions run the C accelerator (False: pure Python, e.g. no compiler at install)."""

F = TypeVar("F", bound=Callable[..., Any])

MAX_NAME_CHARS = 65_536
_ATTR_TYPES = (str, int, float, bool, type(None))

# Frame layout: [region, parent_frame, start_ns, id, path, end_ns, epoch]; id is None until the
# writer writes the frame (or an event naming it), path None until frame_path() builds it, end_ns
# None until the region ends; start_ns is -1 for a sampled-out region. The C accelerator's Frame
# objects index the same way (their epoch lives on the per-context cursor, not on the frame).
_REGION, _PARENT, _START, _ID, _PATH, _END, _EPOCH = range(7)

# The active frame per thread / task: the frame itself in pure Python; with the C accelerator a
# cursor per context that points at it (one ContextVar update per context, not two per region).
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("cuvil_pgc_region", default=None)
# How far up from the active frame a region ending out of order looks for a region it must hand
# over to its parent (interleaved generators need 1 per generator in flight).
ADOPT_LIMIT = 32
_ids = itertools.count(1)
_epoch = 0          # recording epochs: +1 whenever sinks are attached after none were
_now = time.perf_counter_ns


class Recorder(Protocol):
    """What a recording session offers regions: one call per completed region."""

    def record(self, frame: list, end_ns: int) -> None:
        """``frame`` has ended at ``end_ns`` (also in ``frame[5]``)."""


# What regions call on exit while anything records: the one sink's bound ``record`` method, a
# function calling several sinks (a capture window during always-on aggregation), or None.
# Regions read this one global on every enter/exit; instrument_module's hooks read it too.
_recorder: Callable[[list, int], None] | None = None
_sinks: list[Recorder] = []

# Sampling of root regions while a session samples (None: record every region). The decision is
# taken when a root region starts; its whole subtree follows it, so sampled trees stay whole.
_sample: Callable[[ProfileRegion], bool] | None = None


def attach(recorder: Recorder) -> None:
    """Add a sink that receives every completed region."""
    _sinks.append(recorder)
    _rebuild()


def detach(recorder: Recorder) -> None:
    """Remove a sink added with :func:`attach` (no error if it is not attached)."""
    if recorder in _sinks:
        _sinks.remove(recorder)
    _rebuild()


def recording() -> bool:
    """Whether any sink records regions now (a cheap check for hooks that would open one)."""
    return _recorder is not None


def set_recorder(recorder: Recorder | None) -> None:
    """Replace all sinks with ``recorder`` (None: record nothing)."""
    _sinks.clear()
    if recorder is not None:
        _sinks.append(recorder)
    _rebuild()


def set_sampling(policy: Callable[[ProfileRegion], bool] | None) -> None:
    """Install a root-region sampling policy (region -> keep?), or None to keep every region."""
    global _sample
    _sample = policy
    _configure_accel()


def _rebuild() -> None:
    global _recorder, _epoch
    if _recorder is None and _sinks:     # a new recording epoch: frames of earlier ones are no parents
        _epoch += 1
    if not _sinks:
        _recorder = None
    elif len(_sinks) == 1:
        _recorder = _sinks[0].record
    else:
        calls = tuple(sink.record for sink in _sinks)

        def tee(frame: list, end_ns: int) -> None:
            for call in calls:
                call(frame, end_ns)
        _recorder = tee
    _configure_accel()


def _configure_accel() -> None:
    """Hand the C regions what the Python ones read from this module's globals. A lone sink that
    offers per-thread list buffers (``_register``, see _buffers.RegionRecorder) is appended to
    directly from C; any other sink is called. A replaced ``_now`` (tests) replaces C's clock."""
    if _accel is None:
        return
    sink = _sinks[0] if len(_sinks) == 1 and hasattr(_sinks[0], "_register") else None
    _accel.configure(_recorder, sink, _sample, _current, None if _now is time.perf_counter_ns else _now)


def current_frame() -> list | None:
    """The innermost active region frame in this thread / task, or None."""
    return _live(_current.get()) if _accel is None else _accel.current_frame()


def _frame_path_py(frame: list) -> str:
    """The ``outer/inner`` path of a frame, cached on it and its ancestors (index 4).

    Iterative: a path costs its length to build once, and nothing is recursed at any depth."""
    chain = []
    while frame is not None and frame[_PATH] is None:
        chain.append(frame)
        frame = frame[_PARENT]
    path = None if frame is None else frame[_PATH]
    for f in reversed(chain):
        path = f[_REGION].name if path is None else f"{path}/{f[_REGION].name}"
        f[_PATH] = path
    return path


def current_path() -> str | None:
    """Path of the innermost active region in this thread / task, or None."""
    frame = current_frame()
    return None if frame is None else frame_path(frame)


frame_path: Callable[[list], str] = _accel.frame_path if _accel is not None else _frame_path_py


def reserve_id() -> int:
    """A region id no frame has yet: a session's id floor (frames with smaller ids were written
    by earlier sessions, into other files)."""
    return _accel.reserve_id() if _accel is not None else next(_ids)


def _live(frame: list | None) -> list | None:
    """The innermost frame at or above ``frame`` that has not ended, of this recording epoch."""
    while frame is not None and frame[_END] is not None:
        frame = frame[_PARENT]
    return frame if frame is None or frame[_EPOCH] == _epoch else None


def _adopt(top: list | None, ended: list) -> None:
    """``ended`` ended out of order: a region started inside it that still runs (on the active
    chain from ``top``) becomes a child of ``ended``'s parent, so no region outlives its parent."""
    for _ in range(ADOPT_LIMIT):
        if top is None:
            return
        parent = top[_PARENT]
        if parent is ended:
            if top[_END] is None:
                top[_PARENT] = ended[_PARENT]
                top[_PATH] = None
            return
        top = parent


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise RegionError(f"region name must be a str, got {type(name).__name__}",
                          fix="pass a short descriptive string such as 'decode'")
    if not name:
        raise RegionError("region name is empty", fix="pass a short descriptive string such as 'decode'")
    if len(name) > MAX_NAME_CHARS:
        raise RegionError(f"region name has {len(name)} characters, more than {MAX_NAME_CHARS}",
                          fix="use a short name and put details into attributes")
    if not name.isascii():
        try:
            name.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RegionError(f"region name {name!r} is not valid Unicode text ({exc.reason} at {exc.start})",
                              fix="remove lone surrogates, e.g. name.encode('utf-8', 'replace').decode()") from None
    return name


def _check_attrs(attrs: dict[str, Any]) -> dict[str, Any] | None:
    if not attrs:
        return None
    for key, value in attrs.items():
        if key in ("path", "id", "parent"):
            raise RegionError(f"region attribute {key!r} is reserved", fix="rename the attribute")
        if not isinstance(value, _ATTR_TYPES):
            raise RegionError(f"region attribute {key}={value!r} has type {type(value).__name__}",
                              fix="attributes must be str, int, float, bool or None")
        if isinstance(value, str):
            _check_name(value) if value else None
    return attrs


def _checked(name: str, **attrs: Any) -> tuple[str, dict[str, Any] | None]:
    """A region's (name, attrs), validated (RegionError on bad input)."""
    return _check_name(name), _check_attrs(attrs) if attrs else None


class _PyRegionBase:
    """Construction, enter and exit in pure Python (the C accelerator's RegionBase does the same)."""

    __slots__ = ("name", "attrs", "_json", "_frame")

    def __init__(self, name: str, **attrs: Any) -> None:
        if attrs or type(name) is not str or not name.isascii() or not 0 < len(name) <= MAX_NAME_CHARS:
            name, attrs = _checked(name, **attrs)
        self.name = name
        self.attrs = attrs or None
        self._json: tuple[bytes, bytes] | None = None   # (name, attrs) as JSON fragments; writer's cache
        self._frame = None

    def __enter__(self) -> Any:
        if _recorder is None:
            return self
        parent = _current.get()
        if parent is not None and (parent[5] is not None or parent[6] != _epoch):
            parent = _live(parent)
        if _sample is None:
            frame = [self, parent, _now(), None, None, None, _epoch]
        elif parent is None:
            frame = [self, None, _now() if _keep_root(self) else -1, None, None, None, _epoch]
        else:   # a sampled-out root's subtree is sampled out too (start -1)
            frame = [self, parent, -1 if parent[2] < 0 else _now(), None, None, None, _epoch]
        _current.set(frame)
        self._frame = frame
        return self

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        record = _recorder
        if record is None and self._frame is None:
            return
        end = _now()
        top = _current.get()
        frame = _live(top)
        if frame is None or frame[0] is not self:
            # Ended out of order (interleaved generators) or from another context (start()/end()
            # across callbacks or threads): our own frame.
            frame = self._frame
            if frame is None:
                return
            _adopt(top, frame)
        else:
            _current.set(_live(frame[1]))
        self._frame = None
        if frame[5] is None:
            frame[5] = end
            if record is not None and frame[2] >= 0:
                record(frame, end)


def _keep_root(region: Any) -> bool:
    try:
        return bool(_sample(region))
    except Exception:   # a failing policy keeps the region rather than raise into the user's code
        return True


if _accel is not None:
    _accel.set_checks(_checked)
_RegionBase: type = _accel.RegionBase if _accel is not None else _PyRegionBase


class ProfileRegion(_RegionBase):
    """A named region of the user's program, recorded when a session is active.

    Args:
        name: short, low-cardinality name; nested regions form the path ``outer/inner``.
        **attrs: static attributes (str, int, float, bool, None) stored in the event's ``args``.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"ProfileRegion({self.name!r})"

    def start(self) -> ProfileRegion:
        """Begin the region now; pair with :meth:`end`. Returns self."""
        return self.__enter__()

    def end(self) -> None:
        """End a region begun with :meth:`start`."""
        self.__exit__(None, None, None)

    def __call__(self, fn: F) -> F:
        """Decorate a sync or async function: every call runs inside this region."""
        if inspect.iscoroutinefunction(fn):
            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                with self:
                    return await fn(*args, **kwargs)
            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with self:
                return fn(*args, **kwargs)
        return wrapper  # type: ignore[return-value]
