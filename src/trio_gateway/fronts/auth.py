"""Where a front finds the caller's API key, and what the key may do with a request.

Over HTTP the key is ``Authorization: Bearer KEY``, or ``x-api-key: KEY`` as Anthropic's
clients send it (the SDKs, Claude Code): a bearer token wins when both are there. A WebSocket
upgrade may carry that header too; a browser, which cannot set headers on one, offers the
subprotocol ``bearer.KEY`` alongside ``trio-gateway``, or appends ``?access_token=KEY`` to the
URL.

RFC 6455: a server that accepts a subprotocol answers with one the client offered. The gateway
answers ``trio-gateway`` when it was offered, and never echoes ``bearer.KEY`` (the key would be
in the response), so a ``bearer.`` subprotocol offered without ``trio-gateway`` is refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import parse_qs

import attrs

from trio_gateway.accounting.key_store import KeyStore
from trio_gateway.config.schema import AliasConfig
from trio_gateway.core.errors import InvalidRequest
from trio_gateway.core.keys import ApiKey, bearer_token
from trio_gateway.core.priority import effective_priority
from trio_gateway.core.request import ChatRequest
from trio_gateway.fronts.http import Scope, header

SUBPROTOCOL = "trio-gateway"
BEARER_SUBPROTOCOL = "bearer."
ACCESS_TOKEN_PARAM = "access_token"


def http_key(scope: Scope, keys: KeyStore | None) -> ApiKey | None:
    """The caller's key (None when the gateway serves without keys), or 401."""
    if keys is None:
        return None
    token = bearer_token(header(scope, b"authorization"))
    if token is None:
        api_key = header(scope, b"x-api-key")
        token = (api_key.decode("latin-1").strip() or None) if api_key is not None else None
    return keys.authenticate(token)


@attrs.frozen(kw_only=True)
class Handshake:
    """What a WebSocket upgrade presented: the key, if any, and the subprotocol to accept."""

    key: str | None
    subprotocol: str | None


def websocket_handshake(scope: Scope) -> Handshake:
    """Read the key from the headers (``Authorization: Bearer``, then ``x-api-key``), a
    ``bearer.`` subprotocol or the query, in that order."""
    offered: list[str] = list(scope.get("subprotocols") or [])
    subprotocol = SUBPROTOCOL if SUBPROTOCOL in offered else None
    tokens = [p[len(BEARER_SUBPROTOCOL) :] for p in offered if p.startswith(BEARER_SUBPROTOCOL)]
    if tokens and subprotocol is None:
        raise InvalidRequest(
            f"offer the subprotocol {SUBPROTOCOL!r} along with '{BEARER_SUBPROTOCOL}<key>': "
            f"the gateway accepts {SUBPROTOCOL!r} and never echoes a key"
        )
    key = bearer_token(header(scope, b"authorization"))
    if key is None:
        api_key = header(scope, b"x-api-key")
        key = (api_key.decode("latin-1").strip() or None) if api_key is not None else None
    if key is None and tokens:
        key = tokens[0] or None
    if key is None:
        query = parse_qs(bytes(scope.get("query_string", b"")).decode("latin-1"))
        values = query.get(ACCESS_TOKEN_PARAM)
        key = values[0] if values else None
    return Handshake(key=key, subprotocol=subprotocol)


def authorize(request: ChatRequest, key: ApiKey | None) -> ChatRequest:
    """The request, named after its key; 403 ``alias_not_allowed`` if the key may not use its
    alias. Checked before routing, so a restricted key never learns the other aliases."""
    if key is None:
        return request
    key.check_alias(request.alias)
    return attrs.evolve(request, key_name=key.name)


def prioritize(
    request: ChatRequest,
    key: ApiKey | None,
    aliases: Mapping[str, AliasConfig],
    header: str | None = None,
) -> ChatRequest:
    """The request at its priority (core/priority.py): its key's, else its alias's, or the
    lower one the client asked for with ``x-priority`` (``header``) or the body's ``priority``."""
    if key is not None and key.priority is not None:
        own, whose = key.priority, f"key {key.name!r}"
    else:
        alias = aliases.get(request.alias)
        own = alias.priority if alias is not None else 0
        whose = f"alias {request.alias!r}"
    priority = effective_priority(own, whose, header, request.body.get("priority"))
    return attrs.evolve(request, priority=priority) if priority else request


def with_session(request: ChatRequest, session_id: str | None) -> ChatRequest:
    """The request with its client's ``x-session-id`` (blank: none), for replica affinity."""
    session = (session_id or "").strip()
    return attrs.evolve(request, session_id=session) if session else request
