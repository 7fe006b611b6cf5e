"""Quiet by default: third-party output of candidate builds goes to a log next to the build."""

from __future__ import annotations

import io
import logging
import os
import sys
import warnings
from types import SimpleNamespace

from typer.testing import CliRunner

from cuvil_pgc._quiet import log_path_for, third_party_output
from cuvil_pgc.cli import app

NATIVE = b"aoti_torch_cpu_mkldnn_rnn_layer(handles...) API call failed at wrapper.cpp, line 42\n"


def _noise() -> None:
    """What a candidate build writes: native stderr, Inductor's AUTOTUNE block, a torch FutureWarning."""
    os.write(2, NATIVE)
    sys.stderr.write("AUTOTUNE mm(64x64, 64x64)\n  mm 0.01 ms 100.0%\n")
    print("Generated Code: ...")
    warnings.warn_explicit("`torch.foo` is deprecated", FutureWarning, "/site-packages/torch/_inductor/x.py", 1)


def test_third_party_output_goes_to_the_log_and_ours_to_the_terminal(tmp_path, monkeypatch, capfd):
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    log = str(tmp_path / "m.build.log")
    with third_party_output(log) as captured:
        _noise()
        for _ in range(3):
            logging.getLogger("cuvil_pgc.recompile.search").warning("this machine's cpu is not calibrated")
    text = open(log).read()
    assert "API call failed" in text and "AUTOTUNE mm" in text and "FutureWarning" in text and "Generated" in text
    assert terminal.getvalue() == "warning: this machine's cpu is not calibrated\n"     # once
    leaked = capfd.readouterr()
    assert "AUTOTUNE" not in leaked.out + leaked.err and "API call failed" not in leaked.err
    assert captured.summary().endswith(f"{log} (--verbose streams it)")


def test_our_warnings_wrap_at_words_to_the_terminal_width(tmp_path, monkeypatch):
    terminal = io.StringIO()
    monkeypatch.setattr(sys, "stderr", terminal)
    monkeypatch.setenv("COLUMNS", "80")
    long = ("this machine's cpu is not calibrated: bottleneck figures use documented fallback peaks; "
            "run `cuvil-pgc calibrate` once (about 20 s) to measure them")
    with third_party_output(str(tmp_path / "m.build.log")):
        logging.getLogger("cuvil_pgc.recompile.search").warning(long)   # a logger no command silences
    lines = terminal.getvalue().splitlines()
    assert len(lines) > 1 and all(len(line) <= 80 for line in lines)
    assert " ".join(lines) == "warning: " + long


def test_verbose_streams_and_writes_no_log(tmp_path, capfd):
    log = str(tmp_path / "m.build.log")
    with third_party_output(log, verbose=True) as captured:
        os.write(2, NATIVE)
    assert not os.path.exists(log) and captured.summary() is None
    assert "API call failed" in capfd.readouterr().err


def test_an_empty_log_is_not_left_behind(tmp_path):
    log = str(tmp_path / "m.build.log")
    with third_party_output(log):
        pass
    assert not os.path.exists(log)


def test_recompile_prints_the_log_path_and_keeps_stdout_clean(tmp_path, monkeypatch):
    import cuvil_pgc.recompile.build as build_mod
    from tests.test_cli_tables import _plan

    def fake_recompile(net, inputs, traces, **kw):
        _noise()
        return SimpleNamespace(plan=_plan("model"), save=lambda *a, **k: None)

    monkeypatch.setattr(build_mod, "recompile", fake_recompile)
    trace = tmp_path / "t.trace.json"
    trace.write_text("{}")
    deep = tmp_path / ("a_directory_" * 8)        # the log's path is wider than the terminal
    deep.mkdir()
    out = str(deep / "model.cuvilpkg")
    result = CliRunner().invoke(app, ["recompile", str(trace), "--model", "cuvil_pgc.zoo:mlp", "-o", out],
                                env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "AUTOTUNE" not in result.stdout and "recompile plan" in result.stdout
    assert log_path_for(out) == str(deep / "model.build.log") and len(log_path_for(out)) > 80
    assert f"lines): {log_path_for(out)}" in " ".join(result.stderr.split())    # wrapped at words
    assert log_path_for(out) in result.stderr.splitlines()       # on a line of its own, whole: it can be copied
    assert all(len(line) <= 80 or " " not in line for line in result.stderr.splitlines())
    assert "API call failed" in open(log_path_for(out)).read()


def test_profile_keeps_kinetos_log_lines_off_the_terminal(tmp_path):
    """Kineto writes ``USDT: ... SyncActivityProfilerHandler.cpp:52] profiler_start`` on fd 2 when
    torch.profiler starts and stops; they cut into the progress display. A child process, so fd 2 is real."""
    import subprocess

    trace = str(tmp_path / "m.trace.json")
    env = {**os.environ, "CUVIL_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "cuvil_pgc", "profile", "--iters", "2", "--warmup", "1",
                           "-o", trace, "--model", "cuvil_pgc.zoo:mlp"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert os.path.exists(trace)
    assert "profiler_start" not in done.stderr and "SyncActivityProfilerHandler" not in done.stderr, done.stderr


def test_kineto_chatter_passes_other_lines_on(capfd):
    from cuvil_pgc._quiet import kineto_chatter

    with kineto_chatter():
        os.write(2, b"USDT:2026-12-02 00:42:31 31309:31309 SyncActivityProfilerHandler.cpp:52] profiler_start\n")
        os.write(2, b"something the user's code said\n")
    err = capfd.readouterr().err
    assert "profiler_start" not in err and "something the user's code said" in err


FAULTING = """
import os, signal, sys
from cuvil_pgc._quiet import third_party_output

def building_a_candidate():
    os.kill(os.getpid(), signal.SIGSEGV)      # as a runtime's compiler dies

with third_party_output(sys.argv[1]):
    print("a runtime's chatter")
    building_a_candidate()
"""


def test_a_native_fault_meanwhile_prints_where_it_happened_on_the_terminal(tmp_path):
    """The runtime's own words are in the log; the terminal got only the shell's "Segmentation
    fault" until the Python stack went there too."""
    import signal
    import subprocess

    log = tmp_path / "m.build.log"
    done = subprocess.run([sys.executable, "-c", FAULTING, str(log)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == -signal.SIGSEGV, done.stderr
    assert "Fatal Python error: Segmentation fault" in done.stderr and "building_a_candidate" in done.stderr
    assert "a runtime's chatter" in log.read_text() and "chatter" not in done.stderr


def test_the_fault_handler_is_left_as_it_was(tmp_path):
    """Off again afterwards where it was off (the terminal stream it wrote to is closed)."""
    import subprocess

    code = ("import faulthandler, sys\nfrom cuvil_pgc._quiet import third_party_output\n"
            "before = faulthandler.is_enabled()\n"
            "with third_party_output(sys.argv[1]):\n    during = faulthandler.is_enabled()\n"
            "print(before, during, faulthandler.is_enabled())")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m.build.log")], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stdout.split() == ["False", "True", "False"]
