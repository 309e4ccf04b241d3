"""The gemini and vertex dialects' error classification: Google's error bodies (status,
RetryInfo, QuotaFailure, ErrorInfo) to the gateway's errors and retry delays, and
credentials kept out of the messages."""

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
    UpstreamRateLimited,
    UpstreamServerError,
    UpstreamTimeout,
)
from trio_gateway.providers.gemini.dialect import GeminiDialect, VertexDialect
from trio_gateway.providers.gemini.errors import classify_error


def google_error(
    code: int, status: str, message: str, *details: dict[str, Any], wrap: bool = False
) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = list(details)
    value: Any = {"error": error}
    return json.dumps([value] if wrap else value).encode()


def retry_info(delay: str) -> dict[str, Any]:
    return {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}


def quota_failure(*quota_ids: str, value: str | None = None) -> dict[str, Any]:
    violations = []
    for quota_id in quota_ids:
        violation = {
            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
            "quotaId": quota_id,
            "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"},
        }
        if value is not None:
            violation["quotaValue"] = value
        violations.append(violation)
    return {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": violations}


FREE_TIER = (
    "You exceeded your current quota, please check your plan and billing details. For more "
    "information on this error, head to: https://ai.google.dev/gemini-api/docs/rate-limits."
)
API_KEY_INVALID = {
    "@type": "type.googleapis.com/google.rpc.ErrorInfo",
    "reason": "API_KEY_INVALID",
    "domain": "googleapis.com",
}
ERROR_ROWS: list[tuple[str, int, bytes, dict[str, str], type[GatewayError], float | None]] = [
    (
        "context length",
        400,
        google_error(
            400,
            "INVALID_ARGUMENT",
            "The input token count (3475108) exceeds the maximum number of tokens allowed "
            "(1048576).",
        ),
        {},
        ContextLengthExceeded,
        None,
    ),
    (
        "context length, vertex wording",
        400,
        google_error(
            400,
            "INVALID_ARGUMENT",
            "Unable to submit request because the input token count is 1048577 but model only "
            "supports up to 1048576. Reduce the input token count and try again.",
        ),
        {},
        ContextLengthExceeded,
        None,
    ),
    (
        "invalid argument",
        400,
        google_error(400, "INVALID_ARGUMENT", 'Invalid JSON payload received. Unknown name "x"'),
        {},
        InvalidRequest,
        None,
    ),
    (
        "failed precondition",
        400,
        google_error(400, "FAILED_PRECONDITION", "Function calling is not enabled for this model"),
        {},
        InvalidRequest,
        None,
    ),
    (
        "unsupported location: this provider's lot",
        400,
        google_error(400, "FAILED_PRECONDITION", "User location is not supported for the API use."),
        {},
        UpstreamServerError,
        None,
    ),
    (
        "bad API key (AI Studio says 400)",
        400,
        google_error(
            400,
            "INVALID_ARGUMENT",
            "API key not valid. Please pass a valid API key.",
            API_KEY_INVALID,
        ),
        {},
        UpstreamAuthFailed,
        None,
    ),
    (
        "unauthenticated",
        401,
        google_error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials."),
        {},
        UpstreamAuthFailed,
        None,
    ),
    (
        "permission denied",
        403,
        google_error(403, "PERMISSION_DENIED", "Permission denied on resource project my-project."),
        {},
        UpstreamAuthFailed,
        None,
    ),
    (
        "model not found",
        404,
        google_error(404, "NOT_FOUND", "models/gemini-9 is not found for API version v1beta"),
        {},
        ModelNotServed,
        None,
    ),
    (
        "rate limit, RetryInfo 4s",
        429,
        google_error(
            429,
            "RESOURCE_EXHAUSTED",
            FREE_TIER,
            quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier"),
            retry_info("4s"),
        ),
        {},
        UpstreamRateLimited,
        4.0,
    ),
    (
        "rate limit, RetryInfo 1.5s, as an array",
        429,
        google_error(
            429, "RESOURCE_EXHAUSTED", "Resource exhausted", retry_info("1.5s"), wrap=True
        ),
        {},
        UpstreamRateLimited,
        1.5,
    ),
    (
        "rate limit, the header wins over the body",
        429,
        google_error(429, "RESOURCE_EXHAUSTED", "Resource exhausted", retry_info("30s")),
        {"retry-after": "7"},
        UpstreamRateLimited,
        7.0,
    ),
    (
        "rate limit, delay only in the message",
        429,
        google_error(429, "RESOURCE_EXHAUSTED", "Quota exceeded. Please retry in 2.5s."),
        {},
        UpstreamRateLimited,
        2.5,
    ),
    (
        "vertex shared quota: a rate limit with no hint",
        429,
        google_error(429, "RESOURCE_EXHAUSTED", "Resource exhausted. Please try again later."),
        {},
        UpstreamRateLimited,
        None,
    ),
    (
        "daily quota: exhausted, whatever RetryInfo says",
        429,
        google_error(
            429,
            "RESOURCE_EXHAUSTED",
            FREE_TIER,
            quota_failure(
                "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
                "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
            ),
            retry_info("20s"),
        ),
        {},
        QuotaExhausted,
        None,
    ),
    (
        "a quota of 0: exhausted",
        429,
        google_error(
            429,
            "RESOURCE_EXHAUSTED",
            FREE_TIER + " Quota exceeded for metric: x, limit: 0, model: gemini-2.5-pro",
            quota_failure("GenerateRequestsPerMinutePerProjectPerModel-FreeTier", value="0"),
            retry_info("10s"),
        ),
        {},
        QuotaExhausted,
        None,
    ),
    (
        "over quota with no details: exhausted",
        429,
        google_error(429, "RESOURCE_EXHAUSTED", FREE_TIER),
        {},
        QuotaExhausted,
        None,
    ),
    (
        "prepaid credit used up",
        429,
        google_error(429, "RESOURCE_EXHAUSTED", "Your prepayment credits are depleted."),
        {},
        QuotaExhausted,
        None,
    ),
    (
        "internal",
        500,
        google_error(500, "INTERNAL", "An internal error has occurred."),
        {},
        UpstreamServerError,
        None,
    ),
    (
        "unavailable",
        503,
        google_error(503, "UNAVAILABLE", "The model is overloaded. Please try again later."),
        {"retry-after": "3"},
        UpstreamOverloaded,
        3.0,
    ),
    (
        "deadline exceeded",
        504,
        google_error(504, "DEADLINE_EXCEEDED", "Deadline expired before operation could complete."),
        {},
        UpstreamTimeout,
        None,
    ),
    ("not JSON (a proxy's page)", 502, b"<html>Bad Gateway</html>", {}, UpstreamServerError, None),
]


@pytest.mark.parametrize(
    ("status", "body", "headers", "error", "wait"),
    [row[1:] for row in ERROR_ROWS],
    ids=[row[0] for row in ERROR_ROWS],
)
def test_classify_error(
    status: int,
    body: bytes,
    headers: dict[str, str],
    error: type[GatewayError],
    wait: float | None,
) -> None:
    for dialect in (GeminiDialect(), VertexDialect()):
        classified = dialect.classify_error("gem", status, body, headers)
        assert type(classified) is error
        assert classified.retry_after_s == wait
        assert classified.provider == "gem"
    if error is ContextLengthExceeded:
        assert classified.param == "messages"
    if error is InvalidRequest:
        assert "Invalid JSON" in classified.message or "not enabled" in classified.message


def test_credentials_in_error_messages_are_redacted() -> None:
    key = "AIzaSyA1b2C3d4E5f6G7h8I9j0KlMnOpQrStUvW"
    body = google_error(400, "INVALID_ARGUMENT", f"API key not valid: {key}", API_KEY_INVALID)
    error = classify_error("gem", 400, body, {})
    assert isinstance(error, UpstreamAuthFailed)
    assert key not in error.message and "[redacted]" in error.message
    token = "ya29.a0AfB_byC-secret.token"
    body = google_error(401, "UNAUTHENTICATED", f"bad token {token}")
    assert token not in classify_error("gem", 401, body, {}).message
    raw = f"oops {key}".encode()
    assert key not in classify_error("gem", 500, raw, {}).message
