"""Anthropic's error classification, whole answers and call (``providers/anthropic.py``), by
table: the error type, message, provider and wait a client or operator sees.

Written for mutation testing (docs/testing.md): the dialect tests check the error types; these
pin each branch's message.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    QuotaExhausted,
    UpstreamAuthFailed,
    UpstreamOverloaded,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamServerError,
    UpstreamTimeout,
)
from trio_gateway.core.events import ResponseStarted, Usage
from trio_gateway.core.request import validate_chat_body
from trio_gateway.core.sse import SSEEvent
from trio_gateway.providers.anthropic.dialect import (
    AnthropicDialect,
    classify_error,
    classify_stream_error,
    parse_whole,
)

AUTH = "cl: anthropic rejected the gateway's credential"


def answer(status: int, error: object, headers: dict[str, str] | None = None) -> GatewayError:
    body = json.dumps({"type": "error", "error": error}).encode()
    return classify_error("cl", status, body, headers or {})


def check(error: GatewayError, kind: type[GatewayError], message: str) -> None:
    assert type(error) is kind
    assert error.message == message
    assert error.provider == "cl"


@pytest.mark.parametrize(
    ("status", "error", "headers", "kind", "message", "wait"),
    [
        (401, {"message": "m"}, {}, UpstreamAuthFailed, f"{AUTH} (answered HTTP 401, 401)", None),
        (
            403,
            {"type": 5, "message": "m"},
            {},
            UpstreamAuthFailed,
            f"{AUTH} (answered HTTP 403, 403)",
            None,
        ),
        (
            400,
            {"type": "authentication_error", "message": "m"},
            {},
            UpstreamAuthFailed,
            f"{AUTH} (answered HTTP 400, authentication_error)",
            None,
        ),
        (
            400,
            {"type": "permission_error", "message": "m"},
            {},
            UpstreamAuthFailed,
            f"{AUTH} (answered HTTP 400, permission_error)",
            None,
        ),
        (
            429,
            {"message": "slow"},
            {"retry-after": "3"},
            UpstreamRateLimited,
            "cl answered HTTP 429: slow",
            3.0,
        ),
        (
            529,
            {"message": "busy"},
            {"retry-after": "2"},
            UpstreamOverloaded,
            "cl answered HTTP 529: busy",
            2.0,
        ),
        (
            500,
            {"type": "overloaded_error", "message": "busy"},
            {},
            UpstreamOverloaded,
            "cl answered HTTP 500: busy",
            None,
        ),
        (
            408,
            {"message": "slow"},
            {"retry-after": "4"},
            UpstreamTimeout,
            "cl answered HTTP 408: slow",
            4.0,
        ),
        (504, {"message": "slow"}, {}, UpstreamTimeout, "cl answered HTTP 504: slow", None),
        (409, {"message": "conflict"}, {}, InvalidRequest, "conflict", None),
        (
            500,
            {"type": "api_error"},
            {},
            UpstreamServerError,
            "cl answered HTTP 500: (no error message)",
            None,
        ),
        (
            500,
            {"message": "m", "details": {"error_code": ["not a string"]}},
            {},
            UpstreamServerError,
            "cl answered HTTP 500: m",
            None,
        ),
        (
            302,
            {"message": "moved"},
            {},
            UpstreamProtocolError,
            "cl answered unexpected HTTP 302",
            None,
        ),
    ],
)
def test_statuses(
    status: int,
    error: object,
    headers: dict[str, str],
    kind: type[GatewayError],
    message: str,
    wait: float | None,
) -> None:
    classified = answer(status, error, headers)
    check(classified, kind, message)
    assert classified.retry_after_s == wait


@pytest.mark.parametrize("status", [400, 413])
def test_context_length(status: int) -> None:
    text = "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000"
    classified = answer(status, {"type": "invalid_request_error", "message": text})
    check(classified, ContextLengthExceeded, text)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "cl answered HTTP 500: (empty body)"),
        pytest.param(
            b"bad \xff gateway", "cl answered HTTP 500: bad \ufffd gateway", id="not-utf-8"
        ),
    ],
)
def test_bodies_that_are_not_an_error(body: bytes, message: str) -> None:
    check(classify_error("cl", 500, body, {}), UpstreamServerError, message)


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        ("oops", UpstreamServerError, "cl failed mid-stream: (no error message)"),
        ({"type": "api_error", "message": "m"}, UpstreamServerError, "cl failed mid-stream: m"),
        (
            {"type": "rate_limit_error", "message": "m"},
            UpstreamRateLimited,
            "cl failed mid-stream: m",
        ),
        (
            {
                "type": "api_error",
                "message": "m",
                "details": {"error_code": "enforced_spend_limit_reached"},
            },
            QuotaExhausted,
            "cl: the anthropic account has no credit left or hit its spend limit "
            "(failed mid-stream): m",
        ),
    ],
)
def test_stream_errors(error: object, kind: type[GatewayError], message: str) -> None:
    check(classify_stream_error("cl", error), kind, message)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"{", "cl sent an answer that is not JSON ("),
        (b"[]", "cl sent an answer that is not an object"),
        (b'{"type": "message"}', "cl sent a message without content"),
    ],
)
def test_parse_whole_errors(body: bytes, message: str) -> None:
    with pytest.raises(UpstreamProtocolError) as caught:
        parse_whole("cl", body)
    assert caught.value.message.startswith(message)
    assert caught.value.provider == "cl"


def test_parse_whole_usage() -> None:
    message: dict[str, Any] = {
        "type": "message",
        "content": [{"type": "text", "text": "hi"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 2},
    }
    events = parse_whole("cl", json.dumps(message).encode())
    assert [e for e in events if isinstance(e, Usage)] == [Usage(12, 5, None, 2)]


def test_anthropic_call() -> None:
    provider = ProviderConfig(name="cl", type="anthropic", model="claude")
    request = validate_chat_body({"model": "a", "messages": [{"role": "user", "content": "é"}]})
    call = AnthropicDialect().build_call(request, provider)
    assert '"text": "é"'.encode() in call.body or '"content": "é"'.encode() in call.body
    parser = AnthropicDialect().new_parser("cl")
    start = {"type": "message_start", "message": {"usage": {"input_tokens": 1}}}
    assert parser.feed(SSEEvent(data=json.dumps(start).encode())) == [ResponseStarted("cl")]
