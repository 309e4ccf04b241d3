"""The gateway's spans on OpenTelemetry's own SDK, exported over OTLP/HTTP (protobuf).

Imported only when ``[tracing]`` is configured (``process/serve.py``): the SDK is the optional
``tracing`` extra, and a gateway without it never loads it.

::

    the loop's thread                       the exporter's thread (the SDK's BatchSpanProcessor)
    span.end() ─▶ _BoundedProcessor ─▶ queue ─▶ _CountingExporter ─▶ OTLPSpanExporter ─▶ collector
                  (full: drop, count)            (failed: count)

Nothing on the loop waits for the collector: an ended span is put on the processor's queue
(a deque, no lock held across I/O), and the SDK's own thread exports batches. A collector that
is down or slow fills the queue; past ``max_queued_spans`` spans are dropped, newest first, and
counted (``gateway_trace_spans_dropped_total``). The queue is bounded here, before the SDK's,
so that every drop is counted (the SDK's own queue drops its oldest without saying so to the
caller): the SDK's is made a batch larger than ours, and never fills.

Spans are made explicitly, with their parent given (``context=``), never through
OpenTelemetry's current span: its context lives in context variables, which trio tasks copy when
they start, so "current" would not follow a request across its tasks.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit

import trio
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import (
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    set_span_in_context,
)
from opentelemetry.trace import Span as ApiSpan

from trio_gateway import __version__
from trio_gateway.core.errors import GatewayError
from trio_gateway.core.events import Event
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.usage import UsageRecord
from trio_gateway.ops.spans import (
    OPERATIONS,
    AnswerWatch,
    Attribute,
    Attributes,
    Emit,
    input_messages,
    provider_name,
    record_attributes,
    request_attributes,
)
from trio_gateway.ops.tracing import TraceContext, parse_traceparent

INSTRUMENTATION = "trio_gateway"
# The wait for the last spans' export when the gateway stops: after the drain, never longer.
SHUTDOWN_TIMEOUT_S = 5.0


class ExportStats:
    """Spans through the exporter, for ``/metrics`` (``metrics.TraceExportCollector``). Each
    count has one writer: ``offered`` and ``queue_full`` the loop's thread, the others the
    exporter's (the SDK exports one batch at a time); reads from another thread see a count
    a batch old at worst."""

    __slots__ = ("export_failed", "exported", "offered", "queue_full", "taken")

    def __init__(self) -> None:
        self.offered = 0  # handed to the SDK's queue
        self.queue_full = 0  # dropped here: the queue was full
        self.taken = 0  # taken off the queue by the exporter's thread
        self.exported = 0
        self.export_failed = 0  # in a batch the collector did not take

    def queued(self) -> int:
        return self.offered - self.taken

    def dropped(self) -> dict[str, int]:
        return {"queue_full": self.queue_full, "export_failed": self.export_failed}


class _CountingExporter(SpanExporter):
    """The OTLP exporter, counting what it was given and what the collector refused."""

    def __init__(self, inner: SpanExporter, stats: ExportStats) -> None:
        self._inner = inner
        self._stats = stats

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        stats = self._stats
        stats.taken += len(spans)
        try:
            result = self._inner.export(spans)
        except Exception:
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            stats.exported += len(spans)
        else:
            stats.export_failed += len(spans)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class _BoundedProcessor(SpanProcessor):
    """The batch processor behind a bound of ``max_queued`` spans that it counts."""

    def __init__(self, inner: BatchSpanProcessor, stats: ExportStats, max_queued: int) -> None:
        self._inner = inner
        self._stats = stats
        self._max_queued = max_queued

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        pass

    def on_end(self, span: ReadableSpan) -> None:
        stats = self._stats
        if stats.offered - stats.taken >= self._max_queued:
            stats.queue_full += 1
            return
        stats.offered += 1
        self._inner.on_end(span)

    def shutdown(self) -> None:
        self._inner.shutdown()  # type: ignore[no-untyped-call]  # the SDK's is untyped

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._inner.force_flush(timeout_millis)


class OtelTracing:
    """``[tracing]``: a tracer provider of the gateway's own (never the process-global one),
    parent-based sampling (a client's sampled trace is always recorded, an unsampled one
    never; a new trace at ``sample_ratio``), and the bounded export above."""

    def __init__(
        self,
        *,
        otlp_endpoint: str,
        headers: Mapping[str, str],
        sample_ratio: float,
        service_name: str,
        capture_content: bool,
        max_queued_spans: int,
        max_batch_spans: int,
        export_interval_s: float,
        export_timeout_s: float,
        exporter: SpanExporter | None = None,
    ) -> None:
        self.stats = ExportStats()
        self.capture_content = capture_content
        inner = exporter or OTLPSpanExporter(
            endpoint=otlp_endpoint, headers=dict(headers), timeout=export_timeout_s
        )
        batches = BatchSpanProcessor(
            _CountingExporter(inner, self.stats),
            # One batch more than the bound here: a batch being taken while we count never
            # makes the SDK drop one we counted as queued.
            max_queue_size=max_queued_spans + max_batch_spans,
            schedule_delay_millis=export_interval_s * 1000,
            max_export_batch_size=max_batch_spans,
            export_timeout_millis=export_timeout_s * 1000,
        )
        self._provider = TracerProvider(
            sampler=ParentBased(TraceIdRatioBased(sample_ratio)),
            resource=Resource.create(
                {"service.name": service_name, "service.version": __version__}
            ),
            # Stopped by aclose, within the gateway's own shutdown; not by an atexit hook that
            # could wait 30 s for a collector that is gone.
            shutdown_on_exit=False,
        )
        self._provider.add_span_processor(_BoundedProcessor(batches, self.stats, max_queued_spans))
        self.tracer = self._provider.get_tracer(INSTRUMENTATION, __version__)

    def start(
        self, route: str, traceparent: str | None, tracestate: str | None
    ) -> tuple[ServerSpan | None, TraceContext]:
        incoming = parse_traceparent(traceparent, tracestate)
        if incoming is None:
            parent = Context()
        else:
            remote = SpanContext(
                int(incoming.trace_id, 16),
                int(incoming.parent_id, 16),
                is_remote=True,
                trace_flags=TraceFlags(int(incoming.flags, 16)),
            )
            parent = set_span_in_context(NonRecordingSpan(remote))
        span = self.tracer.start_span(
            route, context=parent, kind=SpanKind.SERVER, attributes={"trio_gateway.route": route}
        )
        trace = _trace_of(span, incoming.tracestate if incoming is not None else None)
        if not span.is_recording():
            return None, trace
        return ServerSpan(self, span, trace), trace

    async def aclose(self) -> None:
        """Export what is queued and stop the exporter's thread, in a thread: the SDK's
        shutdown joins its thread, which may be waiting on a collector. Shielded (a gateway
        cancelled still exports its last spans) and bounded: a collector that does not answer
        is left behind, with the exporter's daemon thread."""
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + 2 * SHUTDOWN_TIMEOUT_S
            await trio.to_thread.run_sync(self._shutdown, abandon_on_cancel=True)

    def _shutdown(self) -> None:
        self._provider.force_flush(int(SHUTDOWN_TIMEOUT_S * 1000))
        self._provider.shutdown()


