"""Request ids and W3C trace context: what is kept, what is replaced; the log formats."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_gateway.core.usage import refused_record
from trio_gateway.ops.access import (
    JsonFormatter,
    RequestContext,
    RequestIdFilter,
    log_access,
    request_context,
)
from trio_gateway.ops.tracing import (
    MAX_REQUEST_ID_CHARS,
    MAX_TRACESTATE_CHARS,
    TraceContext,
    clean_request_id,
    new_trace,
    parse_traceparent,
    trace_for,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
GOOD = f"00-{TRACE}-{SPAN}-01"


@pytest.mark.parametrize(
    ("raw", "kept"),
    [
        ("req-123", True),
        ("01HZX3K9Q7:svc.a_b", True),
        ("550e8400-e29b-41d4-a716-446655440000", True),
        ("a" * MAX_REQUEST_ID_CHARS, True),
        ("a" * (MAX_REQUEST_ID_CHARS + 1), False),  # too long to echo into logs and headers
        ("", False),
        ("has space", False),
        ("new\nline", False),  # a forged log line
        ('quote"d', False),
        ("ünïcode", False),
        (None, False),
    ],
)
def test_a_client_request_id_is_kept_only_when_safe(raw: str | None, kept: bool) -> None:
    assert clean_request_id(raw) == (raw if kept else None)


@pytest.mark.parametrize(
    "traceparent",
    [
        f"00-{'0' * 32}-{SPAN}-01",  # an all-zero trace id is invalid
        f"00-{TRACE}-{'0' * 16}-01",  # so is an all-zero parent id
        f"ff-{TRACE}-{SPAN}-01",  # version ff is forbidden
        f"00-{TRACE.upper()}-{SPAN}-01",  # lowercase only
        f"00-{TRACE[:-1]}-{SPAN}-01",
        f"00-{TRACE}-{SPAN}-1",
        f"00-{TRACE}-{SPAN}",
        "garbage",
        "",
    ],
)
def test_a_malformed_traceparent_starts_a_new_trace(traceparent: str) -> None:
    assert parse_traceparent(traceparent, "vendor=1") is None
    started = trace_for(traceparent, "vendor=1")
    assert started.trace_id != TRACE
    assert started.tracestate is None  # the state of a dropped parent is dropped with it
    assert started.flags == "01"


def test_a_valid_traceparent_is_continued_with_a_new_span() -> None:
    ours = trace_for(GOOD, " congo=t61rcWkgMzE ")
    assert ours.trace_id == TRACE
    assert ours.parent_id != SPAN
    assert ours.flags == "01"
    assert ours.tracestate == "congo=t61rcWkgMzE"
    call = ours.child()
    assert (call.trace_id, call.tracestate) == (TRACE, "congo=t61rcWkgMzE")
    assert call.parent_id not in (SPAN, ours.parent_id)
    assert call.headers() == {
        "traceparent": f"00-{TRACE}-{call.parent_id}-01",
        "tracestate": "congo=t61rcWkgMzE",
    }


def test_unsampled_flags_and_oversized_state() -> None:
    ours = trace_for(f"00-{TRACE}-{SPAN}-00", "x" * (MAX_TRACESTATE_CHARS + 1))
    assert ours.flags == "00"
    assert ours.tracestate is None
    assert "tracestate" not in ours.headers()


@given(st.integers(min_value=0, max_value=50))
def test_new_traces_are_well_formed(_: int) -> None:
    trace = new_trace()
    parsed = parse_traceparent(trace.traceparent(), None)
    assert parsed == TraceContext(trace.trace_id, trace.parent_id, "01")


def context() -> RequestContext:
    return RequestContext(
        request_id="req-1", route="POST /v1/chat/completions", trace=trace_for(GOOD, None)
    )


def test_the_access_line_in_text_and_in_json(caplog: pytest.LogCaptureFixture) -> None:
    ctx = context()
    ctx.status = 400
    ctx.record(
        refused_record(
            request_id="req-1",
            key="search-agent",
            alias=None,
            error_code="invalid_json",
            started_at=0.0,
        )
    )
    caplog.set_level(logging.INFO, "trio_gateway.access")
    log_access(ctx, 0.0123)
    (line,) = caplog.records
    assert line.getMessage() == (
        "request_id=req-1 route=POST /v1/chat/completions status=400 outcome=refused "
        "code=invalid_json alias=- provider=- key=search-agent priority=- ttft_ms=- "
        "duration_ms=12.3 "
        f"prompt_tokens=0 completion_tokens=0 trace_id={TRACE}"
    )
    RequestIdFilter().filter(line)  # written outside the request's context: "-"
    assert line.__dict__["request_id"] == "-"
    as_json = json.loads(JsonFormatter().format(line))
    assert as_json["request_id"] == "req-1"  # the access line names its request itself
    assert as_json["level"] == "info"
    assert as_json["logger"] == "trio_gateway.access"
    assert {k: as_json[k] for k in ("route", "status", "code", "key", "duration_ms")} == {
        "route": "POST /v1/chat/completions",
        "status": 400,
        "code": "invalid_json",
        "key": "search-agent",
        "duration_ms": 12.3,
    }


def test_probes_are_logged_at_debug_only(caplog: pytest.LogCaptureFixture) -> None:
    ctx = RequestContext(request_id="r", route="GET /healthz", trace=new_trace())
    caplog.set_level(logging.INFO, "trio_gateway.access")
    log_access(ctx, 0.001)
    assert caplog.records == []
    caplog.set_level(logging.DEBUG, "trio_gateway.access")
    log_access(ctx, 0.001)
    assert len(caplog.records) == 1


def test_every_line_inside_a_request_carries_its_id() -> None:
    record = logging.LogRecord("trio_gateway", logging.INFO, __file__, 1, "hello", None, None)
    with request_context(context()):
        RequestIdFilter().filter(record)
    assert record.__dict__["request_id"] == "req-1"
    as_json = json.loads(JsonFormatter().format(record))
    assert (as_json["request_id"], as_json["message"]) == ("req-1", "hello")
