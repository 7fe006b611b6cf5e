"""Profiling schedules: which steps of a long-running program are recorded.

``schedule(wait=, warmup=, active=, repeat=, skip_first=)`` returns a pure function
``step -> Action`` with torch.profiler's semantics: after ``skip_first`` steps, each cycle waits
``wait`` steps, warms up for ``warmup`` steps (samplers started, nothing kept), records ``active``
steps, and saves the window at the end of its last active step; ``repeat`` cycles (0: forever).
"""

from __future__ import annotations

import enum
from collections.abc import Callable

from cuvil_pgc.errors import ConfigError


class Action(enum.Enum):
    NONE = "none"
    WARMUP = "warmup"
    RECORD = "record"
    RECORD_AND_SAVE = "record_and_save"


Schedule = Callable[[int], Action]


def schedule(*, wait: int = 0, warmup: int = 0, active: int = 1, repeat: int = 0, skip_first: int = 0) -> Schedule:
    """A step -> Action function (see module docstring)."""
    for name, value in (("wait", wait), ("warmup", warmup), ("repeat", repeat), ("skip_first", skip_first)):
        if not isinstance(value, int) or value < 0:
            raise ConfigError(f"schedule {name}={value!r} must be an int >= 0")
    if not isinstance(active, int) or active < 1:
        raise ConfigError(f"schedule active={active!r} must be an int >= 1")
    cycle = wait + warmup + active

    def action(step: int) -> Action:
        if step < skip_first:
            return Action.NONE
        step -= skip_first
        if repeat and step // cycle >= repeat:
            return Action.NONE
        pos = step % cycle
        if pos < wait:
            return Action.NONE
        if pos < wait + warmup:
            return Action.WARMUP
        return Action.RECORD_AND_SAVE if pos == cycle - 1 else Action.RECORD

    action.__doc__ = f"schedule(wait={wait}, warmup={warmup}, active={active}, repeat={repeat}, skip_first={skip_first})"
    return action
