"""The spans on OpenTelemetry's SDK (ops/otel.py): the sampling decision and the ids sent on,
and an export that never holds the caller: a bounded queue whose every drop is counted."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
import trio
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from tests.e2e.harness import wait_until
from trio_gateway.ops.otel import OtelTracing
from trio_gateway.ops.tracing import TraceContext

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class HeldExporter(SpanExporter):
    """Takes batches only once released; then answers ``result``."""

    def __init__(self, result: SpanExportResult = SpanExportResult.SUCCESS) -> None:
        self.released = threading.Event()
        self.result = result
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.released.wait(30)
        self.spans.extend(spans)
        return self.result

    def shutdown(self) -> None:
        self.released.set()


def tracing(
    exporter: SpanExporter, *, ratio: float = 1.0, max_queued: int = 100, batch: int = 10
) -> OtelTracing:
    return OtelTracing(
        otlp_endpoint="http://127.0.0.1:9/v1/traces",
        headers={},
        sample_ratio=ratio,
        service_name="trio-gateway",
        capture_content=False,
        max_queued_spans=max_queued,
        max_batch_spans=batch,
        export_interval_s=0.01,
        export_timeout_s=1.0,
        exporter=exporter,
    )


@pytest.fixture
def held() -> Iterator[HeldExporter]:
    exporter = HeldExporter()
    yield exporter
    exporter.released.set()


def fields(trace: TraceContext) -> tuple[str, str, int]:
    return trace.trace_id, trace.parent_id, int(trace.flags, 16) & 1


async def test_a_sampled_client_trace_is_continued_and_recorded(held: HeldExporter) -> None:
    spans = tracing(held, ratio=0.0)
    span, trace = spans.start("POST /v1/chat/completions", f"00-{TRACE}-{PARENT}-01", "k=v")
    assert span is not None and span.trace == trace
    trace_id, span_id, sampled = fields(trace)
    assert (trace_id, sampled) == (TRACE, 1) and span_id != PARENT
    assert trace.tracestate == "k=v"
    attempt = span.attempt("sim-a", "openai_compatible", "qwen3", "http://127.0.0.1:8000/v1")
    assert fields(attempt.trace)[0] == TRACE and attempt.trace.parent_id != span_id
    attempt.end(None)
    span.end(200, "agent-lite")
    held.released.set()
    await spans.aclose()
    by_id = {f"{s.context.span_id:016x}": s for s in held.spans}
    server, client = by_id[span_id], by_id[attempt.trace.parent_id]
    assert server.parent is not None and f"{server.parent.span_id:016x}" == PARENT
    assert server.parent.is_remote
    assert client.parent is not None and f"{client.parent.span_id:016x}" == span_id


@pytest.mark.parametrize(
    ("traceparent", "ratio"),
    [(f"00-{TRACE}-{PARENT}-00", 1.0), (None, 0.0), ("not a traceparent", 0.0)],
)
async def test_an_unsampled_trace_makes_no_span_but_sends_its_ids_on(
    held: HeldExporter, traceparent: str | None, ratio: float
) -> None:
    spans = tracing(held, ratio=ratio)
    span, trace = spans.start("POST /v1/chat/completions", traceparent, None)
    assert span is None
    trace_id, span_id, sampled = fields(trace)
    assert sampled == 0 and span_id != PARENT and len(span_id) == 16
    assert (trace_id == TRACE) == (traceparent is not None and TRACE in traceparent)
    held.released.set()
    await spans.aclose()
    assert held.spans == []


async def test_a_new_trace_is_recorded_at_ratio_one(held: HeldExporter) -> None:
    spans = tracing(held)
    span, trace = spans.start("WS /v1/ws", None, None)
    assert span is not None and fields(trace)[2] == 1 and trace.trace_id != TRACE


async def test_a_held_exporter_never_holds_the_caller_and_drops_are_counted(
    held: HeldExporter,
) -> None:
    spans = tracing(held, max_queued=5, batch=2)
    started = trio.current_time()
    for _ in range(40):
        span, _ = spans.start("POST /v1/chat/completions", None, None)
        assert span is not None
        span.end(200, "agent-lite")
    # Forty spans ended while the exporter held its first batch: not a wait among them.
    assert trio.current_time() - started < 1.0
    stats = spans.stats
    await wait_until(lambda: stats.taken > 0)  # the exporter's thread took its first batch
    assert stats.offered + stats.queue_full == 40
    assert stats.queued() <= 5
    assert stats.queue_full >= 40 - 5 - 2
    held.released.set()
    await wait_until(lambda: stats.exported == stats.offered)
    assert len(held.spans) == stats.offered
    await spans.aclose()


async def test_a_failed_export_is_counted() -> None:
    refusing = HeldExporter(SpanExportResult.FAILURE)
    refusing.released.set()
    spans = tracing(refusing)
    for _ in range(3):
        span, _ = spans.start("POST /v1/chat/completions", None, None)
        assert span is not None
        span.end(503, None)
    await wait_until(lambda: spans.stats.export_failed == 3)
    assert spans.stats.dropped() == {"queue_full": 0, "export_failed": 3}
    assert spans.stats.exported == 0
    await spans.aclose()
