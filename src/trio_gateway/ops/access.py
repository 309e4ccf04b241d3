"""One access-log line per request, and the request id in every log line about it.

The front that accepts a request opens a :class:`RequestContext` (:func:`request_context`);
trio tasks inherit context variables when they are started, so the relay, the providers and the
log filter below all see it without it being passed around. ``relay.record`` fills in what the
answer was (alias, provider, outcome, tokens); the front writes the line when the request ends:
:func:`log_access`. A line never holds a key, a prompt or a completion.

``--log-format json`` writes one JSON object per line (:class:`JsonFormatter`); an access line's
fields are top-level keys there. The formats run on the log's writer thread (log_queue.py):
what they show of the request is captured on the caller's, by :class:`RequestIdFilter` and in
the record's ``access`` fields.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, KeysView
from contextvars import ContextVar, Token

import attrs

from trio_gateway.core.usage import UsageRecord
from trio_gateway.ops.spans import RequestSpan
from trio_gateway.ops.tracing import TraceContext

access_log = logging.getLogger("trio_gateway.access")

# Probes and scrapes come every few seconds: their lines are for debugging only.
QUIET_ROUTES = frozenset(
    f"{method} {path}" for method in ("GET", "HEAD") for path in ("/healthz", "/readyz", "/metrics")
)


@attrs.define(kw_only=True)
class RequestContext:
    request_id: str
    route: str  # "POST /v1/chat/completions", "WS /v1/ws"
    trace: TraceContext
    status: int | None = None  # HTTP status sent; None for a WebSocket request, or none sent
    # The client's x-priority header, read by the front with the body (core/priority.py).
    priority_header: str | None = None
    # The client's anthropic-beta header, read by the Messages front (passed on to Anthropic).
    anthropic_beta: str | None = None
    # Filled in by relay.record (or by the front for a request refused before it).
    alias: str | None = None
    provider: str | None = None
    key: str | None = None
    priority: int | None = None
    outcome: str | None = None
    code: str | None = None
    ttft_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    # Set by the upstream shell while it reads a response: shuts that connection at once, from
    # outside the request's task (a hang-up seen while the producer waits its turn).
    abort_upstream: Callable[[], object] | None = None
    # The request's span when tracing is on and its trace sampled (ops/spans.py); else None,
    # and nothing about spans is done for it.
    span: RequestSpan | None = None

    def record(self, record: UsageRecord) -> None:
        """What the answer was, from its usage record (relay.record, or a refusal's)."""
        if self.span is not None:
            self.span.record(record)
        self.alias = record.alias
        self.provider = record.provider
        self.key = record.key
        self.priority = record.priority
        self.outcome = record.outcome
        self.code = record.error_code
        self.ttft_s = record.ttft_s
        self.prompt_tokens = record.prompt_tokens
        self.completion_tokens = record.completion_tokens

    def access_line(self, duration_s: float) -> AccessLine:
        """The access line's values as they are now (the request has ended); its fields and
        text are made later, where it is written."""
        return AccessLine(
            (
                self.request_id,
                self.route,
                self.status,
                self.outcome,
                self.code,
                self.alias,
                self.provider,
                self.key,
                self.priority,
                self.ttft_s,
                duration_s,
                self.prompt_tokens,
                self.completion_tokens,
                self.trace.trace_id,
            )
        )

    def line(self, duration_s: float) -> tuple[dict[str, object], str]:
        """The access line: its fields, and its text (:meth:`AccessLine.line`)."""
        return self.access_line(duration_s).line()


# request_id, route, status, outcome, code, alias, provider, key, priority, ttft_s,
# duration_s, prompt_tokens, completion_tokens, trace_id: immutable values only.
AccessValues = tuple[
    str,
    str,
    int | None,
    str | None,
    str | None,
    str | None,
    str | None,
    str | None,
    int | None,
    float | None,
    float,
    int | None,
    int | None,
    str,
]


class AccessLine:
    """One request's access line. Its values are taken on the event loop when the request ends
    (:meth:`RequestContext.access_line`: a tuple, the cheapest capture); its fields (``dict()``
    of it) and its text (``str()``) are made from them when first asked for, by the log's
    writer thread (log_queue.py), so that formatting too leaves the loop. Immutable, so the
    writer may read it whenever it gets to it. Not a ``Mapping``: a record whose one argument
    is a mapping takes it for named ``%(...)s`` arguments."""

    __slots__ = ("_line", "_values")

    def __init__(self, values: AccessValues) -> None:
        self._values = values
        self._line: tuple[dict[str, object], str] | None = None

    def line(self) -> tuple[dict[str, object], str]:
        """Its fields and its text (``key=value`` in that order, ``-`` for none). Times are in
        ms to 0.1, as ``round(ms, 1)`` has them: ``.1f`` keeps the same correctly rounded
        digits, and the text takes them as they are rather than formatting each float twice.
        Made once; two threads asking at once make the same twice."""
        if self._line is None:
            self._line = _fields_and_text(self._values)
        return self._line

    def fields(self) -> dict[str, object]:
        return self.line()[0]

    def keys(self) -> KeysView[str]:
        return self.line()[0].keys()

    def __getitem__(self, name: str) -> object:
        return self.line()[0][name]

    def __str__(self) -> str:
        return self.line()[1]


def _fields_and_text(values: AccessValues) -> tuple[dict[str, object], str]:
    (
        request_id,
        route,
        status,
        outcome,
        code,
        alias,
        provider,
        key,
        priority,
        ttft_s,
        duration_s,
        prompt,
        completion,
        trace_id,
    ) = values
    ttft = None if ttft_s is None else f"{ttft_s * 1000:.1f}"
    duration = f"{duration_s * 1000:.1f}"
    fields: dict[str, object] = {
        "request_id": request_id,
        "route": route,
        "status": status,
        "outcome": outcome,
        "code": code,
        "alias": alias,
        "provider": provider,
        "key": key,
        "priority": priority,
        "ttft_ms": None if ttft is None else float(ttft),
        "duration_ms": float(duration),
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "trace_id": trace_id,
    }
    text = (
        f"request_id={request_id} route={route}"
        f" status={'-' if status is None else status}"
        f" outcome={'-' if outcome is None else outcome}"
        f" code={'-' if code is None else code}"
        f" alias={'-' if alias is None else alias}"
        f" provider={'-' if provider is None else provider}"
        f" key={'-' if key is None else key}"
        f" priority={'-' if priority is None else priority}"
        f" ttft_ms={'-' if ttft is None else ttft} duration_ms={duration}"
        f" prompt_tokens={'-' if prompt is None else prompt}"
        f" completion_tokens={'-' if completion is None else completion}"
        f" trace_id={trace_id}"
    )
    return fields, text


_CURRENT: ContextVar[RequestContext | None] = ContextVar("trio_gateway_request", default=None)


def current() -> RequestContext | None:
    return _CURRENT.get()


class request_context:
    """The request's context for the code it runs (a class, not ``@contextmanager``: one per
    request, thousands at once)."""

    def __init__(self, context: RequestContext) -> None:
        self._context = context
        self._token: Token[RequestContext | None] | None = None

    def __enter__(self) -> RequestContext:
        self._token = _CURRENT.set(self._context)
        return self._context

    def __exit__(self, *exc_info: object) -> None:
        assert self._token is not None
        _CURRENT.reset(self._token)


def log_access(context: RequestContext, duration_s: float) -> None:
    level = logging.DEBUG if context.route in QUIET_ROUTES else logging.INFO
    if not access_log.isEnabledFor(level):
        return
    line = context.access_line(duration_s)
    # Logger.log would first walk the stack for the caller's file and line (findCaller), which
    # no format of the gateway shows: the record is made and handled as logging makes it when
    # it has no source file to look for.
    record = access_log.makeRecord(
        access_log.name, level, "(unknown file)", 0, "%s", (line,), None, "(unknown function)"
    )
    record.access = line
    access_log.handle(record)


class RequestIdFilter(logging.Filter):
    """Adds ``request_id`` ("-" outside a request) to every record, for the formats below."""

    def filter(self, record: logging.LogRecord) -> bool:
        context = _CURRENT.get()
        record.request_id = context.request_id if context is not None else "-"
        return True


TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(request_id)s]: %(message)s"


