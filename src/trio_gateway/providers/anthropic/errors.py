"""Anthropic's errors → the gateway's: an answer's status and body, or an ``event: error`` in
the stream (which has a type only, and is classified as if it had come with its status). Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from trio_gateway.core.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotServed,
    QuotaExhausted,
    UpstreamAuthFailed,
    UpstreamOverloaded,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamServerError,
    UpstreamTimeout,
)
from trio_gateway.providers.errors import MAX_MESSAGE_CHARS, is_context_length, parse_retry_after
from trio_gateway.providers.translate import redact_credentials

# An error's type → the HTTP status Anthropic gives it: an error inside a stream has a type
# only, and is classified as if it had come with its status.
_ERROR_STATUS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "invalid_request_error": 400,
        "authentication_error": 401,
        "billing_error": 402,
        "permission_error": 403,
        "not_found_error": 404,
        "request_too_large": 413,
        "rate_limit_error": 429,
        "api_error": 500,
        "timeout_error": 504,
        "overloaded_error": 529,
    }
)
# `error.details.error_code` values that mean the account may not spend more.
_QUOTA_CODES: Final = frozenset(
    {
        "enforced_spend_limit_reached",
        "contract_spend_limit_reached",
        "linked_organization_spend_limit_reached",
    }
)
_NO_CREDIT = re.compile(r"credit balance is too low", re.IGNORECASE)
# Anthropic's second wording of a context overflow, besides "prompt is too long".
_CONTEXT = re.compile(r"exceed context limit", re.IGNORECASE)


# --- errors ------------------------------------------------------------------------------------


def _error_fields(error: object) -> tuple[str | None, str, str | None]:
    """``{"type": ..., "message": ..., "details": {"error_code": ...}}`` → its three parts."""
    if not isinstance(error, dict):
        return None, "(no error message)", None
    kind = error.get("type")
    message = error.get("message")
    details = error.get("details")
    code = details.get("error_code") if isinstance(details, dict) else None
    return (
        kind if isinstance(kind, str) else None,
        redact_credentials(str(message)[:MAX_MESSAGE_CHARS]) if message else "(no error message)",
        code if isinstance(code, str) else None,
    )


def _classify(
    provider: str,
    status: int,
    kind: str | None,
    message: str,
    code: str | None,
    *,
    wait: float | None,
    where: str,
) -> GatewayError:
    said = f"{provider} {where}: {message}"
    if kind == "billing_error" or code in _QUOTA_CODES or _NO_CREDIT.search(message):
        return QuotaExhausted(
            f"{provider}: the anthropic account has no credit left or hit its spend limit "
            f"({where}): {message}",
            provider=provider,
        )
    if status in (400, 413) and (
        is_context_length(message, None, None) or _CONTEXT.search(message)
    ):
        return ContextLengthExceeded(message, param="messages", provider=provider)
    if status in (401, 403) or kind in ("authentication_error", "permission_error"):
        # Only the type: never the upstream's words, which could quote what was sent.
        return UpstreamAuthFailed(
            f"{provider}: anthropic rejected the gateway's credential ({where}, {kind or status})",
            provider=provider,
        )
    if status == 404:
        # The message names the model ("model: claude-..."): the configuration is wrong.
        return ModelNotServed(
            f"{provider}: anthropic does not serve the configured model ({where}): {message}",
            provider=provider,
        )
    if status == 429:
        return UpstreamRateLimited(said, provider=provider, retry_after_s=wait)
    if status == 529 or kind == "overloaded_error":
        return UpstreamOverloaded(said, provider=provider, retry_after_s=wait)
    if status in (408, 504):
        return UpstreamTimeout(said, provider=provider, retry_after_s=wait)
    if 400 <= status < 500:
        # The request's own fault (413 request_too_large included): another provider of the
        # same alias would say the same.
        return InvalidRequest(message, provider=provider)
    if status >= 500:
        return UpstreamServerError(said, provider=provider, retry_after_s=wait)
    return UpstreamProtocolError(f"{provider} answered unexpected HTTP {status}", provider=provider)


def classify_error(
    provider: str, status: int, body: bytes, headers: Mapping[str, str]
) -> GatewayError:
    """A non-2xx answer (``{"type": "error", "error": {...}}``) → the gateway's error."""
    try:
        parsed = json.loads(body)
    except ValueError:
        parsed = None
    error = parsed.get("error") if isinstance(parsed, dict) else None
    kind, message, code = _error_fields(error)
    if error is None:
        text = body.decode("utf-8", "replace").strip()[:MAX_MESSAGE_CHARS]
        message = redact_credentials(text) or "(empty body)"
    wait = parse_retry_after(headers.get("retry-after"))
    return _classify(
        provider, status, kind, message, code, wait=wait, where=f"answered HTTP {status}"
    )


def classify_stream_error(provider: str, error: object) -> GatewayError:
    """The ``error`` object of an ``event: error`` sent after the 200."""
    kind, message, code = _error_fields(error)
    status = _ERROR_STATUS.get(kind or "", 500)
    return _classify(provider, status, kind, message, code, wait=None, where="failed mid-stream")
