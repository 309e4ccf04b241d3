"""Gemini's and Vertex AI's errors: google.rpc.Status to the gateway's codes, and when to retry."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import attrs

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

# google.rpc.Code names → the HTTP status Google gives them: an error inside a stream may carry
# the name only.
_STATUS_CODES: Final[Mapping[str, int]] = MappingProxyType(
    {
        "INVALID_ARGUMENT": 400,
        "FAILED_PRECONDITION": 400,
        "OUT_OF_RANGE": 400,
        "UNAUTHENTICATED": 401,
        "PERMISSION_DENIED": 403,
        "NOT_FOUND": 404,
        "RESOURCE_EXHAUSTED": 429,
        "CANCELLED": 499,
        "INTERNAL": 500,
        "UNKNOWN": 500,
        "UNAVAILABLE": 503,
        "DEADLINE_EXCEEDED": 504,
    }
)


_RETRY_INFO: Final = "type.googleapis.com/google.rpc.RetryInfo"


_QUOTA_FAILURE: Final = "type.googleapis.com/google.rpc.QuotaFailure"


_ERROR_INFO: Final = "type.googleapis.com/google.rpc.ErrorInfo"


# ErrorInfo reasons that mean the credential, not the request, is wrong. AI Studio answers a bad
# key with HTTP 400 INVALID_ARGUMENT + API_KEY_INVALID, so the status alone does not tell.
_AUTH_REASONS: Final = frozenset(
    {
        "API_KEY_INVALID",
        "API_KEY_EXPIRED",
        "API_KEY_SERVICE_BLOCKED",
        "API_KEY_HTTP_REFERRER_BLOCKED",
        "API_KEY_IP_ADDRESS_BLOCKED",
        "ACCESS_TOKEN_EXPIRED",
        "ACCESS_TOKEN_SCOPE_INSUFFICIENT",
        "CREDENTIALS_MISSING",
        "SERVICE_DISABLED",
    }
)


_AUTH_MESSAGE = re.compile(r"API key (not valid|expired|invalid)", re.IGNORECASE)


# Vertex's wording of a context overflow; AI Studio's ("The input token count (N) exceeds the
# maximum number of tokens allowed (M)") is one of upstream_errors' patterns.
_CONTEXT = re.compile(r"input token count is \d+ but (the )?model only supports", re.IGNORECASE)


# FAILED_PRECONDITION that is this provider's lot, not the request's: another provider (another
# region, another vendor) may answer.
_PROVIDER_PRECONDITION = re.compile(
    r"location is not supported|not available in your country", re.IGNORECASE
)


# A 429 that waiting seconds will not cure: a daily quota, a quota whose limit is 0 (the tier
# has none of it), prepaid credit used up.
_ZERO_LIMIT = re.compile(r"\blimit: 0\b")


_NO_CREDIT = re.compile(r"prepayment credits are depleted", re.IGNORECASE)


_OVER_QUOTA = re.compile(r"exceeded your current quota", re.IGNORECASE)


_RETRY_IN = re.compile(r"retry in (\d+(?:\.\d+)?)s\b", re.IGNORECASE)


_DURATION = re.compile(r"(\d+(?:\.\d+)?)s")


@attrs.frozen
class GoogleStatus:
    """The parts of a google.rpc Status the classification reads."""

    message: str
    status: str | None = None
    code: int | None = None
    details: tuple[Mapping[str, Any], ...] = ()

    def entries(self, kind: str) -> list[Mapping[str, Any]]:
        return [d for d in self.details if d.get("@type") == kind]


def google_status(error: object) -> GoogleStatus:
    """``{"code", "message", "status", "details"}`` → :class:`GoogleStatus`, message redacted
    and bounded; anything else is read as well as it can be."""
    if not isinstance(error, dict):
        return GoogleStatus(message="(no error message)")
    message = error.get("message")
    status = error.get("status")
    code = error.get("code")
    details = error.get("details")
    text = str(message) if message else "(no error message)"
    return GoogleStatus(
        message=redact_credentials(text)[:MAX_MESSAGE_CHARS],
        status=status if isinstance(status, str) else None,
        code=code if type(code) is int else None,
        details=tuple(d for d in details if isinstance(d, dict))
        if isinstance(details, list)
        else (),
    )


def _duration_s(value: object) -> float | None:
    """A protobuf Duration as JSON (``"4s"``, ``"1.5s"``) or as an object (``{"seconds",
    "nanos"}``) → seconds."""
    if isinstance(value, str):
        match = _DURATION.fullmatch(value.strip())
        return float(match.group(1)) if match else None
    if isinstance(value, dict):
        seconds, nanos = value.get("seconds", 0), value.get("nanos", 0)
        try:
            return float(seconds) + float(nanos) / 1e9
        except (TypeError, ValueError):
            return None
    return None


def retry_delay_s(status: GoogleStatus, headers: Mapping[str, str]) -> float | None:
    """How long to wait: the ``retry-after`` header when Google sent one (it rarely does), else
    the body's ``RetryInfo.retryDelay``, else the "Please retry in 4.2s." of the message."""
    wait = parse_retry_after(headers.get("retry-after"))
    if wait is not None:
        return wait
    for entry in status.entries(_RETRY_INFO):
        wait = _duration_s(entry.get("retryDelay"))
        if wait is not None:
            return wait
    match = _RETRY_IN.search(status.message)
    return float(match.group(1)) if match else None


