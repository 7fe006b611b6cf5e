"""Which trace files a command line names: files, globs, and directories of traces.

``trace_files(inputs)``: a file stays as it is (the reader reports a missing one); a glob expands
(sorted; one that matches nothing is an error); a directory contributes its trace files
(:data:`TRACE_PATTERNS`, recursively, sorted; none is an error). Duplicates are dropped, the
first occurrence kept.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from cuvil_pgc.errors import TraceError

TRACE_PATTERNS = ("*.trace.json", "*.trace.json.gz", "*.pt.trace.json", "*.pt.trace.json.gz", "*.summary.json")


def trace_files(inputs: Sequence[str | os.PathLike[str]]) -> list[str]:
    """Trace files named by ``inputs`` (see the module docstring)."""
    out: list[str] = []
    for item in inputs:
        text = os.fspath(item)
        if os.path.isdir(text):
            found = sorted({f for pat in TRACE_PATTERNS
                            for f in glob.glob(os.path.join(glob.escape(text), "**", pat), recursive=True)})
            if not found:
                raise TraceError("holds no trace files (*.trace.json[.gz], *.pt.trace.json[.gz], *.summary.json)",
                                 path=text, fix="pass the directory the traces were written to, or a glob")
            out += found
        elif glob.has_magic(text) and not os.path.exists(text):
            found = sorted(glob.glob(text, recursive=True))
            if not found:
                raise TraceError(f"the pattern {text!r} matches no files", fix="check the glob (quote it for the shell)")
            out += found
        else:
            out.append(text)
    seen: set[str] = set()
    return [p for p in out if not (p in seen or seen.add(p))]
