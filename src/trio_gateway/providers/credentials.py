"""Where each provider's credential comes from, read once at start-up.

An API key (or a ready Vertex access token) comes from an environment variable or a file; a
Vertex service account from its JSON file, exchanged for tokens as they are needed. Values are
kept in :class:`~trio_gateway.config.schema.Secret` and :class:`TokenSource` objects whose
reprs hide them; none is ever put in a log line or an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import httpx

from trio_gateway.config.schema import ProviderConfig, Secret
from trio_gateway.providers.gemini.vertex_auth import (
    ServiceAccount,
    ServiceAccountTokens,
    StaticToken,
    TokenSource,
)


class CredentialError(Exception):
    """A credential named in config cannot be read; the message names where, never what."""


def read_key_file(path: str) -> Secret:
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8 text"
        raise CredentialError(f"cannot read {path}: {reason}") from None
    if not text:
        raise CredentialError(f"{path} is empty")
    return Secret(text)


def credential_source(
    provider: ProviderConfig, keys: Mapping[str, Secret], client: httpx.AsyncClient
) -> TokenSource | None:
    """The provider's credential, or None when it needs none. ``keys`` holds the values config
    already read from the environment; ``client`` is the pool a token exchange uses."""
    if provider.credentials_file is not None:
        try:
            text = Path(provider.credentials_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else "not UTF-8"
            raise CredentialError(f"cannot read {provider.credentials_file}: {reason}") from None
        try:
            account = ServiceAccount.from_json(text, source=provider.credentials_file)
        except ValueError as exc:
            raise CredentialError(str(exc)) from None
        return ServiceAccountTokens(account, client, provider=provider.name)
    if provider.api_key_file is not None:
        return StaticToken(read_key_file(provider.api_key_file))
    key = keys.get(provider.name)
    return StaticToken(key) if key is not None else None
