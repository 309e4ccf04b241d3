"""Upstream answers that are not a stream, mapped to the gateway's error vocabulary.

Pure: status, body and headers in, a :class:`GatewayError` out. Providers word the same situation
differently (and vLLM has changed its wording across versions), so context-length errors are
recognised by message and ``param``, never by code alone.
"""

from __future__ import annotations

import json
import re
from typing import Any

from trio_gateway.core.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotServed,
    UpstreamAuthFailed,
    UpstreamError,
    UpstreamOverloaded,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamServerError,
    UpstreamTimeout,
)

_CONTEXT_LENGTH = re.compile(
    r"maximum context length is"
    r"|longer than the maximum model length"
    r"|context length is only"
    r"|exceeds the model's context"
    r"|prompt is too long"
    r"|input token count .* exceeds the maximum"
    r"|context_length_exceeded",
    re.IGNORECASE | re.DOTALL,
)
_CONTEXT_PARAMS = frozenset({"input_tokens", "input_text"})
MAX_MESSAGE_CHARS = 2000


def error_message_and_param(body: bytes) -> tuple[str, str | None, Any]:
    """Best effort: the message, ``param`` and ``code`` an upstream put in its error body."""
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed = json.loads(text)
    except ValueError:
        return text[:MAX_MESSAGE_CHARS] or "(empty body)", None, None
    error = parsed.get("error", parsed) if isinstance(parsed, dict) else parsed
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or json.dumps(error)
        param = error.get("param")
        return (
            str(message)[:MAX_MESSAGE_CHARS],
            param if isinstance(param, str) else None,
            error.get("code"),
        )
    return str(error)[:MAX_MESSAGE_CHARS], None, None


def is_context_length(message: str, param: str | None, code: Any) -> bool:
    if code == "context_length_exceeded":
        return True
    if _CONTEXT_LENGTH.search(message):
        return True
    return param in _CONTEXT_PARAMS and "context" in message.lower()


def parse_retry_after(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None  # an HTTP date: rare from model servers, and the cool-down is only a hint
    return seconds if seconds >= 0 else None


def classify_status(
    provider: str, status: int, body: bytes, retry_after: str | None = None
) -> GatewayError:
    """Map a non-2xx upstream answer to the error the client (or the next attempt) sees."""
    message, param, code = error_message_and_param(body)
    wait = parse_retry_after(retry_after)
    said = f"{provider} answered HTTP {status}: {message}"
    if status in (400, 413, 422) and is_context_length(message, param, code):
        return ContextLengthExceeded(message, param=param or "messages", provider=provider)
    if status in (401, 403):
        return UpstreamAuthFailed(
            f"{provider} rejected the gateway's credentials (HTTP {status}): {message}",
            provider=provider,
        )
    if status == 404:
        return ModelNotServed(
            f"{provider} does not serve the configured model (HTTP 404): {message}",
            provider=provider,
        )
    if status in (408, 504):
        return UpstreamTimeout(said, provider=provider, retry_after_s=wait)
    if status == 429:
        return UpstreamRateLimited(said, provider=provider, retry_after_s=wait)
    if status == 529:
        # Anthropic's "overloaded": the whole service is busy, not this caller's rate.
        return UpstreamOverloaded(said, provider=provider, retry_after_s=wait)
    if 400 <= status < 500:
        # The request's own fault: the next provider would say the same.
        return InvalidRequest(message, param=param, provider=provider)
    if status >= 500:
        return UpstreamServerError(said, provider=provider, retry_after_s=wait)
    return UpstreamProtocolError(f"{provider} answered unexpected HTTP {status}", provider=provider)


def classify_inband(provider: str, error: object) -> GatewayError:
    """An error object sent inside a 200 stream (``data: {"error": ...}``)."""
    body = json.dumps({"error": error} if not isinstance(error, dict) else error).encode()
    message, param, code = error_message_and_param(body)
    if is_context_length(message, param, code):
        return ContextLengthExceeded(message, param=param or "messages", provider=provider)
    status = code if isinstance(code, int) else None
    if status is not None and 400 <= status < 500 and status not in (408, 429):
        return InvalidRequest(message, param=param, provider=provider)
    err: UpstreamError = UpstreamServerError(
        f"{provider} failed mid-stream: {message}", provider=provider
    )
    return err
