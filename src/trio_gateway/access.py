"""One access-log line per request, and the request id in every log line about it.

The front that accepts a request opens a :class:`RequestContext` (:func:`request_context`);
trio tasks inherit context variables when they are started, so the relay, the providers and the
log filter below all see it without it being passed around. ``relay.record`` fills in what the
answer was (alias, provider, outcome, tokens); the front writes the line when the request ends:
:func:`log_access`. A line never holds a key, a prompt or a completion.

``--log-format json`` writes one JSON object per line (:class:`JsonFormatter`); an access line's
fields are top-level keys there.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import attrs

from trio_gateway.tracing import TraceContext
from trio_gateway.usage import UsageRecord

access_log = logging.getLogger("trio_gateway.access")

# Probes and scrapes come every few seconds: their lines are for debugging only.
QUIET_ROUTES = frozenset({"GET /healthz", "GET /readyz", "GET /metrics"})


@attrs.define(kw_only=True)
class RequestContext:
    request_id: str
    route: str  # "POST /v1/chat/completions", "WS /v1/ws"
    trace: TraceContext
    status: int | None = None  # HTTP status sent; None for a WebSocket request, or none sent
    # Filled in by relay.record (or by the front for a request refused before it).
    alias: str | None = None
    provider: str | None = None
    key: str | None = None
    outcome: str | None = None
    code: str | None = None
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    def record(self, record: UsageRecord) -> None:
        """What the answer was, from its usage record (relay.record, or a refusal's)."""
        self.alias = record.alias
        self.provider = record.provider
        self.key = record.key
        self.outcome = record.outcome
        self.code = record.error_code
        self.ttft_s = record.ttft_s
        self.prompt_tokens = record.prompt_tokens
        self.completion_tokens = record.completion_tokens

    def fields(self, duration_s: float) -> dict[str, object]:
        return {
            "request_id": self.request_id,
            "route": self.route,
            "status": self.status,
            "outcome": self.outcome,
            "code": self.code,
            "alias": self.alias,
            "provider": self.provider,
            "key": self.key,
            "ttft_ms": None if self.ttft_s is None else round(self.ttft_s * 1000, 1),
            "duration_ms": round(duration_s * 1000, 1),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "trace_id": self.trace.trace_id,
        }


_CURRENT: ContextVar[RequestContext | None] = ContextVar("trio_gateway_request", default=None)


def current() -> RequestContext | None:
    return _CURRENT.get()


@contextmanager
def request_context(context: RequestContext) -> Iterator[RequestContext]:
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)


def log_access(context: RequestContext, duration_s: float) -> None:
    fields = context.fields(duration_s)
    level = logging.DEBUG if context.route in QUIET_ROUTES else logging.INFO
    if access_log.isEnabledFor(level):
        text = " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())
        access_log.log(level, "%s", text, extra={"access": fields})


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` ("-" outside a request) to every record, for the formats below."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _CURRENT.get()
        record.request_id = context.request_id if context is not None else "-"
        return True


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
        }
        access = getattr(record, "access", None)
        if isinstance(access, dict):
            out.update(access)
        else:
            out["message"] = record.getMessage()
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str, log_format: str) -> None:
    """The CLI's logging: text or JSON lines on stderr, with request ids."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    formatter = JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)
    handler.setFormatter(formatter)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # One line per upstream request is noise at INFO; the gateway logs what matters.
    logging.getLogger("httpx").setLevel(logging.WARNING)
