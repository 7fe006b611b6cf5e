"""A program's own ``profile()`` under ``cuvil-pgc profile``: it joins the outer session.

``cuvil-pgc profile app.py`` already records the whole program; when ``app.py`` calls
``cuvil_pgc.profile("its.trace.json")`` itself, a second session cannot record in the same
process. Instead the call returns a :class:`JoinedSession`: its regions land in the outer trace,
the path it asked for is noted in that trace's metadata (``cuvil.joined``) and logged once on
stderr, and nothing is written to it.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("cuvil_pgc")


class JoinedSession:
    """Stands in for a session while the outer one records (start, stop and step delegate)."""

    def __init__(self, outer: Any, path: str) -> None:
        self.outer = outer
        self.requested_path = path
        self.path = outer.path

    def start(self, record_regions: bool = True) -> JoinedSession:
        if self.requested_path not in self.outer.joined:
            self.outer.joined.append(self.requested_path)
            log.warning("cuvil-pgc: profile(%r) joins the session of `cuvil-pgc profile`; "
                        "its regions are recorded in %s", self.requested_path, self.outer.path)
        return self

    def stop(self) -> str | None:
        """Nothing to finish: the outer session writes the trace when the program ends."""
        return None

    def begin_recording(self) -> None:
        self.outer.begin_recording()

    def step(self) -> None:
        self.outer.step()

    def __enter__(self) -> JoinedSession:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