def _quota_exhausted(status: GoogleStatus) -> bool:
    """A 429 that is not a rate limit.

    Google says RESOURCE_EXHAUSTED for both, and its message ("You exceeded your current quota,
    please check your plan and billing details") is the same for a per-minute limit that clears
    in seconds, so the decision rests on the details: a ``QuotaFailure`` naming a daily quota
    (``quotaId`` containing ``PerDay``: it resets at midnight Pacific time) or a quota whose
    value is 0 (the model is not in the account's tier at all), or prepaid credit used up.
    A quota message with neither ``RetryInfo`` nor ``QuotaFailure`` (the older wording of an
    account without billing) is also taken as exhausted. Everything else is a rate limit.
    """
    failures = status.entries(_QUOTA_FAILURE)
    for failure in failures:
        violations = failure.get("violations")
        for violation in violations if isinstance(violations, list) else ():
            if not isinstance(violation, dict):
                continue
            if "perday" in str(violation.get("quotaId", "")).lower():
                return True
            if str(violation.get("quotaValue", "")) == "0":
                return True
    if _ZERO_LIMIT.search(status.message) or _NO_CREDIT.search(status.message):
        return True
    return (
        not failures
        and not status.entries(_RETRY_INFO)
        and bool(_OVER_QUOTA.search(status.message))
        and "billing" in status.message.lower()
    )


def _is_auth(http_status: int, status: GoogleStatus) -> bool:
    if http_status in (401, 403) or status.status in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
        return True
    reasons = {str(entry.get("reason")) for entry in status.entries(_ERROR_INFO)}
    return bool(reasons & _AUTH_REASONS) or bool(_AUTH_MESSAGE.search(status.message))


def classify_status(
    provider: str,
    http_status: int,
    status: GoogleStatus,
    headers: Mapping[str, str],
    *,
    where: str,
) -> GatewayError:
    """One google.rpc Status, with the HTTP status it came with (or stands for) → the error."""
    message = status.message
    said = f"{provider} {where}: {message}"
    wait = retry_delay_s(status, headers)
    if http_status in (400, 413) and (
        is_context_length(message, None, None) or _CONTEXT.search(message)
    ):
        return ContextLengthExceeded(message, param="messages", provider=provider)
    if _is_auth(http_status, status):
        # Google's words ("API key not valid", "Permission denied on resource project X") say
        # what to fix; anything in them that looks like a credential is already redacted.
        return UpstreamAuthFailed(
            f"{provider}: google rejected the gateway's credential ({where}, "
            f"{status.status or http_status}): {message}",
            provider=provider,
        )
    if http_status == 400 and _PROVIDER_PRECONDITION.search(message):
        return UpstreamServerError(said, provider=provider)
    if http_status == 404:
        # The message names the model ("models/x is not found for API version v1beta", "Publisher
        # Model `projects/.../models/x` was not found"): the configuration is wrong.
        return ModelNotServed(
            f"{provider}: google does not serve the configured model ({where}): {message}",
            provider=provider,
        )
    if http_status == 429:
        if _quota_exhausted(status):
            return QuotaExhausted(
                f"{provider}: the google project's quota is used up ({where}): {message}",
                provider=provider,
            )
        return UpstreamRateLimited(said, provider=provider, retry_after_s=wait)
    if http_status == 503:
        return UpstreamOverloaded(said, provider=provider, retry_after_s=wait)
    if http_status in (408, 504):
        return UpstreamTimeout(said, provider=provider, retry_after_s=wait)
    if 400 <= http_status < 500:
        # INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE...: the request's own fault, which
        # the next provider of the alias would find too.
        return InvalidRequest(message, provider=provider)
    if http_status >= 500:
        return UpstreamServerError(said, provider=provider, retry_after_s=wait)
    return UpstreamProtocolError(
        f"{provider} answered unexpected HTTP {http_status}", provider=provider
    )


def _error_object(parsed: object) -> object:
    # The streaming endpoint without alt=sse wraps its answer, errors included, in an array.
    if isinstance(parsed, list) and parsed:
        parsed = parsed[0]
    return parsed.get("error") if isinstance(parsed, dict) else None


def classify_error(
    provider: str, status: int, body: bytes, headers: Mapping[str, str]
) -> GatewayError:
    """A non-2xx answer (``{"error": {"code", "message", "status", "details"}}``) → the error."""
    try:
        error = _error_object(json.loads(body))
    except ValueError:
        error = None
    if isinstance(error, dict):
        google = google_status(error)
    else:
        text = redact_credentials(body.decode("utf-8", "replace").strip())
        google = GoogleStatus(message=text[:MAX_MESSAGE_CHARS] or "(empty body)")
    return classify_status(provider, status, google, headers, where=f"answered HTTP {status}")


def classify_stream_error(provider: str, error: object) -> GatewayError:
    """The ``error`` object of a frame sent after the 200."""
    google = google_status(error)
    http_status = google.code or _STATUS_CODES.get(google.status or "", 500)
    return classify_status(provider, http_status, google, {}, where="failed mid-stream")
