"""The gateway's one error tree.

Every failure a caller can see is a :class:`GatewayError` with a stable ``code``. Foreign
exceptions (httpx, trio timeouts, JSON errors) are mapped to it at the boundary where they
occur, never further in.

::

    GatewayError
    ├── RequestError                    the request's fault: no fallback, 4xx
    │   ├── InvalidJSON                 400 invalid_json
    │   ├── InvalidRequest              400 invalid_request (also upstream 400s)
    │   ├── UnsupportedParameter        400 unsupported_parameter
    │   ├── ContextLengthExceeded       400 context_length_exceeded
    │   ├── CapabilityUnavailable       400 capability_unavailable
    │   ├── UnsupportedEndpoint         400 unsupported_endpoint
    │   ├── BodyTooLarge                413 body_too_large
    │   ├── MalformedHttp               400 malformed_http (a body's framing; http1/)
    │   ├── RequestTimeout              408 request_timeout (a body too slow to come)
    │   ├── ModelNotFound               404 model_not_found (unknown alias)
    │   ├── RouteNotFound               404 not_found
    │   ├── ResponseNotFound            404 response_not_found (none, expired, another key's)
    │   ├── ConversationTooLong         400 conversation_too_long (a stored chain past its bounds)
    │   ├── MethodNotAllowed            405 method_not_allowed
    │   ├── Unauthorized                401 invalid_api_key (WWW-Authenticate: Bearer)
    │   ├── Forbidden                   403 alias_not_allowed
    │   ├── AdminRequired               403 admin_required (the operator's endpoints)
    │   ├── BudgetExceeded              402 budget_exceeded (the key's budget cannot cover it)
    │   ├── RateLimited                 429 rate_limited (the key's rpm/tpm; Retry-After)
    │   ├── ContentFiltered             400 content_filtered (an input or a block output filter)
    │   └── MessageRefused              a WebSocket message refused; the socket stays open
    │       ├── InvalidMessage          invalid_message
    │       ├── UnknownMessageType      unknown_type
    │       ├── MessageTooLarge         message_too_large
    │       ├── DuplicateId             duplicate_id
    │       ├── TooManyRequests         too_many_requests (retryable)
    │       └── ConnectionLimitReached  websocket_connection_limit_reached (a socket's age)
    ├── UpstreamError                   a provider failed: the next one may be tried, 5xx
    │   ├── UpstreamUnreachable         502 upstream_unreachable
    │   ├── UpstreamTimeout             504 upstream_timeout
    │   ├── UpstreamAuthFailed          502 upstream_auth_failed
    │   ├── UpstreamRateLimited         429 rate_limited (Retry-After)
    │   ├── UpstreamOverloaded          503 upstream_overloaded (Anthropic 529; Retry-After)
    │   ├── QuotaExhausted              429 quota_exhausted (never retried on that provider)
    │   ├── UpstreamServerError         502 upstream_error
    │   │   ├── UnusableAnswer          502 upstream_error (the vendor answered with no answer)
    │   │   └── ModelNotServed          502 upstream_error (a 404: no such model, or route)
    │   └── UpstreamProtocolError       502 upstream_protocol_error
    ├── AllProvidersFailed              503 upstream_unavailable
    ├── Overloaded                      503 overloaded
    │   └── DescriptorsExhausted        503 overloaded (out of file descriptors; Retry-After)
    ├── ShuttingDown                    503 shutting_down
    ├── LimitsUnavailable               503 limits_unavailable (Redis down, fail_closed)
    ├── StoreUnavailable                503 store_unavailable (stored responses unreadable)
    └── InternalError                   500 internal_error
"""

from __future__ import annotations

from typing import Any, ClassVar


