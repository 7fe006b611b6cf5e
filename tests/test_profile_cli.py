"""`cuvil-pgc profile` runs a script as Python does: its arguments are its own, and its own
profile() joins the outer session."""

from __future__ import annotations

import json
import os
import textwrap

import pytest
from typer.testing import CliRunner

from cuvil_pgc.cli import app
from cuvil_pgc.cli._script_args import split_argv

QUIET = ["--no-ops", "--gpu", "off", "--sample-hz", "0"]
VALUE_OPTIONS = {"-o", "--output", "-m", "--model", "--gpu"}


@pytest.mark.parametrize("argv, head, tail", [
    (["app.py", "--foo", "1", "-o", "x.json"], ["app.py"], ["--foo", "1", "-o", "x.json"]),
    (["-o", "t.json", "app.py", "-o", "x"], ["-o", "t.json", "app.py"], ["-o", "x"]),
    (["--gpu", "off", "app.py"], ["--gpu", "off", "app.py"], []),
    (["--gpu=off", "app.py", "a"], ["--gpu=off", "app.py"], ["a"]),
    (["-m", "pkg.mod", "-o", "x", "--help"], ["-m", "pkg.mod"], ["-o", "x", "--help"]),
    (["-mpkg.mod", "-v"], ["-mpkg.mod"], ["-v"]),
    (["--", "app.py", "--x"], ["--", "app.py"], ["--x"]),
    (["--model", "m:f"], ["--model", "m:f"], []),
])
def test_split_stops_at_the_script_as_python_does(argv, head, tail):
    assert split_argv(argv, VALUE_OPTIONS) == (head, tail)


def _write(path, text: str) -> str:
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_options_after_the_script_are_the_scripts(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = _write(tmp_path / "echoargs.py", """
        import json, sys
        json.dump(sys.argv, open("argv.json", "w"))
    """)
    result = CliRunner().invoke(app, ["profile", *QUIET, script, "--foo", "1", "-o", "x.json"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "argv.json").read_text()) == [script, "--foo", "1", "-o", "x.json"]
    assert os.path.exists("echoargs.trace.json") and not os.path.exists("x.json")


def test_module_gets_everything_after_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _write(tmp_path / "echomod.py", """
        import json, sys
        json.dump(sys.argv[1:], open("argv.json", "w"))
    """)
    result = CliRunner().invoke(app, ["profile", *QUIET, "-o", "m.trace.json", "-m", "echomod", "-o", "y", "--help"])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "argv.json").read_text()) == ["-o", "y", "--help"]
    assert os.path.exists("m.trace.json")


def test_a_scripts_own_profile_joins_the_outer_session(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    script = _write(tmp_path / "selfprofiling.py", """
        import cuvil_pgc
        with cuvil_pgc.profile("inner.trace.json", ops=False) as session:
            with cuvil_pgc.ProfileRegion("work"):
                sum(range(1000))
            session.step()
    """)
    result = CliRunner().invoke(app, ["profile", *QUIET, "-o", "outer.trace.json", script])
    assert result.exit_code == 0, result.output
    assert not os.path.exists("inner.trace.json")
    doc = json.loads((tmp_path / "outer.trace.json").read_text())
    assert doc["cuvil"]["joined"] == ["inner.trace.json"]
    assert any(e.get("name") == "work" for e in doc["traceEvents"])


def test_two_sessions_in_a_program_get_an_error_saying_what_to_do(tmp_path):
    from cuvil_pgc import profile
    from cuvil_pgc.errors import SessionError

    with profile(str(tmp_path / "a.trace.json"), ops=False, gpu="off", sample_hz=0):
        with pytest.raises(SessionError, match="active_session"):
            profile(str(tmp_path / "b.trace.json"), ops=False, gpu="off", sample_hz=0).start()


@pytest.mark.parametrize("flags, expected", [
    ([], {"record_shapes": True, "with_stack": False, "profile_memory": False}),
    (["--no-record-shapes", "--with-stack", "--profile-memory"],
     {"record_shapes": False, "with_stack": True, "profile_memory": True}),
])
def test_torch_profiler_flags_reach_the_traces_config(tmp_path, monkeypatch, flags, expected):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "work.py").write_text("import torch\ntorch.randn(8, 8) @ torch.randn(8, 8)\n")
    result = CliRunner().invoke(app, ["profile", "--gpu", "off", "--sample-hz", "0", *flags,
                                      "-o", "w.trace.json", "work.py"])
    assert result.exit_code == 0, result.output
    with open(tmp_path / "w.trace.json") as f:
        config = json.load(f)["cuvil"]["config"]
    assert {k: config[k] for k in expected} == expected


def test_every_profiled_call_of_a_decoding_step_gets_the_examples_cache(tmp_path, monkeypatch):
    """A decoding step extends the cache it is given: the profile's iterations saw it a token longer
    each, and the factory's check call left the example one longer than the factory made it."""
    monkeypatch.chdir(tmp_path)
    spec = _write(tmp_path / "stepspec.py", """
        import torch

        SEEN = []

        class Layer:
            def __init__(self):
                self.keys = torch.zeros(1, 3)

        class Cache:
            def __init__(self):
                self.layers = [Layer()]

        class Step(torch.nn.Module):
            def forward(self, x, cache):
                layer = cache.layers[0]
                SEEN.append(layer.keys.shape[1])
                layer.keys = torch.cat([layer.keys, x], 1)      # as a Hugging Face layer extends its keys
                return layer.keys.sum()

        def factory():
            return Step(), (torch.ones(1, 1), Cache())

        def seen():
            return SEEN
    """)
    result = CliRunner().invoke(app, ["profile", *QUIET, "--iters", "4", "--warmup", "2", "--model", f"{spec}:factory",
                                      "-o", "step.trace.json"])
    assert result.exit_code == 0, result.output
    import sys
    seen = sys.modules["stepspec"].seen()
    assert seen == [3] * 7          # the check call, 2 warm-up and 4 recorded iterations
