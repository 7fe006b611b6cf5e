"""The commands of builds and the build store: ``keygen`` and ``verify`` (signing), and the
``builds`` group (``push|list|promote|tag|rollback|log|trust|repair``, with ``--store DIR`` or
$CUVIL_STORE).

Every command prints a table or one line on stdout, or with ``--json`` exactly one JSON document.
Failures raise CuvilError subclasses, which the CLI prints as one line on stderr with a non-zero exit.
"""

from __future__ import annotations

from typing import Any

import typer

from cuvil_pgc.cli.output import emit, emit_json

_STORE_HELP = "Build store directory (default: $CUVIL_STORE)."


def register_signing(app: typer.Typer) -> None:
    """``keygen`` and ``verify``."""
    _register_keygen(app)
    _register_verify(app)


def register_store(app: typer.Typer) -> None:
    """The ``builds`` group."""
    builds = typer.Typer(name="builds", help="Versioned build store: push, promote, tag, roll back.",
                         no_args_is_help=True)
    _register_builds(builds)
    app.add_typer(builds, name="builds")


def _register_keygen(app: typer.Typer) -> None:
    @app.command()
    def keygen(output: str = typer.Option(..., "-o", "--output", help="Private key path; KEY.pub is written beside it.")
               ) -> None:
        """Create an Ed25519 key pair for signing builds (private key mode 0600)."""
        from cuvil_pgc.recompile.signing import generate_keypair, key_id, load_public_key

        private, public = generate_keypair(output)
        typer.echo(f"private key {private} (keep it secret), public key {public}, "
                   f"key id {key_id(load_public_key(public))}")


