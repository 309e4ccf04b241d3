"""The access line's text and fields agree, and its times are ``round(ms, 1)``."""

from __future__ import annotations

import json
import logging
import time

from hypothesis import given
from hypothesis import strategies as st

from trio_gateway.ops.access import TEXT_FORMAT, JsonFormatter, RequestContext, TextFormatter
from trio_gateway.ops.tracing import new_trace

seconds = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)
maybe_text = st.none() | st.text(alphabet="abc-_:", min_size=1, max_size=8)
maybe_int = st.none() | st.integers(min_value=0, max_value=10**9)


@given(
    duration_s=seconds,
    ttft_s=st.none() | seconds,
    status=st.none() | st.integers(min_value=100, max_value=599),
    outcome=maybe_text,
    code=maybe_text,
    alias=maybe_text,
    provider=maybe_text,
    key=maybe_text,
    priority=st.none() | st.integers(min_value=-(2**31), max_value=2**31 - 1),
    prompt=maybe_int,
    completion=maybe_int,
)
def test_the_text_is_the_fields_as_key_value_pairs(
    duration_s: float,
    ttft_s: float | None,
    status: int | None,
    outcome: str | None,
    code: str | None,
    alias: str | None,
    provider: str | None,
    key: str | None,
    priority: int | None,
    prompt: int | None,
    completion: int | None,
) -> None:
    context = RequestContext(request_id="r-1", route="POST /v1/chat/completions", trace=new_trace())
    context.status, context.outcome, context.code = status, outcome, code
    context.alias, context.provider, context.key = alias, provider, key
    context.priority = priority
    context.ttft_s, context.prompt_tokens, context.completion_tokens = ttft_s, prompt, completion
    fields, text = context.line(duration_s)
    assert fields["priority"] == priority
    assert fields["duration_ms"] == round(duration_s * 1000, 1)
    assert fields["ttft_ms"] == (None if ttft_s is None else round(ttft_s * 1000, 1))
    # What the line was before it was written out field by field.
    assert text == " ".join(f"{k}={'-' if v is None else v}" for k, v in fields.items())
    assert list(fields) == [
        "request_id",
        "route",
        "status",
        "outcome",
        "code",
        "alias",
        "provider",
        "key",
        "priority",
        "ttft_ms",
        "duration_ms",
        "prompt_tokens",
        "completion_tokens",
        "trace_id",
    ]


def _record(created: float) -> logging.LogRecord:
    record = logging.LogRecord("trio_gateway", logging.INFO, __file__, 1, "hello %s", ("x",), None)
    record.created, record.msecs = created, (created - int(created)) * 1000
    record.request_id = "r-1"
    return record


@given(st.lists(st.floats(min_value=1e9, max_value=2e9, allow_nan=False), max_size=20))
def test_the_text_format_writes_its_time_as_logging_does(times: list[float]) -> None:
    # Once a second, then from the cache: in order, repeated, and back and forth.
    ours, logging_own = TextFormatter(), logging.Formatter(TEXT_FORMAT)
    for created in [*times, *times, *sorted(times)]:
        assert ours.format(_record(created)) == logging_own.format(_record(created))


@given(st.lists(st.floats(min_value=1e9, max_value=2e9, allow_nan=False), max_size=20))
def test_the_json_format_writes_its_time_in_utc_to_the_millisecond(times: list[float]) -> None:
    formatter = JsonFormatter()
    for created in [*times, *times]:
        record = _record(created)
        expected = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created))
        assert json.loads(formatter.format(record))["ts"] == (
            expected + f".{int(record.msecs):03d}Z"
        )
