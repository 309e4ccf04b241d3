"""Gemini's error classification (``providers/gemini.py``), by table: the error type, message,
provider and wait a client or operator sees for each google.rpc Status.

Written for mutation testing (docs/testing.md): the dialect tests pass one typical answer per
kind; these pin each branch and each message.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

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
from trio_gateway.providers.gemini.errors import classify_error, classify_stream_error

RETRY_INFO = "type.googleapis.com/google.rpc.RetryInfo"
QUOTA_FAILURE = "type.googleapis.com/google.rpc.QuotaFailure"
ERROR_INFO = "type.googleapis.com/google.rpc.ErrorInfo"
BILLING = "You exceeded your current quota, please check your plan and billing details."


def answer(status: int, error: dict[str, Any], headers: dict[str, str] | None = None) -> Any:
    return classify_error("gem", status, json.dumps({"error": error}).encode(), headers or {})


def check(error: GatewayError, kind: type[GatewayError], message: str) -> None:
    assert type(error) is kind
    assert error.message == message
    assert error.provider == "gem"


# --- credentials -------------------------------------------------------------------------------

AUTH = "gem: google rejected the gateway's credential"


@pytest.mark.parametrize(
    ("status", "error", "message"),
    [
        (401, {"message": "nope"}, f"{AUTH} (answered HTTP 401, 401): nope"),
        (403, {"message": "nope"}, f"{AUTH} (answered HTTP 403, 403): nope"),
        (
            400,
            {"message": "nope", "status": "UNAUTHENTICATED"},
            f"{AUTH} (answered HTTP 400, UNAUTHENTICATED): nope",
        ),
        (
            400,
            {"message": "nope", "status": "PERMISSION_DENIED"},
            f"{AUTH} (answered HTTP 400, PERMISSION_DENIED): nope",
        ),
        (
            400,
            {
                "message": "bad",
                "status": "INVALID_ARGUMENT",
                "details": [{"@type": ERROR_INFO, "reason": "API_KEY_INVALID"}],
            },
            f"{AUTH} (answered HTTP 400, INVALID_ARGUMENT): bad",
        ),
        (
            400,
            {"message": "API key not valid."},
            f"{AUTH} (answered HTTP 400, 400): API key not valid.",
        ),
        (401, {"message": "m", "status": 7}, f"{AUTH} (answered HTTP 401, 401): m"),
    ],
)
def test_credential_errors(status: int, error: dict[str, Any], message: str) -> None:
    check(answer(status, error), UpstreamAuthFailed, message)


@pytest.mark.parametrize(
    "details",
    [
        [{"@type": ERROR_INFO, "reason": "RATE_LIMIT_EXCEEDED"}],
        [{"@type": RETRY_INFO, "reason": "API_KEY_INVALID"}],
        [{"@type": ERROR_INFO}],
        [{"reason": "API_KEY_INVALID"}],
    ],
)
def test_other_reasons_are_the_request_s_fault(details: list[dict[str, Any]]) -> None:
    check(answer(400, {"message": "bad", "details": details}), InvalidRequest, "bad")


# --- quotas ------------------------------------------------------------------------------------

QUOTA = "gem: the google project's quota is used up (answered HTTP 429)"


@pytest.mark.parametrize(
    "violations",
    [
        ["not an object", {"quotaId": "GenerateRequestsPerDayPerProject"}],
        [{"quotaId": "PerMinute", "quotaValue": "0"}],
        [{"quotaValue": 0}],
    ],
)
def test_a_daily_or_zero_quota_is_exhausted(violations: list[object]) -> None:
    details = [{"@type": QUOTA_FAILURE, "violations": violations}]
    check(answer(429, {"message": "q", "details": details}), QuotaExhausted, f"{QUOTA}: q")


@pytest.mark.parametrize(
    "failure",
    [
        {"@type": QUOTA_FAILURE},
        {"@type": QUOTA_FAILURE, "violations": {"quotaValue": "0"}},
        {"@type": QUOTA_FAILURE, "violations": [{"quotaId": "PerMinute"}]},
        {"@type": QUOTA_FAILURE, "violations": [{"quotaValue": "10"}]},
    ],
)
def test_a_per_minute_quota_is_a_rate_limit(failure: dict[str, Any]) -> None:
    error = answer(429, {"message": "q", "details": [failure]}, {"retry-after": "7"})
    check(error, UpstreamRateLimited, "gem answered HTTP 429: q")
    assert error.retry_after_s == 7.0


def test_the_billing_message_with_a_retry_delay_is_a_rate_limit() -> None:
    details = [{"@type": RETRY_INFO, "retryDelay": "4s"}]
    error = answer(429, {"message": BILLING, "details": details})
    check(error, UpstreamRateLimited, f"gem answered HTTP 429: {BILLING}")
    assert error.retry_after_s == 4.0


def test_the_billing_message_alone_is_exhausted() -> None:
    check(answer(429, {"message": BILLING}), QuotaExhausted, f"{QUOTA}: {BILLING}")


# --- the other statuses ------------------------------------------------------------------------


@pytest.mark.parametrize("status", [400, 413])
def test_context_length(status: int) -> None:
    text = "The input token count is 5000 but the model only supports 4096"
    error = answer(status, {"message": text})
    check(error, ContextLengthExceeded, text)
    assert error.param == "messages"


@pytest.mark.parametrize(
    ("status", "error", "headers", "kind", "message", "wait"),
    [
        (
            400,
            {"message": "User location is not supported for the API use."},
            {},
            UpstreamServerError,
            "gem answered HTTP 400: User location is not supported for the API use.",
            None,
        ),
        (
            404,
            {"message": "models/x is not found"},
            {},
            ModelNotServed,
            "gem: google does not serve the configured model (answered HTTP 404): "
            "models/x is not found",
            None,
        ),
        (
            408,
            {"message": "slow"},
            {"retry-after": "3"},
            UpstreamTimeout,
            "gem answered HTTP 408: slow",
            3.0,
        ),
        (
            504,
            {"message": "slow"},
            {"retry-after": "3"},
            UpstreamTimeout,
            "gem answered HTTP 504: slow",
            3.0,
        ),
        (
            503,
            {"message": "busy"},
            {"retry-after": "2"},
            UpstreamOverloaded,
            "gem answered HTTP 503: busy",
            2.0,
        ),
        (
            500,
            {"message": "oops"},
            {"retry-after": "5"},
            UpstreamServerError,
            "gem answered HTTP 500: oops",
            5.0,
        ),
        (409, {"message": "conflict"}, {}, InvalidRequest, "conflict", None),
        (
            302,
            {"message": "moved"},
            {},
            UpstreamProtocolError,
            "gem answered unexpected HTTP 302",
            None,
        ),
    ],
)
def test_statuses(
    status: int,
    error: dict[str, Any],
    headers: dict[str, str],
    kind: type[GatewayError],
    message: str,
    wait: float | None,
) -> None:
    classified = answer(status, error, headers)
    check(classified, kind, message)
    assert classified.retry_after_s == wait


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"", "gem answered HTTP 500: (empty body)"),
        (b"  \n", "gem answered HTTP 500: (empty body)"),
        pytest.param(
            b"bad \xff gateway", "gem answered HTTP 500: bad \ufffd gateway", id="not-utf-8"
        ),
        (b'"oops"', 'gem answered HTTP 500: "oops"'),
        (b"[]", "gem answered HTTP 500: []"),
        (b'{"error": "flat"}', 'gem answered HTTP 500: {"error": "flat"}'),
        (b'{"error": {}}', "gem answered HTTP 500: (no error message)"),
        (b'[{"error": {"message": "first"}}]', "gem answered HTTP 500: first"),
    ],
)
def test_bodies_that_are_not_a_status(body: bytes, message: str) -> None:
    check(classify_error("gem", 500, body, {}), UpstreamServerError, message)


# --- an error inside the stream ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "kind", "message"),
    [
        ({"code": 429, "message": "slow"}, UpstreamRateLimited, "gem failed mid-stream: slow"),
        (
            {"code": 503, "status": "INTERNAL"},
            UpstreamOverloaded,
            "gem failed mid-stream: (no error message)",
        ),
        ({"status": "UNAVAILABLE", "message": "m"}, UpstreamOverloaded, "gem failed mid-stream: m"),
        (
            {"code": "429", "status": "UNAVAILABLE", "message": "m"},
            UpstreamOverloaded,
            "gem failed mid-stream: m",
        ),
        ({"code": True, "message": "m"}, UpstreamServerError, "gem failed mid-stream: m"),
        ({"message": "m"}, UpstreamServerError, "gem failed mid-stream: m"),
        ({"message": ""}, UpstreamServerError, "gem failed mid-stream: (no error message)"),
        ("oops", UpstreamServerError, "gem failed mid-stream: (no error message)"),
        (
            {"status": "NOT_FOUND", "message": "m"},
            ModelNotServed,
            "gem: google does not serve the configured model (failed mid-stream): m",
        ),
    ],
)
def test_stream_errors(error: object, kind: type[GatewayError], message: str) -> None:
    check(classify_stream_error("gem", error), kind, message)
