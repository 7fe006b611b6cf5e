"""Usage errors of the CLI on a fresh install: one line on stderr, exit 2, no traceback.

typer 0.29 vendors its own click and no longer installs click: the CLI must not need it. Each
case runs in a subprocess where ``import click`` fails, whatever this machine has installed.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

_NO_CLICK = (
    "import sys; sys.modules['click'] = None\n"   # `import click` raises ImportError
    "from cuvil_pgc.cli import main\n"
    "main(sys.argv[1:])\n"
)


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _NO_CLICK, *args], capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("args, says", [
    (["analyze"], "Missing argument"),
    (["recompile", "run.trace.json"], "Missing option '--model'"),
    (["analyze", "--top", "abc", "run.trace.json"], "'--top'"),
    (["anlyze"], "No such command 'anlyze'"),
])
def test_usage_errors_are_one_line_with_exit_2_without_click(args, says):
    proc = _run(*args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert says in lines[0] and lines[0].startswith("cuvil-pgc: error: ")
    assert "-h" in lines[0]            # says where the usage is
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_help_exits_0_without_click():
    proc = _run("analyze", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "TRACE" in proc.stdout
