"""The anthropic dialect's answers that are not streams: a whole message (``parse_whole``),
and an error response classified into the gateway's errors (status, body, headers), with
the upstream's words kept out where they could quote a credential."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic import types as at

from tests.unit.anthropic_helpers import NAME
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
from trio_gateway.core.events import (
    ReasoningDelta,
    ReasoningDetail,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.reasoning_details import ANTHROPIC
from trio_gateway.providers.anthropic.dialect import (
    AnthropicDialect,
    classify_error,
    parse_whole,
)

# --- whole answers -----------------------------------------------------------------------------


def test_parse_whole_message() -> None:
    message = at.Message.model_validate(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [
                {"type": "thinking", "thinking": "Hmm.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "abc"},
                {"type": "text", "text": "Answer."},
                {"type": "text", "text": ""},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1, "é"]}},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 7, "output_tokens": 30, "cache_read_input_tokens": 2},
        }
    )
    dialect = AnthropicDialect()
    assert dialect.parse_whole(NAME, message.model_dump_json().encode()) == [
        ResponseStarted(NAME),
        ReasoningDelta("Hmm."),
        # The blocks Anthropic needs back, in their order, signatures and data as they were.
        ReasoningDetail(0, ANTHROPIC, text="Hmm.", signature="sig"),
        ReasoningDetail(1, ANTHROPIC, data="abc"),
        TextDelta("Answer."),
        ToolCallDelta(0, "toolu_1", "f", '{"a": [1, "é"]}'),
        ToolCallDone(0, "toolu_1", "f", {"a": [1, "é"]}, '{"a": [1, "é"]}', True),
        Usage(9, 30, None, 2),
        ResponseDone("tool_calls"),
    ]


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b"not json", UpstreamProtocolError),
        (b"[]", UpstreamProtocolError),
        (b'{"type": "message", "stop_reason": "end_turn"}', UpstreamProtocolError),
        (b'{"type": "message", "content": [], "stop_reason": null}', UpstreamProtocolError),
        (
            b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
            UpstreamOverloaded,
        ),
    ],
)
def test_parse_whole_failures(body: bytes, expected: type[GatewayError]) -> None:
    with pytest.raises(GatewayError) as info:
        parse_whole(NAME, body)
    assert type(info.value) is expected
    assert info.value.provider == NAME


# --- errors ------------------------------------------------------------------------------------


def error_body(kind: str, message: str, **extra: Any) -> bytes:
    error = {"type": kind, "message": message, **extra}
    return json.dumps({"type": "error", "error": error, "request_id": "req_011"}).encode()


@pytest.mark.parametrize(
    ("status", "body", "headers", "expected", "retry_after_s", "param"),
    [
        (
            400,
            error_body(
                "invalid_request_error", "prompt is too long: 208656 tokens > 200000 maximum"
            ),
            {},
            ContextLengthExceeded,
            None,
            "messages",
        ),
        (
            400,
            error_body(
                "invalid_request_error",
                "input length and `max_tokens` exceed context limit: 197626 + 8192 > 200000, "
                "decrease input length or `max_tokens` and try again",
            ),
            {},
            ContextLengthExceeded,
            None,
            "messages",
        ),
        (
            400,
            error_body("invalid_request_error", "messages: roles must alternate"),
            {},
            InvalidRequest,
            None,
            None,
        ),
        (
            400,
            error_body(
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
                "Billing to upgrade or purchase credits.",
            ),
            {},
            QuotaExhausted,
            None,
            None,
        ),
        (
            400,
            error_body(
                "invalid_request_error",
                "limit",
                details={"error_code": "enforced_spend_limit_reached"},
            ),
            {},
            QuotaExhausted,
            None,
            None,
        ),
        (402, error_body("billing_error", "payment required"), {}, QuotaExhausted, None, None),
        (403, error_body("billing_error", "billing problem"), {}, QuotaExhausted, None, None),
        (
            401,
            error_body("authentication_error", "invalid x-api-key"),
            {},
            UpstreamAuthFailed,
            None,
            None,
        ),
        (
            403,
            error_body("permission_error", "no access to this model"),
            {},
            UpstreamAuthFailed,
            None,
            None,
        ),
        (
            404,
            error_body("not_found_error", "model: claude-nope-1"),
            {},
            ModelNotServed,
            None,
            None,
        ),
        (
            413,
            error_body("request_too_large", "Request exceeds the maximum allowed number of bytes."),
            {},
            InvalidRequest,
            None,
            None,
        ),
        (
            429,
            error_body(
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
            ),
            {"retry-after": "17"},
            UpstreamRateLimited,
            17.0,
            None,
        ),
        (429, error_body("rate_limit_error", "slow down"), {}, UpstreamRateLimited, None, None),
        (
            529,
            error_body("overloaded_error", "Overloaded"),
            {"retry-after": "3"},
            UpstreamOverloaded,
            3.0,
            None,
        ),
        (
            529,
            error_body("overloaded_error", "Overloaded"),
            {"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"},
            UpstreamOverloaded,
            None,
            None,
        ),
        (
            500,
            error_body("api_error", "Internal server error"),
            {},
            UpstreamServerError,
            None,
            None,
        ),
        (504, error_body("timeout_error", "Request timed out"), {}, UpstreamTimeout, None, None),
        (502, b"<html>Bad gateway</html>", {}, UpstreamServerError, None, None),
        (503, b"", {"retry-after": "5"}, UpstreamServerError, 5.0, None),
        (302, b"", {}, UpstreamProtocolError, None, None),
    ],
)
def test_classify_error(
    status: int,
    body: bytes,
    headers: dict[str, str],
    expected: type[GatewayError],
    retry_after_s: float | None,
    param: str | None,
) -> None:
    error = AnthropicDialect().classify_error(NAME, status, body, headers)
    assert type(error) is expected
    assert error.provider == NAME
    assert error.retry_after_s == retry_after_s
    assert error.param == param


def test_classified_messages() -> None:
    def message(status: int, body: bytes) -> str:
        return classify_error(NAME, status, body, {}).message

    assert message(400, error_body("invalid_request_error", "messages: roles must alternate")) == (
        "messages: roles must alternate"
    )
    assert "claude-nope-1" in message(404, error_body("not_found_error", "model: claude-nope-1"))
    assert "<html>Bad gateway</html>" in message(502, b"<html>Bad gateway</html>")
    assert "(empty body)" in message(503, b"")
    assert message(400, error_body("invalid_request_error", "prompt is too long: 2 > 1")) == (
        "prompt is too long: 2 > 1"
    )


def test_auth_failure_never_repeats_the_upstreams_words() -> None:
    body = error_body("authentication_error", "invalid x-api-key: sk-ant-api03-SECRET")
    error = classify_error(NAME, 401, body, {})
    assert error.message == (
        "claude-a: anthropic rejected the gateway's credential "
        "(answered HTTP 401, authentication_error)"
    )
    assert "SECRET" not in json.dumps(error.to_body())


def test_upstream_messages_that_quote_a_key_are_redacted() -> None:
    key = "sk-ant-api03-" + "A" * 40
    for status, body in (
        (400, error_body("invalid_request_error", f"bad header x-api-key: {key}")),
        (502, f"proxy says: {key}".encode()),
    ):
        error = classify_error(NAME, status, body, {})
        assert key not in error.message
        assert "[redacted]" in error.message
