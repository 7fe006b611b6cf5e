"""Hints the CLI gives must work when taken literally."""

from __future__ import annotations

import importlib

import pytest
import torch

from cuvil_pgc.recompile.accuracy import check_outputs


def test_an_internal_error_says_how_to_rerun_for_the_traceback(monkeypatch, capsys):
    """``--debug`` is the top-level option: the hint said "rerun with --debug", and
    ``cuvil-pgc analyze --debug ...`` is a usage error."""
    def broken(*_a, **_k):
        raise KeyError("boom")

    cli_app = importlib.import_module("cuvil_pgc.cli.app")     # the package re-exports the Typer app as `app`
    monkeypatch.setattr(cli_app, "app", broken)
    with pytest.raises(SystemExit) as exit_:
        cli_app.main(["analyze", "run.trace.json"])
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "internal error: KeyError" in err and "rerun as `cuvil-pgc --debug analyze ...` for the traceback" in err


def test_the_guard_says_what_sequence_it_got():
    check = check_outputs((torch.ones(2), torch.ones(2)), (torch.ones(2),))
    assert check.reason == "output: expected a tuple of 2, got a tuple of 1"
    assert check_outputs([torch.ones(2)], torch.ones(2)).reason == "output: expected a list of 1, got a Tensor"
