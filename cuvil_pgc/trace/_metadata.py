"""Validating the ``cuvil`` metadata of our traces (and of aggregate summaries) where it is decoded.

The analyzer, summary and report read these fields; they get only values of the documented types
and ranges. Two regimes:

- **Fields that change results** — a bad value raises TraceError naming the field
  (``cuvil.sampling.scale``): ``rank`` (integer in [0, 2**31)), ``world_size`` (in [1, 2**31)),
  ``dropped`` (object of non-negative integer counts below 2**128), ``sampling`` (object:
  ``scale`` a number in [1, :data:`MAX_SAMPLING_SCALE`], ``every`` an integer >= 1, ``rate`` a
  number in (0, 1]).
- **Descriptive fields** — a bad value is dropped with a note on the source (shown with it in
  ``analyze`` and the report) and one log warning: ``start_unix_ns`` / ``end_unix_ns`` /
  ``start_monotonic_ns`` (integers in [0, 2**63) ns; without a valid anchor the source is aligned
  to start at 0, as for any file without one), ``host``, ``python``, ``torch``, ``platform``,
  ``io_error``, ``version`` (the cuvil-pgc that recorded the file; strings), ``pid``,
  ``schema_version`` (integers), ``command`` (list of strings), ``devices`` (list of objects),
  ``samplers`` (object of objects whose ``status`` and ``reason`` are strings and ``notes`` a
  list), ``config`` (object). A bad sampler or device entry is dropped alone.

Unknown keys are kept as they are (later versions may add fields; nothing here reads them).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

from cuvil_pgc.errors import TraceError

log = logging.getLogger("cuvil_pgc")

#: Largest ``sampling.scale`` accepted: one recorded call standing for 2**32 calls.
MAX_SAMPLING_SCALE = float(2**32)
_I63 = 2**63
_I31 = 2**31


def _is_int(v: Any, low: int, high: int) -> bool:
    return type(v) is int and low <= v < high


def _is_number(v: Any) -> bool:
    return type(v) in (int, float) and math.isfinite(v)


def _dropped(v: Any) -> str | None:
    if not isinstance(v, dict):
        return "must be an object of counts, such as {\"regions\": 12}"
    for key, count in v.items():
        if not _is_int(count, 0, 2**128):
            return f"[{key!r}] must be a non-negative integer count, got {_short(count)}"
    return None


def _sampling(v: Any) -> str | None:
    if not isinstance(v, dict):
        return "must be an object (scale, every, rate)"
    scale, every, rate = v.get("scale"), v.get("every"), v.get("rate")
    if scale is not None and not (_is_number(scale) and 1 <= scale <= MAX_SAMPLING_SCALE):
        return f".scale must be a number in [1, {MAX_SAMPLING_SCALE:.0f}], got {_short(scale)}"
    if every is not None and not _is_int(every, 1, _I63):
        return f".every must be an integer >= 1, got {_short(every)}"
    if rate is not None and not (_is_number(rate) and 0 < rate <= 1):
        return f".rate must be a number in (0, 1], got {_short(rate)}"
    return None


_STRICT: dict[str, Callable[[Any], str | None]] = {
    "rank": lambda v: None if _is_int(v, 0, _I31) else "must be an integer in [0, 2**31)",
    "world_size": lambda v: None if _is_int(v, 1, _I31) else "must be an integer in [1, 2**31)",
    "dropped": _dropped,
    "sampling": _sampling,
}


def _string(v: Any) -> bool:
    return v is None or isinstance(v, str)


_TIMES = ("start_unix_ns", "end_unix_ns", "start_monotonic_ns")
_LENIENT: dict[str, tuple[Callable[[Any], bool], str]] = {
    **{k: (_string, "a string") for k in ("host", "python", "torch", "platform", "io_error", "version")},
    **{k: (lambda v: _is_int(v, 0, _I63), "an integer number of nanoseconds in [0, 2**63)") for k in _TIMES},
    "pid": (lambda v: v is None or _is_int(v, -_I63, _I63), "an integer"),
    "schema_version": (lambda v: v is None or _is_int(v, 0, _I31), "an integer"),
    "command": (lambda v: isinstance(v, list) and all(isinstance(a, str) for a in v), "a list of strings"),
    "config": (lambda v: isinstance(v, dict), "an object"),
    "cpu": (lambda v: isinstance(v, dict), "an object (the recording CPU)"),
    "devices": (lambda v: isinstance(v, list), "a list of objects"),
    "samplers": (lambda v: isinstance(v, dict), "an object of sampler statuses"),
}


def check_metadata(meta: Any, path: str, notes: list[str], what: str = "cuvil") -> dict[str, Any]:
    """``meta`` with every field checked (see module docstring); notes what was dropped."""
    if not isinstance(meta, dict):
        raise TraceError(f"{what} metadata must be a JSON object, got {type(meta).__name__}", path=path,
                         fix="the file was altered after it was written; re-record it")
    out = dict(meta)
    for key, check in _STRICT.items():
        if key in out and out[key] is None:
            del out[key]                  # null is the same as absent
        elif key in out:
            problem = check(out[key])
            if problem is not None:
                sep = "" if problem.startswith((".", "[")) else " "
                raise TraceError(f"{what}.{key}{sep}{problem}" + ("" if "got" in problem else
                                                                   f", got {_short(out[key])}"),
                                 path=path, fix=f"the file was altered after it was written; remove or correct "
                                                f"{what}.{key}, or re-record it")
    for key in _TIMES:
        if key in out and out[key] is None:
            del out[key]                  # null is the same as absent
    for key, (ok, expected) in _LENIENT.items():
        if key in out and not ok(out[key]):
            _ignore(notes, path, f"{what}.{key} must be {expected}, got {_short(out[key])}; ignored")
            del out[key]
    if "devices" in out:
        out["devices"] = _entries(out["devices"], notes, path, f"{what}.devices")
    if "samplers" in out:
        out["samplers"] = _samplers(out["samplers"], notes, path, f"{what}.samplers")
    return out


def _entries(devices: list, notes: list[str], path: str, where: str) -> list[dict]:
    kept = [d for d in devices if isinstance(d, dict)]
    if len(kept) != len(devices):
        _ignore(notes, path, f"{where}: {len(devices) - len(kept)} entries that are not objects ignored")
    return kept


def _samplers(samplers: dict, notes: list[str], path: str, where: str) -> dict[str, dict]:
    kept = {}
    for name, status in samplers.items():
        if isinstance(status, dict) and _string(status.get("status")) and _string(status.get("reason")) \
                and isinstance(status.get("notes", []), list):
            kept[name] = status
        else:
            _ignore(notes, path, f"{where}[{name!r}] must be an object with string status and reason, got "
                                 f"{_short(status)}; ignored")
    return kept


def _ignore(notes: list[str], path: str, message: str) -> None:
    notes.append(message)
    log.warning("cuvil-pgc: %s: %s", path, message)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
