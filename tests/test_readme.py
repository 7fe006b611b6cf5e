"""The README: its two set-up commands and a CLI reference that matches the CLI."""

from __future__ import annotations

from pathlib import Path

from cuvil_pgc.cli.reference import END, START, reference

README = Path(__file__).resolve().parent.parent / "README.md"


def test_cli_reference_is_in_sync():
    text = README.read_text(encoding="utf-8")
    assert START in text and END in text, "README lacks the cli-reference markers"
    current = text[text.index(START):text.index(END) + len(END)]
    assert current == reference(), "README's CLI reference is stale: run `python -m cuvil_pgc.cli.reference --update README.md`" \
                                   " and paste its output between the markers"


def test_readme_opens_with_the_two_setup_commands():
    lines = [line for line in README.read_text(encoding="utf-8").splitlines() if line.strip()]
    block = lines[lines.index("```bash") + 1:lines.index("```bash") + 3]
    assert "cuvil-pgc demo" in block[0] and "pip install" in block[0]
    assert "pytest" in block[1]
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    command = block[1].split("&&")[-1].strip()          # the test command, as CI runs it
    assert command.startswith("python -m pytest -q") and f"{command} " in ci



def test_groups_that_run_by_themselves_have_an_entry():
    """``cuvil-pgc cache`` prints the cache's size; it is a command as much as ``cache clear`` is."""
    import typer.main

    from cuvil_pgc.cli import app

    text = reference()
    root = typer.main.get_command(app)
    runnable = [name for name, cmd in root.commands.items()
                if hasattr(cmd, "commands") and getattr(cmd, "invoke_without_command", False)]
    assert "cache" in runnable
    for name in runnable:
        assert f"**`cuvil-pgc {name}`**" in text, name
    assert "cuvil-pgc cache [OPTIONS] [COMMAND [ARGS]...]" in text