def _trace_of(span: ApiSpan, tracestate: str | None) -> TraceContext:
    ids = span.get_span_context()
    flags = f"{ids.trace_flags:02x}"
    return TraceContext(f"{ids.trace_id:032x}", f"{ids.span_id:016x}", flags, tracestate)


class ServerSpan:
    """One request's span (``spans.RequestSpan``). Its attributes are gathered in a plain dict
    and given to the SDK once, at the end: the SDK checks and locks per call and per value, so
    one call instead of a dozen (some of them repeated) is most of what a span costs."""

    __slots__ = (
        "_attributes",
        "_model",
        "_operation",
        "_provider_type",
        "_span",
        "_status",
        "_tracing",
        "_watch",
        "trace",
    )

    def __init__(self, tracing: OtelTracing, span: ApiSpan, trace: TraceContext) -> None:
        self._tracing = tracing
        self._span = span
        self.trace = trace
        self._watch = AnswerWatch(capture=tracing.capture_content)
        self._attributes: dict[str, Attribute] = {}
        self._status: Status | None = None
        self._provider_type: str | None = None
        self._model: str | None = None
        self._operation = OPERATIONS[RequestKind.CHAT]

    def request(self, request: ChatRequest, response_id: str) -> None:
        attributes = self._attributes
        attributes.update(request_attributes(request, response_id))
        self._operation = OPERATIONS[request.kind]
        self._span.update_name(f"{self._operation} {request.alias}")
        if self._tracing.capture_content:
            content = input_messages(request)
            if content is None:
                attributes["trio_gateway.content.input_omitted"] = True
            else:
                attributes["gen_ai.input.messages"] = content

    def event(self, name: str, attributes: Attributes | None = None) -> None:
        self._span.add_event(name, attributes)

    def attempt(self, provider: str, provider_type: str, model: str, endpoint: str) -> OtelAttempt:
        self._provider_type, self._model = provider_type, model
        return OtelAttempt(
            self._tracing, self._span, self._operation, provider, provider_type, model, endpoint
        )

    def observe(self, emit: Emit) -> Emit:
        return _Observed(self._watch, emit).emit

    def record(self, record: UsageRecord) -> None:
        self._attributes.update(record_attributes(record))
        if record.ttft_s is not None:
            at = int((record.started_at + record.ttft_s) * 1e9)
            self._span.add_event("first_token", timestamp=at)
        if record.outcome == "failed":
            self._status = Status(StatusCode.ERROR, record.error_code)

    def end(self, status: int | None, alias: str | None) -> None:
        attributes = self._attributes
        watch = self._watch
        if status is not None:
            attributes["http.response.status_code"] = status
            if status >= 500:
                self._status = Status(StatusCode.ERROR, f"HTTP {status}")
        if alias is not None:
            attributes["gen_ai.request.model"] = alias
        if self._provider_type is not None:
            attributes["gen_ai.provider.name"] = provider_name(self._provider_type)
        if self._model is not None:
            attributes["gen_ai.response.model"] = self._model
        if watch.finish_reasons:
            attributes["gen_ai.response.finish_reasons"] = tuple(watch.finish_reasons)
        if self._tracing.capture_content:
            output = watch.output_messages()
            if output is not None:
                attributes["gen_ai.output.messages"] = output
            elif watch.overflowed:
                attributes["trio_gateway.content.output_omitted"] = True
        span = self._span
        span.set_attributes(attributes)
        if self._status is not None:
            span.set_status(self._status)
        span.end()


