"""A service process for end-to-end tests: a script run in a fresh interpreter that imports this
checkout's cuvil_pgc, as a deployment imports the installed one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import cuvil_pgc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(cuvil_pgc.__file__)))


def run_service(script: str, *args: Any, cwd: str | os.PathLike[str]) -> dict[str, Any]:
    """Run ``script`` (written to ``cwd/service.py``) with ``args``; the JSON object its last
    stdout line holds. Fails the test, with the script's stderr, when it exits non-zero."""
    path = Path(cwd) / "service.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run([sys.executable, str(path), *map(str, args)], capture_output=True, text=True,
                          timeout=600, cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