class GatewayError(Exception):
    """Base of every error the gateway reports to a caller."""

    code: ClassVar[str] = "internal_error"
    status: ClassVar[int] = 500
    openai_type: ClassVar[str] = "server_error"
    retryable: ClassVar[bool] = False

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        provider: str | None = None,
        retry_after_s: float | None = None,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.provider = provider
        self.retry_after_s = retry_after_s
        # Set where an answer names the request it belongs to (an internal error's only clue).
        self.request_id = request_id

    def to_body(self) -> dict[str, Any]:
        """The OpenAI-shaped error body, as sent over HTTP or in-band."""
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.openai_type,
            "code": self.code,
            "param": self.param,
        }
        if self.provider is not None:
            error["provider"] = self.provider
        if self.retry_after_s is not None:
            error["retry_after_s"] = self.retry_after_s
        if self.request_id is not None:
            error["request_id"] = self.request_id
        return {"error": error}

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.retry_after_s is None:
            return []
        # Retry-After takes whole seconds; round up so a client never retries too early.
        seconds = max(1, int(-(-self.retry_after_s // 1)))
        return [(b"retry-after", str(seconds).encode())]


class RequestError(GatewayError):
    status = 400
    openai_type = "invalid_request_error"


class InvalidJSON(RequestError):
    code = "invalid_json"


class InvalidRequest(RequestError):
    code = "invalid_request"


class UnsupportedParameter(RequestError):
    code = "unsupported_parameter"


class ContextLengthExceeded(RequestError):
    code = "context_length_exceeded"


class CapabilityUnavailable(RequestError):
    code = "capability_unavailable"


class UnsupportedEndpoint(RequestError):
    """The alias has no provider that serves this endpoint (``/v1/completions`` and
    ``/v1/embeddings`` are OpenAI's and vLLM's only), or the provider's model does not (its
    404). 400, not 404: the route and the alias both exist, and an SDK reads 404 as "no such
    model"; not 501: a 5xx is retried by SDKs, and asking again cannot help."""

    code = "unsupported_endpoint"


class BodyTooLarge(RequestError):
    code = "body_too_large"
    status = 413


class MalformedHttp(RequestError):
    """A request body the HTTP/1.x server could not frame: its connection closes after the
    answer. A malformed head never reaches the app: the server answers it (http1/server.py)."""

    code = "malformed_http"


class RequestTimeout(RequestError):
    code = "request_timeout"
    status = 408


class ModelNotFound(RequestError):
    code = "model_not_found"
    status = 404
    openai_type = "not_found_error"


class RouteNotFound(RequestError):
    code = "not_found"
    status = 404
    openai_type = "not_found_error"


class ResponseNotFound(RequestError):
    """A stored response (``/v1/responses/{id}``, ``previous_response_id``) that does not
    exist, has expired, or belongs to another key."""

    code = "response_not_found"
    status = 404
    openai_type = "invalid_request_error"


class ConversationTooLong(RequestError):
    """A ``previous_response_id`` whose stored chain of turns is longer (in turns or bytes)
    than ``[responses] max_chain_turns`` / ``max_chain_bytes`` let the gateway read back."""

    code = "conversation_too_long"


class MethodNotAllowed(RequestError):
    code = "method_not_allowed"
    status = 405


class Unauthorized(RequestError):
    """No API key, or one the keys file does not hold. The message never quotes the key."""

    code = "invalid_api_key"
    status = 401

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [(b"www-authenticate", b'Bearer realm="trio-gateway"'), *super().headers()]


class Forbidden(RequestError):
    """A known API key asked for an alias it may not use."""

    code = "alias_not_allowed"
    status = 403


class AdminRequired(RequestError):
    """A known API key, not marked ``admin = true``, asked for an operator's endpoint
    (/status.json, /metrics) of a gateway that requires keys."""

    code = "admin_required"
    status = 403


class KeyLimitError(RequestError):
    """A refusal by one of the key's own limits: nothing was sent upstream. Carries the key's
    ``x-ratelimit-*`` headers, as every answer to a rate-limited key does."""

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float | None = None,
        rate_headers: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        super().__init__(message, retry_after_s=retry_after_s)
        self.rate_headers = rate_headers or []

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [*super().headers(), *self.rate_headers]


class BudgetExceeded(KeyLimitError):
    """The key's budget, less what it spent and what its running requests hold, cannot cover
    this request's estimate (its prompt and all the output it may produce, at the costliest of
    the alias's providers)."""

    code = "budget_exceeded"
    status = 402
    openai_type = "insufficient_quota"


class RateLimited(KeyLimitError):
    """The key is over its requests/min or tokens/min (the gateway's own limit, not a
    provider's)."""

    code = "rate_limited"
    status = 429
    openai_type = "rate_limit_error"
    retryable = True


class ContentFiltered(RequestError):
    """A request whose messages match one of its alias's ``input_filters``, or an answer that
    met a ``block`` output filter (core/filters.py): before anything of the answer was said, the
    answer is this error; after, the stream ends with it in band. ``filter`` names the filter.
    A request error: another provider would be asked the same, so none is."""

    code = "content_filtered"

    def __init__(self, message: str, *, filter_name: str, provider: str | None = None) -> None:
        super().__init__(message, provider=provider)
        self.filter_name = filter_name


class MessageRefused(RequestError):
    """A WebSocket message the gateway will not act on; the socket stays open.

    ``message_id`` names the message's ``id`` when one could be read, so a client can tell which
    of its requests was refused.
    """

    code = "invalid_message"

    def __init__(self, message: str, *, message_id: str | None = None) -> None:
        super().__init__(message)
        self.message_id = message_id


class InvalidMessage(MessageRefused):
    code = "invalid_message"


class UnknownMessageType(MessageRefused):
    code = "unknown_type"


class MessageTooLarge(MessageRefused):
    code = "message_too_large"
    status = 413


class DuplicateId(MessageRefused):
    code = "duplicate_id"


class TooManyRequests(MessageRefused):
    code = "too_many_requests"
    status = 429
    retryable = True


class ConnectionLimitReached(MessageRefused):
    """A Responses WebSocket past its maximum age (the API's 60 minutes): nothing more is
    started on it, and it closes; the client opens a new one."""

    code = "websocket_connection_limit_reached"


class UpstreamError(GatewayError):
    """A provider failed in a way that another provider might not."""

    status = 502
    retryable = True


class UpstreamUnreachable(UpstreamError):
    code = "upstream_unreachable"


class UpstreamTimeout(UpstreamError):
    code = "upstream_timeout"
    status = 504


class UpstreamAuthFailed(UpstreamError):
    code = "upstream_auth_failed"


class UpstreamRateLimited(UpstreamError):
    """The provider asked us to slow down (429): it rests, the next provider is tried."""

    code = "rate_limited"
    status = 429
    openai_type = "rate_limit_error"


class UpstreamOverloaded(UpstreamError):
    """The provider is busy as a whole (Anthropic 529 ``overloaded_error``, Gemini 503
    ``UNAVAILABLE``): it rests like a rate-limited one, but the caller sees a 503."""

    code = "upstream_overloaded"
    status = 503


class QuotaExhausted(UpstreamError):
    """The account behind the provider has no quota left (OpenAI ``insufficient_quota``):
    waiting does not help, so the client is not told to retry; other providers may still answer."""

    code = "quota_exhausted"
    status = 429
    openai_type = "insufficient_quota"
    retryable = False


class UpstreamServerError(UpstreamError):
    code = "upstream_error"


class UnusableAnswer(UpstreamServerError):
    """The vendor answered, and its answer is none (Gemini's ``MALFORMED_FUNCTION_CALL``,
    ``TOO_MANY_TOOL_CALLS``...): ``upstream_error`` to the client, and another provider may be
    tried while the client has seen nothing; but the provider is up, so its health does not
    count it as a failure (a model that keeps failing one prompt must not take the provider out
    of rotation for every other request)."""


class ModelNotServed(UpstreamServerError):
    """The vendor answered 404: the configured model does not exist there (vLLM's "The model
    `x` does not exist.", OpenAI's ``model_not_found``, Anthropic's ``not_found_error``,
    Gemini's ``NOT_FOUND``), or ``base_url`` leads to no such route. ``upstream_error`` to the
    client as before; to the readiness probe, a configuration error, not a server still loading
    (capacity/health.py)."""


class UpstreamProtocolError(UpstreamError):
    code = "upstream_protocol_error"


class AllProvidersFailed(GatewayError):
    """Every eligible provider was tried and none could answer."""

    code = "upstream_unavailable"
    status = 503
    retryable = True

    def __init__(self, failures: list[GatewayError]) -> None:
        detail = "; ".join(f"{f.provider or '?'}: [{f.code}] {f.message}" for f in failures)
        waits = [f.retry_after_s for f in failures if f.retry_after_s is not None]
        super().__init__(
            f"all {len(failures)} providers failed: {detail}",
            retry_after_s=min(waits) if waits else None,
        )
        self.failures = failures

    def to_body(self) -> dict[str, Any]:
        body = super().to_body()
        body["error"]["attempts"] = [
            {"provider": f.provider, "code": f.code, "message": f.message} for f in self.failures
        ]
        return body


class Overloaded(GatewayError):
    """No provider had a free slot within its queue timeout."""

    code = "overloaded"
    status = 503
    retryable = True


class DescriptorsExhausted(Overloaded):
    """The gateway itself is out of file descriptors (core/descriptors.py): no provider is at
    fault, so none is tried next or marked down."""

    def __init__(self, message: str, *, retry_after_s: float | None = 1.0) -> None:
        super().__init__(message, retry_after_s=retry_after_s)


class ShuttingDown(GatewayError):
    """The gateway is stopping: the answer was cut at the end of the drain, or never began."""

    code = "shutting_down"
    status = 503
    retryable = True


class LimitsUnavailable(GatewayError):
    """Budgets and rate limits live in Redis, Redis did not answer in time, and
    ``[redis] on_error = "fail_closed"``."""

    code = "limits_unavailable"
    status = 503
    retryable = True


class StoreUnavailable(GatewayError):
    """The stored responses could not be read (Redis did not answer, the file failed)."""

    code = "store_unavailable"
    status = 503
    retryable = True


class InternalError(GatewayError):
    code = "internal_error"
