"""Error classification, field by field: the message, param, provider and Retry-After each
mapped error carries, not only its type."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.core.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    ModelNotServed,
    UpstreamAuthFailed,
    UpstreamOverloaded,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamServerError,
    UpstreamTimeout,
)
from trio_gateway.providers.errors import (
    MAX_MESSAGE_CHARS,
    classify_inband,
    classify_status,
    error_message_and_param,
    parse_retry_after,
)

Fields = tuple[type[GatewayError], str, str | None, str | None, float | None]


def fields(error: GatewayError) -> Fields:
    return (type(error), error.message, error.param, error.provider, error.retry_after_s)


def body(**error: Any) -> bytes:
    return json.dumps({"error": error}).encode()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", ("(empty body)", None, None)),
        (b"  Bad Gateway \n", ("Bad Gateway", None, None)),
        (b"x" * (MAX_MESSAGE_CHARS + 5), ("x" * MAX_MESSAGE_CHARS, None, None)),
        (body(message="m", param="max_tokens", code=400), ("m", "max_tokens", 400)),
        (body(message="m", detail="d"), ("m", None, None)),
        (json.dumps({"detail": "Not Found"}).encode(), ("Not Found", None, None)),
        (body(type="x"), ('{"type": "x"}', None, None)),
        (body(message="m", param=5, code="c"), ("m", None, "c")),
        (body(message="y" * (MAX_MESSAGE_CHARS + 1)), ("y" * MAX_MESSAGE_CHARS, None, None)),
        (json.dumps({"error": "Unauthorized"}).encode(), ("Unauthorized", None, None)),
        (b"[1, 2]", ("[1, 2]", None, None)),
        (b'"z' + b"z" * MAX_MESSAGE_CHARS + b'"', ("z" * MAX_MESSAGE_CHARS, None, None)),
    ],
)
def test_message_param_and_code_of_an_error_body(
    raw: bytes, expected: tuple[str, str | None, Any]
) -> None:
    assert error_message_and_param(raw) == expected


CONTEXT = "This model's maximum context length is 2048 tokens."


@pytest.mark.parametrize(
    ("status", "raw", "retry_after", "expected"),
    [
        (
            400,
            body(message=CONTEXT, param="input_tokens"),
            None,
            (ContextLengthExceeded, CONTEXT, "input_tokens", "vllm", None),
        ),
        (
            413,
            body(message="prompt is too long: 9 tokens"),
            None,
            (ContextLengthExceeded, "prompt is too long: 9 tokens", "messages", "vllm", None),
        ),
        (
            422,
            body(message="too many", code="context_length_exceeded"),
            None,
            (ContextLengthExceeded, "too many", "messages", "vllm", None),
        ),
        (
            400,
            body(message="Context window overflow", param="input_text"),
            None,
            (ContextLengthExceeded, "Context window overflow", "input_text", "vllm", None),
        ),
        # Only the three statuses that mean "your request": another says it in its own way.
        (414, body(message=CONTEXT), None, (InvalidRequest, CONTEXT, None, "vllm", None)),
        (
            400,
            body(message="bad token id", param="input_tokens"),
            None,
            (InvalidRequest, "bad token id", "input_tokens", "vllm", None),
        ),
        (
            400,
            body(message="the context window is fine", param="messages"),
            None,
            (InvalidRequest, "the context window is fine", "messages", "vllm", None),
        ),
        (
            401,
            json.dumps({"error": "Unauthorized"}).encode(),
            None,
            (
                UpstreamAuthFailed,
                "vllm rejected the gateway's credentials (HTTP 401): Unauthorized",
                None,
                "vllm",
                None,
            ),
        ),
        (
            404,
            body(message="no such model"),
            None,
            (
                ModelNotServed,
                "vllm does not serve the configured model (HTTP 404): no such model",
                None,
                "vllm",
                None,
            ),
        ),
        (
            408,
            b"slow",
            "2",
            (UpstreamTimeout, "vllm answered HTTP 408: slow", None, "vllm", 2.0),
        ),
        (
            504,
            b"",
            None,
            (UpstreamTimeout, "vllm answered HTTP 504: (empty body)", None, "vllm", None),
        ),
        (
            429,
            body(message="slow down"),
            "0",
            (UpstreamRateLimited, "vllm answered HTTP 429: slow down", None, "vllm", 0.0),
        ),
        (
            529,
            body(message="overloaded"),
            "1.5",
            (UpstreamOverloaded, "vllm answered HTTP 529: overloaded", None, "vllm", 1.5),
        ),
        (
            418,
            body(message="bad temperature", param="temperature"),
            "9",
            (InvalidRequest, "bad temperature", "temperature", "vllm", None),
        ),
        (
            503,
            body(message="busy"),
            "4",
            (UpstreamServerError, "vllm answered HTTP 503: busy", None, "vllm", 4.0),
        ),
        (
            302,
            b"elsewhere",
            None,
            (UpstreamProtocolError, "vllm answered unexpected HTTP 302", None, "vllm", None),
        ),
    ],
)
def test_status_answers_keep_message_param_provider_and_wait(
    status: int, raw: bytes, retry_after: str | None, expected: Fields
) -> None:
    assert fields(classify_status("vllm", status, raw, retry_after)) == expected


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ("boom", (UpstreamServerError, "vllm failed mid-stream: boom", None, "vllm", None)),
        (
            {"message": CONTEXT},
            (ContextLengthExceeded, CONTEXT, "messages", "vllm", None),
        ),
        (
            {"message": "too many", "code": "context_length_exceeded", "param": "input_tokens"},
            (ContextLengthExceeded, "too many", "input_tokens", "vllm", None),
        ),
        (
            {"message": "Context overflow", "param": "input_tokens"},
            (ContextLengthExceeded, "Context overflow", "input_tokens", "vllm", None),
        ),
        # A whole error object, with its own "error" key, is unwrapped like a body.
        (
            {"error": {"message": "inner", "code": 400}},
            (InvalidRequest, "inner", None, "vllm", None),
        ),
        (
            {"message": "bad", "code": 400, "param": "temperature"},
            (InvalidRequest, "bad", "temperature", "vllm", None),
        ),
        ({"message": "gone", "code": 409}, (InvalidRequest, "gone", None, "vllm", None)),
        ({"message": "last", "code": 499}, (InvalidRequest, "last", None, "vllm", None)),
        (
            {"message": "timeout", "code": 408},
            (UpstreamServerError, "vllm failed mid-stream: timeout", None, "vllm", None),
        ),
        (
            {"message": "limited", "code": 429},
            (UpstreamServerError, "vllm failed mid-stream: limited", None, "vllm", None),
        ),
        (
            {"message": "teapot", "code": "400"},
            (UpstreamServerError, "vllm failed mid-stream: teapot", None, "vllm", None),
        ),
        (
            {"message": "crash", "code": 500},
            (UpstreamServerError, "vllm failed mid-stream: crash", None, "vllm", None),
        ),
        (
            {"message": "moved", "code": 399},
            (UpstreamServerError, "vllm failed mid-stream: moved", None, "vllm", None),
        ),
    ],
)
def test_inband_errors_keep_message_param_and_provider(error: object, expected: Fields) -> None:
    assert fields(classify_inband("vllm", error)) == expected


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        ("0", 0.0),
        ("0.5", 0.5),
        (" 2 ", 2.0),
        ("-1", None),
        ("Wed, 21 Oct 2026 07:28:00 GMT", None),
    ],
)
def test_retry_after_in_seconds(value: str | None, seconds: float | None) -> None:
    assert parse_retry_after(value) == seconds


def test_a_body_that_is_not_utf8_is_read_with_replacements() -> None:
    assert error_message_and_param(b"\xffbad gateway") == ("\ufffdbad gateway", None, None)
