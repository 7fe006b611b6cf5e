"""A runtime's first compile of a program, in a process of its own, before the searching process
compiles it.

A runtime's compiler is native code, and a fault there ends the process that called it. OpenVINO
2026.4's CPU plugin died with SIGFPE compiling a Gemma2's graph at bf16 (the same graph compiled at
f32): `cuvil-pgc recompile` ended in "Floating point exception", the search and everything it had
measured lost, with no word of why. Compiled first in a child process, such a program is a
rejected candidate with the reason; the search goes on.

A compile that passed is remembered next to the program (a marker per configuration and runtime
version), so a program is compiled apart once per machine cache, not once per search. A loaded
build's programs are not compiled apart: the search compiled each of them first.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

#: how long a compile apart may take (a large model's program at bf16 takes tens of seconds)
TIMEOUT_S = 900.0

_OPENVINO = """
import sys, openvino as ov
core = ov.Core()
core.compile_model(core.read_model(sys.argv[1]), "CPU", dict(__import__("json").loads(sys.argv[2])))
"""


class CompileFault(RuntimeError):
    """The runtime's compiler ended its process, or did not finish, compiling a program."""


def openvino_compiles(xml_path: str, config: dict[str, str]) -> None:
    """Compile the OpenVINO program ``xml_path`` with the CPU plugin's ``config`` in a child process
    (once per program, configuration and OpenVINO version); raises :class:`CompileFault` where the
    child died or timed out. An error the child raised as an exception is left to the caller's own
    compile, which raises it where it can be read."""
    import openvino as ov

    _compiles_apart(_OPENVINO, xml_path, config, f"OpenVINO {ov.__version__}")


def _compiles_apart(code: str, path: str, config: dict[str, str], runtime: str) -> None:
    marker = _marker(path, config, runtime)
    if marker.exists():
        return
    try:
        done = subprocess.run([sys.executable, "-c", code, path, json.dumps(config)], capture_output=True,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        raise CompileFault(f"{runtime} did not finish compiling the program in {TIMEOUT_S:.0f} s (in a process of "
                           f"its own; {_settings(config)})") from None
    if done.returncode < 0:
        name = _signal_name(-done.returncode)
        raise CompileFault(f"{runtime} crashed compiling the program ({name}, in a process of its own; "
                           f"{_settings(config)}): a fault of the runtime with this program and configuration")
    if done.returncode == 0:
        marker.touch()


def _marker(path: str, config: dict[str, str], runtime: str) -> Path:
    digest = hashlib.sha256(json.dumps([runtime, sorted(config.items())]).encode()).hexdigest()[:16]
    return Path(f"{path}.{digest}.compiles")


def _settings(config: dict[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(config.items()))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"
