"""Which builds this process trusts: secure by default, opt-in to unsigned builds on purpose.

Every way of opening a build to use it (``load_build``, ``compare``, ``verify``, ``report --build``)
goes through :func:`open_trusted`. A build is accepted only when it carries a valid signature by a
trusted key, checked by :func:`~cuvil_pgc.recompile.package.open_build` before the manifest is
parsed and before any member is read, extracted or loaded. The trusted key is, first found wins:

1. the caller's: ``pubkey=`` / ``--pubkey KEY.pub``;
2. for ``store://`` references, the store's ``trusted.pub`` (``cuvil-pgc builds trust``);
3. ``$CUVIL_TRUSTED_KEY``: the path of one public key file (:data:`ENV_TRUSTED_KEY`).

With no trusted key the build is refused with a :class:`BuildError` that says how to get one,
unless the caller opts in to builds nobody vouches for: ``allow_unsigned=True``,
``--allow-unsigned``, or ``CUVIL_ALLOW_UNSIGNED=1`` (:data:`ENV_ALLOW_UNSIGNED`). Such a build is
still checked for integrity (member digests), and the opt-in is logged as a warning naming it.
An opt-in never weakens a key: with a trusted key, an unsigned or foreign-signed build is refused.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

from cuvil_pgc.errors import BuildError, ConfigError

log = logging.getLogger(__name__)

ENV_TRUSTED_KEY = "CUVIL_TRUSTED_KEY"
ENV_ALLOW_UNSIGNED = "CUVIL_ALLOW_UNSIGNED"
#: the private key ``recompile`` signs with when ``--sign`` is not given
ENV_SIGNING_KEY = "CUVIL_SIGNING_KEY"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("", "0", "false", "no", "off")

HOW_TO_TRUST = ("sign builds with `cuvil-pgc keygen -o release.key` and `recompile --sign release.key`, then "
                "pass the public key (pubkey='release.key.pub' / --pubkey release.key.pub), set "
                f"{ENV_TRUSTED_KEY}=release.key.pub, or trust it in the store (`cuvil-pgc builds trust`); "
                f"to load an unsigned build on purpose: allow_unsigned=True / --allow-unsigned / "
                f"{ENV_ALLOW_UNSIGNED}=1")


UNSIGNED_NOTE = ("the build is unsigned, and load_build, compare and verify refuse unsigned builds by default: "
                 "create a key once with `cuvil-pgc keygen -o release.key`, then sign with --sign release.key "
                 f"(or set {ENV_SIGNING_KEY}=release.key) and load with pubkey='release.key.pub'")


def configured_signing_key(sign: str | None) -> str | None:
    """The private key file to sign a new build with: ``--sign``, else ``$CUVIL_SIGNING_KEY``, else None."""
    return sign or os.environ.get(ENV_SIGNING_KEY, "").strip() or None


@dataclass(frozen=True)
class TrustPolicy:
    """The key a build must be signed by (None: none configured) and whether unsigned ones may load."""

    pubkey: Any
    allow_unsigned: bool
    key_source: str      # "pubkey=", "$CUVIL_TRUSTED_KEY", "" (none)


def trust_policy(pubkey: Any = None, allow_unsigned: bool | None = None) -> TrustPolicy:
    """The caller's key, else ``$CUVIL_TRUSTED_KEY``; the caller's opt-in, else ``$CUVIL_ALLOW_UNSIGNED``."""
    if pubkey is not None:
        source = "pubkey="
    else:
        env_key = os.environ.get(ENV_TRUSTED_KEY, "").strip()
        pubkey, source = (env_key, f"${ENV_TRUSTED_KEY}") if env_key else (None, "")
    if allow_unsigned is None:
        allow_unsigned = _env_flag(ENV_ALLOW_UNSIGNED)
    return TrustPolicy(pubkey, bool(allow_unsigned), source)


def _env_flag(name: str) -> bool:
    value = os.environ.get(name, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigError(f"${name}={value!r} is not a yes/no value", fix=f"set {name}=1 to opt in, or unset it")


def open_trusted(source: str | os.PathLike[str], *, store: Any = None, pubkey: Any = None,
                 allow_unsigned: bool | None = None) -> Any:
    """Open a build path or ``store://`` reference if this process trusts it; a VerifiedBuild.

    Raises BuildError (before anything of the build is parsed) when no trusted key is configured
    and unsigned builds are not allowed, or when the signature is missing or by another key.
    """
    from cuvil_pgc.recompile.package import open_build
    from cuvil_pgc.recompile.store import is_store_ref, store_from_env

    policy = trust_policy(pubkey, allow_unsigned)
    if isinstance(source, str) and is_store_ref(source):
        target = store_from_env(store)
        if policy.pubkey is not None or target.trusted_key() is not None:
            return target.open(source, policy.pubkey)
        _require_opt_in(policy, source)
        return _logged(target.open(source, None), source)
    if policy.pubkey is not None:
        return open_build(source, policy.pubkey, require_signature=True)
    _require_opt_in(policy, os.fspath(source))
    return _logged(open_build(source, None), os.fspath(source))


def _require_opt_in(policy: TrustPolicy, source: str) -> None:
    if not policy.allow_unsigned:
        raise BuildError("refusing to open a build without a trusted key to check its signature", path=source,
                         fix=HOW_TO_TRUST)


def _logged(build: Any, source: str) -> Any:
    state = (f"signed by key {build.key_id}, signature NOT checked" if build.signed else "unsigned")
    log.warning("cuvil-pgc: %s: opening a build nobody vouches for (%s; unsigned builds allowed by the "
                "caller or $%s)", source, state, ENV_ALLOW_UNSIGNED)
    return build