class _Observed:
    __slots__ = ("_emit", "_watch")

    def __init__(self, watch: AnswerWatch, emit: Emit) -> None:
        self._watch = watch
        self._emit = emit

    async def emit(self, events: list[Event]) -> None:
        self._watch.feed(events)
        await self._emit(events)


class OtelAttempt:
    """One upstream attempt's client span (``spans.AttemptSpan``); what it learns on the way
    is given to the SDK at its end, in one call."""

    __slots__ = ("_span", "_started", "_status", "_to_headers_s", "trace")

    def __init__(
        self,
        tracing: OtelTracing,
        parent: ApiSpan,
        operation: str,
        provider: str,
        provider_type: str,
        model: str,
        endpoint: str,
    ) -> None:
        address, port = _server(endpoint)
        attributes: dict[str, str | int] = {
            "gen_ai.operation.name": operation,
            "gen_ai.provider.name": provider_name(provider_type),
            "gen_ai.request.model": model,
            "trio_gateway.provider": provider,
            "server.address": address,
        }
        if port is not None:
            attributes["server.port"] = port
        self._span = tracing.tracer.start_span(
            f"{operation} {model}",
            context=set_span_in_context(parent),
            kind=SpanKind.CLIENT,
            attributes=attributes,
        )
        self._started = trio.current_time()
        self._status: int | None = None
        self._to_headers_s = 0.0
        self.trace = _trace_of(self._span, None)

    def headers(self, status: int) -> None:
        self._status = status
        self._to_headers_s = trio.current_time() - self._started

    def end(self, error: BaseException | None) -> None:
        attributes: dict[str, Attribute] = {}
        if self._status is not None:
            attributes["http.response.status_code"] = self._status
            attributes["trio_gateway.time_to_headers_s"] = self._to_headers_s
        span = self._span
        if isinstance(error, GatewayError):
            attributes["error.type"] = error.code
            span.set_status(Status(StatusCode.ERROR, error.code))
        elif _cancelled(error):
            attributes["trio_gateway.cancelled"] = True
        elif error is not None:
            attributes["error.type"] = type(error).__qualname__
            span.set_status(Status(StatusCode.ERROR, type(error).__qualname__))
        if attributes:
            span.set_attributes(attributes)
        span.end()


def _server(endpoint: str) -> tuple[str, int | None]:
    """server.address and server.port of a provider's endpoint URL."""
    parts = urlsplit(endpoint)
    try:
        port = parts.port
    except ValueError:
        port = None
    if port is None:
        port = {"https": 443, "http": 80}.get(parts.scheme)
    return parts.hostname or endpoint, port


def _cancelled(error: BaseException | None) -> bool:
    if isinstance(error, BaseExceptionGroup):
        return error.split(trio.Cancelled)[1] is None
    return isinstance(error, trio.Cancelled)
