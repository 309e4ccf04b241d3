"""The anthropic dialect's stream parser: Anthropic's SSE events to the gateway's events, cut
anywhere; finish reasons, usage, error events, truncated and malformed streams, and its
bounds. Transcripts are written by hand in Anthropic's documented stream format and checked
against what the ``anthropic`` SDK reads from them."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from typing import Any

import pytest
from anthropic import types as at
from anthropic.lib.streaming._messages import accumulate_event
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter

from tests.unit.anthropic_helpers import NAME
from trio_gateway.core.errors import (
    ContextLengthExceeded,
    GatewayError,
    InvalidRequest,
    QuotaExhausted,
    UpstreamAuthFailed,
    UpstreamOverloaded,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamServerError,
    UpstreamTimeout,
)
from trio_gateway.core.events import (
    Event,
    ReasoningDelta,
    ReasoningDetail,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.reasoning_details import ANTHROPIC
from trio_gateway.core.sse import SSEDecoder, SSEEvent
from trio_gateway.providers.anthropic.dialect import (
    MAX_OPEN_BLOCKS,
    MAX_TOOL_CALLS,
    AnthropicStreamParser,
    parse_whole,
)


def sse(kind: str, **data: Any) -> bytes:
    payload = json.dumps({"type": kind, **data}, ensure_ascii=False)
    return f"event: {kind}\ndata: {payload}\n\n".encode()


def start(usage: dict[str, Any] | None = None) -> bytes:
    message: dict[str, Any] = {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-5",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": usage if usage is not None else {"input_tokens": 10, "output_tokens": 1},
    }
    return sse("message_start", message=message)


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return sse("content_block_start", index=index, content_block=block)


def delta(index: int, **d: Any) -> bytes:
    return sse("content_block_delta", index=index, delta=d)


def stop(index: int) -> bytes:
    return sse("content_block_stop", index=index)


def end(stop_reason: str = "end_turn", usage: dict[str, Any] | None = None) -> bytes:
    return sse(
        "message_delta",
        delta={"stop_reason": stop_reason, "stop_sequence": None},
        usage=usage if usage is not None else {"output_tokens": 5},
    ) + sse("message_stop")


def tool(index: int, tool_id: str, name: str) -> bytes:
    return block_start(index, {"type": "tool_use", "id": tool_id, "name": name, "input": {}})


# Thinking, text (with a ping inside), and two tool calls, one with an escape cut across
# fragments and one without input; cache tokens on both sides.
RICH = b"".join(
    [
        start(
            {
                "input_tokens": 25,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 50,
                "output_tokens": 1,
            }
        ),
        block_start(0, {"type": "thinking", "thinking": "", "signature": ""}),
        delta(0, type="thinking_delta", thinking="Paris, "),
        delta(0, type="thinking_delta", thinking="then the time."),
        delta(0, type="signature_delta", signature="EqQBCgIYAhIM1gbcDa9GJwZA2b3h"),
        stop(0),
        block_start(1, {"type": "text", "text": ""}),
        sse("ping"),
        delta(1, type="text_delta", text="Checking "),
        delta(1, type="text_delta", text="météo 東京 ☀"),
        stop(1),
        tool(2, "toolu_01A", "get_weather"),
        delta(2, type="input_json_delta", partial_json=""),
        delta(2, type="input_json_delta", partial_json='{"city": "Par\\'),
        delta(2, type="input_json_delta", partial_json='u00eds \\"'),
        delta(2, type="input_json_delta", partial_json='centre\\""}'),
        stop(2),
        tool(3, "toolu_01B", "get_time"),
        stop(3),
        end("tool_use", {"output_tokens": 87}),
    ]
)
RICH_EVENTS: list[Event] = [
    ResponseStarted(NAME),
    ReasoningDelta("Paris, "),
    ReasoningDelta("then the time."),
    # Whole, with its signature, once the block stops: what Anthropic needs back.
    ReasoningDetail(
        0, ANTHROPIC, text="Paris, then the time.", signature="EqQBCgIYAhIM1gbcDa9GJwZA2b3h"
    ),
    TextDelta("Checking "),
    TextDelta("météo 東京 ☀"),
    ToolCallDelta(0, "toolu_01A", "get_weather", ""),
    ToolCallDelta(0, None, None, '{"city": "Par\\'),
    ToolCallDelta(0, None, None, 'u00eds \\"'),
    ToolCallDelta(0, None, None, 'centre\\""}'),
    ToolCallDelta(1, "toolu_01B", "get_time", ""),
    ToolCallDelta(1, None, None, "{}"),
    ToolCallDone(
        0,
        "toolu_01A",
        "get_weather",
        {"city": 'París "centre"'},
        '{"city": "Par\\u00eds \\"centre\\""}',
        True,
    ),
    ToolCallDone(1, "toolu_01B", "get_time", {}, "{}", True),
    Usage(prompt_tokens=175, completion_tokens=87, reasoning_tokens=None, cached_tokens=100),
    ResponseDone("tool_calls"),
]


def parse_chunks(chunks: Iterable[bytes]) -> list[Event]:
    decoder = SSEDecoder()
    parser = AnthropicStreamParser(NAME)
    events: list[Event] = []
    for chunk in chunks:
        for event in decoder.feed(chunk):
            events += parser.feed(event)
    for event in decoder.close():
        events += parser.feed(event)
    return events + parser.close()


def test_rich_stream_whole() -> None:
    assert parse_chunks([RICH]) == RICH_EVENTS


def test_rich_stream_split_at_every_byte() -> None:
    for cut in range(len(RICH) + 1):
        assert parse_chunks([RICH[:cut], RICH[cut:]]) == RICH_EVENTS, cut


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, len(RICH)), max_size=30))
def test_rich_stream_split_anywhere(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(RICH)]
    assert parse_chunks(RICH[a:b] for a, b in itertools.pairwise(points)) == RICH_EVENTS


def test_rich_stream_is_what_the_sdk_reads() -> None:
    """The SDK accumulates the same transcript into a Message; parsing that Message whole gives
    the same answer the stream gave."""
    adapter: TypeAdapter[Any] = TypeAdapter(at.RawMessageStreamEvent)
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    decoder = SSEDecoder()
    for raw in decoder.feed(RICH):
        assert raw.event == json.loads(raw.data)["type"]
        if raw.event == "ping":  # the SDK's stream skips it before typing events
            continue
        event = adapter.validate_json(raw.data)  # strict: the transcript is Anthropic's format
        snapshot = accumulate_event(event=event, current_snapshot=snapshot, json_bufs=json_bufs)
    assert snapshot is not None
    assert snapshot.content[2].input == {"city": 'París "centre"'}  # type: ignore[union-attr]
    whole = parse_whole(NAME, snapshot.model_dump_json().encode())
    assert whole == [
        ResponseStarted(NAME),
        ReasoningDelta("Paris, then the time."),
        ReasoningDetail(
            0, ANTHROPIC, text="Paris, then the time.", signature="EqQBCgIYAhIM1gbcDa9GJwZA2b3h"
        ),
        TextDelta("Checking météo 東京 ☀"),
        ToolCallDelta(0, "toolu_01A", "get_weather", '{"city": "París \\"centre\\""}'),
        ToolCallDelta(1, "toolu_01B", "get_time", ""),
        ToolCallDelta(1, None, None, "{}"),
        ToolCallDone(
            0,
            "toolu_01A",
            "get_weather",
            {"city": 'París "centre"'},
            '{"city": "París \\"centre\\""}',
            True,
        ),
        ToolCallDone(1, "toolu_01B", "get_time", {}, "{}", True),
        Usage(prompt_tokens=175, completion_tokens=87, reasoning_tokens=None, cached_tokens=100),
        ResponseDone("tool_calls"),
    ]


TRICKY_INPUT = {"q": 'a "quoted" \\ back\nslash', "u": "é東☀\U0001f600", "n": [1, 2.5, None, True]}


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_partial_json_cut_anywhere_even_inside_escapes(data: st.DataObject) -> None:
    text = json.dumps(TRICKY_INPUT)  # ASCII escapes: \" \\ \n \u00e9 \ud83d\ude00
    cuts = sorted(data.draw(st.lists(st.integers(0, len(text)), max_size=12)))
    points = [0, *cuts, len(text)]
    fragments = [text[a:b] for a, b in itertools.pairwise(points)]
    raw = (
        start()
        + tool(0, "toolu_X", "search")
        + b"".join(delta(0, type="input_json_delta", partial_json=f) for f in fragments)
        + stop(0)
        + end("tool_use")
    )
    events = parse_chunks([raw])
    done = [e for e in events if isinstance(e, ToolCallDone)]
    assert done == [ToolCallDone(0, "toolu_X", "search", TRICKY_INPUT, text, True)]
    streamed = "".join(e.arguments for e in events if isinstance(e, ToolCallDelta))
    assert streamed == text


def test_text_only_stream() -> None:
    raw = (
        start()
        + block_start(0, {"type": "text", "text": ""})
        + delta(0, type="text_delta", text="Hi")
        + stop(0)
        + end()
    )
    assert parse_chunks([raw]) == [
        ResponseStarted(NAME),
        TextDelta("Hi"),
        Usage(10, 5, None, None),
        ResponseDone("stop"),
    ]


def test_ignored_blocks_and_deltas() -> None:
    raw = b"".join(
        [
            sse("ping"),
            start(),
            block_start(0, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}),
            stop(0),
            block_start(
                1,
                {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
            ),
            delta(1, type="input_json_delta", partial_json='{"query": "x"}'),
            stop(1),
            block_start(2, {"type": "text", "text": ""}),
            delta(2, type="citations_delta", citation={"type": "char_location"}),
            delta(2, type="some_future_delta", x=1),
            delta(2, type="text_delta", text="ok"),
            stop(2),
            sse("some_future_event", x=1),
            end(),
        ]
    )
    assert parse_chunks([raw]) == [
        ResponseStarted(NAME),
        # Nothing to show, but Anthropic needs it back as it was.
        ReasoningDetail(0, ANTHROPIC, data="EmwKAhgBEgy3va3pzix"),
        TextDelta("ok"),
        Usage(10, 5, None, None),
        ResponseDone("stop"),
    ]


@pytest.mark.parametrize(
    ("stop_reason", "with_tool", "finish_reason"),
    [
        ("end_turn", False, "stop"),
        ("stop_sequence", False, "stop"),
        ("pause_turn", False, "stop"),
        ("max_tokens", False, "length"),
        ("model_context_window_exceeded", False, "length"),
        ("tool_use", True, "tool_calls"),
        ("refusal", False, "content_filter"),
        ("something_new", False, "stop"),
        ("end_turn", True, "tool_calls"),
        ("max_tokens", True, "length"),
    ],
)
def test_finish_reasons(stop_reason: str, with_tool: bool, finish_reason: str) -> None:
    blocks = tool(0, "toolu_1", "f") + stop(0) if with_tool else b""
    events = parse_chunks([start() + blocks + end(stop_reason)])
    assert events[-1] == ResponseDone(finish_reason)


@pytest.mark.parametrize(
    ("start_usage", "end_usage", "expected"),
    [
        ({"input_tokens": 10, "output_tokens": 1}, {"output_tokens": 5}, Usage(10, 5, None, None)),
        (
            {
                "input_tokens": 10,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 20,
                "output_tokens": 1,
            },
            {"output_tokens": 7},
            Usage(130, 7, None, 100),
        ),
        (
            {
                "input_tokens": 3,
                "cache_read_input_tokens": 0,
                "cache_creation_input_tokens": 0,
                "output_tokens": 1,
            },
            {"output_tokens": 2},
            Usage(3, 2, None, 0),
        ),
        # Newer models repeat the (cumulative) input side in message_delta: the last one counts.
        (
            {"input_tokens": 10, "cache_read_input_tokens": 1, "output_tokens": 1},
            {"input_tokens": 12, "cache_read_input_tokens": 3, "output_tokens": 9},
            Usage(15, 9, None, 3),
        ),
        (
            {"input_tokens": 10, "output_tokens": 1},
            {"output_tokens": 50, "output_tokens_details": {"thinking_tokens": 40}},
            Usage(10, 50, 40, None),
        ),
        (
            {"input_tokens": 10, "output_tokens": 1},
            {"output_tokens": 3, "output_tokens_details": {"thinking_tokens": 0}},
            Usage(10, 3, 0, None),
        ),
        ({"input_tokens": 10, "output_tokens": 1}, {}, Usage(10, 1, None, None)),
        ({"input_tokens": None, "output_tokens": 1}, {"output_tokens": 4}, Usage(0, 4, None, None)),
    ],
)
def test_usage_arithmetic(
    start_usage: dict[str, Any], end_usage: dict[str, Any], expected: Usage
) -> None:
    events = parse_chunks([start(start_usage) + end("end_turn", end_usage)])
    assert events == [ResponseStarted(NAME), expected, ResponseDone("stop")]


def test_parser_is_done_only_after_message_stop() -> None:
    parser = AnthropicStreamParser(NAME)
    decoder = SSEDecoder()
    raw = start() + end()
    events = decoder.feed(raw)
    for event in events[:-1]:
        parser.feed(event)
        assert not parser.done
    parser.feed(events[-1])
    assert parser.done
    assert parser.close() == []


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        ({"type": "overloaded_error", "message": "Overloaded"}, UpstreamOverloaded),
        ({"type": "rate_limit_error", "message": "slow down"}, UpstreamRateLimited),
        ({"type": "api_error", "message": "Internal server error"}, UpstreamServerError),
        ({"type": "timeout_error", "message": "timed out"}, UpstreamTimeout),
        ({"type": "invalid_request_error", "message": "bad"}, InvalidRequest),
        (
            {"type": "invalid_request_error", "message": "prompt is too long: 2 > 1"},
            ContextLengthExceeded,
        ),
        ({"type": "billing_error", "message": "no money"}, QuotaExhausted),
        ({"type": "authentication_error", "message": "invalid key"}, UpstreamAuthFailed),
        ({"type": "new_kind_of_error", "message": "??"}, UpstreamServerError),
        ("not an object", UpstreamServerError),
    ],
)
def test_error_event_mid_stream(error: object, expected: type[GatewayError]) -> None:
    raw = (
        start()
        + block_start(0, {"type": "text", "text": ""})
        + delta(0, type="text_delta", text="Hel")
    )
    raw += sse("error", error=error)
    decoder = SSEDecoder()
    parser = AnthropicStreamParser(NAME)
    events = decoder.feed(raw)
    for event in events[:-1]:
        parser.feed(event)
    with pytest.raises(GatewayError) as info:
        parser.feed(events[-1])
    assert type(info.value) is expected
    assert info.value.provider == NAME
    assert info.value.retry_after_s is None


def test_error_before_message_start() -> None:
    parser = AnthropicStreamParser(NAME)
    with pytest.raises(UpstreamOverloaded):
        parser.feed(
            SSEEvent(
                data=b'{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}',
                event="error",
            )
        )


def _message_stop_end() -> int:
    return RICH.index(b'data: {"type": "message_stop"}') + len(b'data: {"type": "message_stop"}')


def test_truncated_stream_at_every_byte() -> None:
    whole_from = _message_stop_end()
    for cut in range(len(RICH) + 1):
        if cut >= whole_from:
            assert parse_chunks([RICH[:cut]]) == RICH_EVENTS, cut
            continue
        with pytest.raises(UpstreamProtocolError) as info:
            parse_chunks([RICH[:cut]])
        assert info.value.provider == NAME
        assert NAME in info.value.message


def test_stream_cut_after_an_error_event_raises_the_error_not_a_protocol_error() -> None:
    raw = start() + sse("error", error={"type": "overloaded_error", "message": "Overloaded"})
    with pytest.raises(UpstreamOverloaded):
        parse_chunks([raw])


TEXT0 = block_start(0, {"type": "text", "text": ""})


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        (b"data: {not json\n\n", "not JSON"),
        (b"data: [1, 2]\n\n", "not an object"),
        (TEXT0, "before message_start"),
        (start() + start(), "second message_start"),
        (start() + delta(0, type="text_delta", text="x"), "not open"),
        (start() + TEXT0 + stop(0) + delta(0, type="text_delta", text="x"), "not open"),
        (start() + TEXT0 + stop(0) + TEXT0, "again"),
        (start() + sse("content_block_start", index="0", content_block={"type": "text"}), "index"),
        (start() + sse("content_block_start", index=0), "content_block"),
        (start() + TEXT0 + delta(0, type="input_json_delta", partial_json="{"), "text block"),
        (start() + tool(0, "t", "f") + delta(0, type="text_delta", text="x"), "tool_use block"),
        (start() + TEXT0 + delta(0, type="text_delta", text=5), "not a string"),
        (
            start() + block_start(0, {"type": "tool_use", "id": "", "name": "f", "input": {}}),
            "id or a name",
        ),
        (start() + sse("message_delta", delta={}, usage={}) + sse("message_stop"), "stop_reason"),
        (start() + sse("message_delta", usage={}), "delta"),
        (start() + end() + sse("ping"), "after message_stop"),
        (sse("message_start"), "message"),
    ],
)
def test_malformed_streams(raw: bytes, what: str) -> None:
    with pytest.raises(UpstreamProtocolError) as info:
        parse_chunks([raw])
    assert what in info.value.message
    assert info.value.provider == NAME


def test_tool_calls_are_bounded() -> None:
    calls = b"".join(tool(i, f"t{i}", "f") + stop(i) for i in range(MAX_TOOL_CALLS))
    events = parse_chunks([start() + calls + end("tool_use")])
    assert sum(isinstance(e, ToolCallDone) for e in events) == MAX_TOOL_CALLS
    one_more = tool(MAX_TOOL_CALLS, "t", "f")
    with pytest.raises(UpstreamProtocolError, match="tool calls"):
        parse_chunks([start() + calls + one_more])


def test_open_blocks_are_bounded() -> None:
    opened = b"".join(block_start(i, {"type": "text", "text": ""}) for i in range(MAX_OPEN_BLOCKS))
    with pytest.raises(UpstreamProtocolError, match="open at once"):
        parse_chunks([start() + opened + block_start(MAX_OPEN_BLOCKS, {"type": "text"})])


def test_tool_arguments_are_bounded() -> None:
    big = "x" * 4096
    fragments = b"".join(delta(0, type="input_json_delta", partial_json=big) for _ in range(260))
    with pytest.raises(UpstreamProtocolError, match="exceed"):
        parse_chunks([start() + tool(0, "t", "f") + fragments])


def test_the_stop_sequence_that_ended_the_answer_is_kept() -> None:
    """Anthropic names it; the Messages front tells its clients (stop_reason stop_sequence)."""
    ended = sse(
        "message_delta",
        delta={"stop_reason": "stop_sequence", "stop_sequence": "END"},
        usage={"output_tokens": 5},
    ) + sse("message_stop")
    body = (
        start()
        + block_start(0, {"type": "text", "text": ""})
        + delta(0, type="text_delta", text="a")
    )
    events = parse_chunks([body + stop(0) + ended])
    assert events[-1] == ResponseDone(finish_reason="stop", stop_sequence="END")
    assert parse_chunks([body + stop(0) + end()])[-1] == ResponseDone(finish_reason="stop")