class _SecondCache:
    """A time format to the second, computed once a second: ``strftime`` was half the cost of
    formatting a line, and the lines of one second share it. One attribute holds the second and
    its text together, so a formatter two threads share never pairs one with the other's."""

    def __init__(self, convert: Callable[[float | None], time.struct_time], fmt: str) -> None:
        self._convert = convert
        self._fmt = fmt
        self._last: tuple[int, str] = (-1, "")

    def text(self, created: float) -> str:
        second = int(created)
        last = self._last
        if last[0] != second:
            last = self._last = (second, time.strftime(self._fmt, self._convert(created)))
        return last[1]


class TextFormatter(logging.Formatter):
    """:data:`TEXT_FORMAT`, its ``asctime`` as logging writes it."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)
        self._seconds = _SecondCache(self.converter, self.default_time_format)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        msec_format = self.default_msec_format
        if datefmt or msec_format is None:
            return super().formatTime(record, datefmt)
        return msec_format % (self._seconds.text(record.created), record.msecs)


class JsonFormatter(logging.Formatter):
    """One JSON object per line, for log shippers."""

    def __init__(self) -> None:
        super().__init__()
        self._seconds = _SecondCache(time.gmtime, "%Y-%m-%dT%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": self._seconds.text(record.created) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "request_id": getattr(record, "request_id", "-"),
        }
        access = getattr(record, "access", None)
        if isinstance(access, AccessLine):
            out.update(access.fields())
        else:
            out["message"] = record.getMessage()
        # The log's queue renders a traceback on the caller's thread (log_queue.capture) and
        # leaves only its text.
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exception"] = record.exc_text
        return json.dumps(out, ensure_ascii=False, default=str)
