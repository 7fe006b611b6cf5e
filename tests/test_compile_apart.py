"""A runtime's compiler that faults ends the process that called it: OpenVINO 2026.4 died with
SIGFPE compiling a Gemma2's graph at bf16, and `cuvil-pgc recompile` ended with "Floating point
exception", the search lost. Each program is compiled first in a process of its own."""

from __future__ import annotations

import subprocess

import pytest
import torch
from torch import nn

from cuvil_pgc.recompile import compile_apart, runtimes

CRASHES = "import os, signal; os.kill(os.getpid(), signal.SIGFPE)"
RAISES = "raise ValueError('a compile error the caller reads itself')"
COMPILES = "import sys; assert len(sys.argv) == 3"      # the program's path and its configuration


def test_a_compile_that_kills_its_process_is_a_fault_named_by_its_signal(tmp_path):
    program = tmp_path / "p.xml"
    program.write_text("<net/>")
    with pytest.raises(compile_apart.CompileFault, match=r"Runtime 1\.0 crashed compiling the program \(SIGFPE, "
                                                         r"in a process of its own; PRECISION=bf16\)"):
        compile_apart._compiles_apart(CRASHES, str(program), {"PRECISION": "bf16"}, "Runtime 1.0")
    assert not list(tmp_path.glob("*.compiles"))


def test_a_compile_that_passed_is_not_repeated_and_one_that_raised_is_left_to_the_caller(tmp_path, monkeypatch):
    program = tmp_path / "p.xml"
    program.write_text("<net/>")
    compile_apart._compiles_apart(RAISES, str(program), {"PRECISION": "f32"}, "Runtime 1.0")
    assert not list(tmp_path.glob("*.compiles"))          # its own compile raises the error, readable
    compile_apart._compiles_apart(COMPILES, str(program), {"PRECISION": "f32"}, "Runtime 1.0")
    assert len(list(tmp_path.glob("*.compiles"))) == 1

    def no_child(*a, **k):
        raise AssertionError("compiled apart again")

    monkeypatch.setattr(subprocess, "run", no_child)
    compile_apart._compiles_apart(CRASHES, str(program), {"PRECISION": "f32"}, "Runtime 1.0")
    with pytest.raises(AssertionError):                   # another configuration, or runtime version: again
        compile_apart._compiles_apart(CRASHES, str(program), {"PRECISION": "bf16"}, "Runtime 1.0")


@pytest.mark.usefixtures("build_env")
@pytest.mark.skipif(not runtimes.check("openvino").ok, reason="needs openvino")
def test_the_search_rejects_a_candidate_whose_compile_crashed_and_goes_on(monkeypatch):
    from cuvil_pgc.recompile import runtime_build
    from cuvil_pgc.recompile import search as search_mod
    from cuvil_pgc.recompile.trials import SearchOptions

    real = runtime_build.openvino_compiles

    def faults_at_bf16(path, config):
        if config["INFERENCE_PRECISION_HINT"] == "bf16":
            compile_apart._compiles_apart(CRASHES, path, config, "OpenVINO")
        real(path, config)

    monkeypatch.setattr(runtime_build, "openvino_compiles", faults_at_bf16)
    monkeypatch.setattr(runtimes, "openvino_native_bf16", lambda: True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).eval()
    options = SearchOptions(budget=3, backends=("openvino",), rounds=3, deployed_race=False)
    result = search_mod.search(model, (torch.randn(2, 16),), None, options=options, records=None, machine_key="m")
    bf16 = result.trials["<model>::openvino+bf16"]
    assert bf16.status == "compile_error" and "crashed compiling the program (SIGFPE" in bf16.reason, bf16
    assert result.trials["<model>::openvino"].status == "ok"