def _register_verify(app: typer.Typer) -> None:
    @app.command()
    def verify(
        build: str = typer.Argument(..., help="A .cuvilpkg file or a store://NAME[@VERSION|@TAG] reference."),
        pubkey: str | None = typer.Option(None, "--pubkey", help="Signer's public key; requires a valid signature."),
        allow_unsigned: bool = typer.Option(
            False, "--allow-unsigned", help="Without a trusted key, check integrity only and exit 0 (logged)."),
        store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Verify a build (structure, member digests, signature by a trusted key) and print its manifest.

        Exits 1 unless the build is signed by a trusted key (--pubkey, the store's trusted.pub or
        $CUVIL_TRUSTED_KEY), or --allow-unsigned is given.
        """
        from cuvil_pgc.recompile.trust import open_trusted
        from cuvil_pgc.viewer.console_builds import verify_table

        with open_trusted(build, store=store, pubkey=pubkey, allow_unsigned=allow_unsigned or None) as verified:
            summary = verified.summary()
        if as_json:
            emit_json(summary)
            return
        from rich.console import Console

        Console(soft_wrap=True).print(verify_table(summary))
        if not summary["signature"]["verified"]:
            typer.echo("warning: signature not checked (--allow-unsigned); pass --pubkey KEY.pub to require one",
                       err=True)


def _register_builds(builds: typer.Typer) -> None:
    @builds.command("push")
    def push(build: str = typer.Argument(..., help="The .cuvilpkg to add."),
             store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
             pubkey: str | None = typer.Option(None, "--pubkey",
                                                  help="Require a signature by this key (the store's trusted.pub wins)."),
             as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """Verify a build and add it to the store under its name and version."""
        result = _store(store).push(build, pubkey)
        _report(as_json, result, f"{'pushed' if result.added else 'already in the store:'} "
                                 f"{result.name} v{result.version} -> {result.path}")

    @builds.command("list")
    def list_builds(name: str | None = typer.Argument(None, help="Only this build name."),
                    store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
                    as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
                    csv_out: bool = typer.Option(False, "--csv", help="Print the table as CSV."),
                    wide: bool = typer.Option(False, "--wide", help="Every column, whatever the width.")) -> None:
        """List stored versions and the pointers (current, tags) at each."""
        from cuvil_pgc.viewer.console_builds import entries_view

        entries = _store(store).entries(name)
        if as_json:
            emit_json({"builds": [_builtins(e) for e in entries]})
        else:
            emit(entries_view(entries), _console(), as_csv=csv_out, wide=wide)

    @builds.command("promote")
    def promote(name: str = typer.Argument(...), version: int = typer.Argument(...),
                store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
                reason: str | None = typer.Option(None, "--reason", help="Recorded in the log."),
                as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """Make VERSION current (refused below the high-water mark: use rollback)."""
        _report_move(as_json, _store(store).promote(name, version, reason=reason))

    @builds.command("tag")
    def tag(name: str = typer.Argument(...), version: int = typer.Argument(...),
            tag_name: str = typer.Argument(..., metavar="TAG", help="canary, stable, ..."),
            store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
            reason: str | None = typer.Option(None, "--reason", help="Recorded in the log."),
            as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """Point TAG at VERSION (tags follow the same anti-rollback rule as current)."""
        _report_move(as_json, _store(store).tag(name, version, tag_name, reason=reason))

    @builds.command("rollback")
    def rollback(name: str = typer.Argument(...),
                 to: int | None = typer.Option(None, "--to", help="Target version (default: the previous one)."),
                 tag_name: str | None = typer.Option(None, "--tag", help="Roll back this tag instead of current."),
                 reason: str | None = typer.Option(None, "--reason", help="Recorded in the log."),
                 store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
                 as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """Move current (or --tag) back on purpose; recorded in the store log."""
        _report_move(as_json, _store(store).rollback(name, to=to, tag=tag_name, reason=reason))

    @builds.command("log")
    def log(name: str = typer.Argument(...), store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
            as_json: bool = typer.Option(False, "--json", help="Print one JSON document."),
            csv_out: bool = typer.Option(False, "--csv", help="Print the table as CSV."),
            wide: bool = typer.Option(False, "--wide", help="Every column, whatever the width.")) -> None:
        """Show the append-only history of pushes, promotions, tags and rollbacks."""
        from cuvil_pgc.viewer.console_builds import log_view

        entries = _store(store).log(name)
        if as_json:
            emit_json({"log": [_builtins(e) for e in entries]})
        else:
            emit(log_view(name, entries), _console(), as_csv=csv_out, wide=wide)

    @builds.command("repair")
    def repair(name: str = typer.Argument(...),
               from_state: bool = typer.Option(False, "--from-state",
                                               help="The log is damaged or missing: start a new one from state.json."),
               store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
               as_json: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """Make state.json agree with the log again (rewritten from the log; the old file is kept)."""
        done = _store(store).repair(name, from_state=from_state)
        if as_json:
            emit_json({"name": name, "done": done})
        else:
            typer.echo("\n".join(f"{name}: {line}" for line in done))

    @builds.command("trust")
    def trust(pubkey: str = typer.Argument(..., help="Public key whose signature every stored build must carry."),
              store: str | None = typer.Option(None, "--store", help=_STORE_HELP),
              replace: bool = typer.Option(False, "--replace", help="Replace a different trusted key.")) -> None:
        """Make the store accept and serve only builds signed by this key (writes trusted.pub)."""
        target = _store(store)
        typer.echo(f"{target.root} now trusts key {target.trust(pubkey, replace=replace)}")


def _store(store: str | None):
    from cuvil_pgc.recompile.store import store_from_env

    return store_from_env(store)


def _report_move(as_json: bool, move) -> None:
    if not move.changed:
        text = f"{move.name} {move.pointer} is already v{move.version} (nothing changed)"
    else:
        text = f"{move.name} {move.pointer}: {'none' if move.previous is None else 'v' + str(move.previous)} -> v{move.version}"
    _report(as_json, move, text)


def _report(as_json: bool, obj: Any, text: str) -> None:
    if as_json:
        emit_json(_builtins(obj))
    else:
        typer.echo(text)


def _builtins(obj: Any) -> Any:
    import msgspec

    return msgspec.to_builtins(obj)


def _console() -> Any:
    from rich.console import Console

    return Console()
