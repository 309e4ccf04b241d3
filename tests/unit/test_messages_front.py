"""The Messages front's answer side (``messages_events``): events → Anthropic's stream and
message, and its error shapes (the request side: test_messages_request.py). The judge is the
``anthropic`` SDK: its types parse every event and the whole message, and its own stream
accumulator folds the events into the message the front builds."""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.core.errors import (
    AllProvidersFailed,
    BodyTooLarge,
    BudgetExceeded,
    Forbidden,
    GatewayError,
    InternalError,
    InvalidRequest,
    ModelNotFound,
    Overloaded,
    RateLimited,
    Unauthorized,
    UpstreamServerError,
    UpstreamTimeout,
)
from trio_gateway.core.events import (
    ErrorEvent,
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
from trio_gateway.core.reasoning_details import ANTHROPIC, GOOGLE
from trio_gateway.fronts.messages.events import (
    MessageAccumulator,
    MessageBuilder,
    MessageEncoder,
    anthropic_error,
    anthropic_stream_error,
    decode_signature,
    sse,
)

EVENTS: Any = pydantic.TypeAdapter(RawMessageStreamEvent)


# --- the answer --------------------------------------------------------------------------------


def builder(*, thinking: bool = True) -> MessageBuilder:
    return MessageBuilder(message_id="msg_1", model="alias", input_tokens=7, thinking=thinking)


def stream_of(events: list[Event], *, thinking: bool = True) -> list[dict[str, Any]]:
    """The Anthropic events of a stream, each parsed by the SDK's own event types."""
    encoder = MessageEncoder(builder(thinking=thinking))
    raw = b"".join(encoder.encode(e) for e in events).decode()
    out = []
    for frame in raw.split("\n\n")[:-1]:
        name, data = frame.split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        if event["type"] not in ("ping", "error"):  # the SDK's stream skips or raises these
            EVENTS.validate_python(event)
        out.append(event)
    return out


def whole(events: list[Event], *, thinking: bool = True) -> dict[str, Any]:
    accumulator = MessageAccumulator(builder(thinking=thinking))
    for event in events:
        accumulator.add(event)
    result = accumulator.result()
    Message.model_validate(result)
    return result


def sdk_fold(stream: list[dict[str, Any]]) -> dict[str, Any]:
    snapshot: Any = None
    buffers: dict[int, bytes] = {}
    for event in stream:
        if event["type"] == "ping":
            continue
        snapshot = accumulate_event(
            event=EVENTS.validate_python(event), current_snapshot=snapshot, json_bufs=buffers
        )
    return dict(snapshot.model_dump(exclude_none=True))


THINK_AND_CALL: list[Event] = [
    ResponseStarted("p"),
    ReasoningDelta("let me "),
    ReasoningDelta("see"),
    ReasoningDetail(0, ANTHROPIC, text="let me see", signature="sig"),
    ReasoningDetail(1, ANTHROPIC, data="opaque"),
    TextDelta("\n\n"),
    TextDelta("Calling."),
    ToolCallDelta(0, "t1", "f", '{"a"'),
    ToolCallDelta(0, None, None, ": 1}"),
    ToolCallDelta(1, "t2", "g", ""),
    ToolCallDone(0, "t1", "f", {"a": 1}, '{"a": 1}', True),
    ToolCallDone(1, "t2", "g", {}, "", True),
    Usage(prompt_tokens=30, completion_tokens=12, reasoning_tokens=4, cached_tokens=10),
    ResponseDone("tool_calls"),
]


def test_the_stream_grammar_and_the_whole_message_agree() -> None:
    stream = stream_of(THINK_AND_CALL)
    assert [e["type"] for e in stream] == [
        "message_start",
        "ping",
        "content_block_start",  # thinking
        "content_block_delta",
        "content_block_delta",
        "content_block_delta",  # its signature
        "content_block_stop",
        "content_block_start",  # redacted
        "content_block_stop",
        "content_block_start",  # text: the leading "\n\n" is not written
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # t1
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",  # t2, no arguments
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert stream[0]["message"]["usage"] == {"input_tokens": 7, "output_tokens": 0}
    assert stream[-2] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {
            "input_tokens": 20,
            "output_tokens": 12,
            "cache_read_input_tokens": 10,
            "output_tokens_details": {"thinking_tokens": 4},
        },
    }
    message = whole(THINK_AND_CALL)
    assert message["content"] == [
        {"type": "thinking", "thinking": "let me see", "signature": "sig"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Calling."},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}},
        {"type": "tool_use", "id": "t2", "name": "g", "input": {}},
    ]
    assert (message["stop_reason"], message["id"], message["model"]) == (
        "tool_use",
        "msg_1",
        "alias",
    )
    assert sdk_fold(stream) == Message.model_validate(message).model_dump(exclude_none=True)


def test_no_thinking_block_for_a_request_that_did_not_enable_thinking() -> None:
    """Readable, signed, redacted: none of it; the tokens it took still count."""
    stream = stream_of(THINK_AND_CALL, thinking=False)
    assert [e["content_block"]["type"] for e in stream if e["type"] == "content_block_start"] == [
        "text",
        "tool_use",
        "tool_use",
    ]
    assert not [e for e in stream if e["type"] == "content_block_delta" and "thinking" in str(e)]
    message = whole(THINK_AND_CALL, thinking=False)
    assert [b["type"] for b in message["content"]] == ["text", "tool_use", "tool_use"]
    assert message["usage"]["output_tokens"] == 12
    assert message["usage"]["output_tokens_details"] == {"thinking_tokens": 4}
    assert sdk_fold(stream) == Message.model_validate(message).model_dump(exclude_none=True)
    google = ReasoningDetail(0, GOOGLE, data="g-sig", tool_call_id="t1")
    events: list[Event] = [ResponseStarted("p"), ToolCallDelta(0, "t1", "f", "{}"), google]
    assert [
        b["type"] for b in whole([*events, ResponseDone("stop")], thinking=False)["content"]
    ] == ["tool_use"]


def test_every_streamed_thinking_block_ends_with_its_signature_delta() -> None:
    """As Anthropic's do: a client (the AI SDK) drops a streamed thinking block that had no
    signature_delta when it sends the turn back. An unsigned provider's (vLLM's) gets the
    empty signature its whole answer carries, once; a signed one keeps its own, once."""
    unsigned: list[Event] = [
        ResponseStarted("p"),
        ReasoningDelta("thought"),
        TextDelta("Hi"),
        ResponseDone("stop"),
    ]
    for events, signature in ((unsigned, ""), (THINK_AND_CALL, "sig")):
        stream = stream_of(events)
        first = next(e["index"] for e in stream if e["type"] == "content_block_start")
        block = [e for e in stream if e.get("index") == first]
        assert block[-1]["type"] == "content_block_stop"
        deltas = [e["delta"] for e in block if e["type"] == "content_block_delta"]
        signatures = [d for d in deltas if d["type"] == "signature_delta"]
        assert signatures == [{"type": "signature_delta", "signature": signature}]
        assert block[-2]["delta"]["type"] == "signature_delta"
        assert sdk_fold(stream)["content"][0]["signature"] == signature


def test_another_vendors_signature_rides_in_a_thinking_block() -> None:
    detail = ReasoningDetail(0, GOOGLE, data="g-sig", tool_call_id="t1")
    message = whole(
        [
            ResponseStarted("p"),
            ReasoningDelta("thought"),
            ToolCallDelta(0, "t1", "f", "{}"),
            detail,
            ResponseDone("tool_calls"),
        ]
    )
    thinking, call, signed = message["content"]
    assert thinking == {"type": "thinking", "thinking": "thought", "signature": ""}
    assert call["type"] == "tool_use" and signed["thinking"] == ""
    assert decode_signature(signed["signature"]) == {
        "type": "reasoning.encrypted",
        "data": "g-sig",
        "id": "t1",
        "format": GOOGLE,
        "index": 0,
    }
    assert decode_signature("an-anthropic-signature") is None


@pytest.mark.parametrize(
    ("finish", "stop_reason"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
    ],
)
def test_stop_reasons(finish: str, stop_reason: str) -> None:
    message = whole([ResponseStarted("p"), TextDelta("x"), ResponseDone(finish)])
    assert message["stop_reason"] == stop_reason
    # Without the vendor's count, the estimate stands.
    assert message["usage"] == {"input_tokens": 7, "output_tokens": 0}


def test_an_error_event_ends_the_stream_in_band() -> None:
    stream = stream_of(
        [ResponseStarted("p"), TextDelta("x"), ErrorEvent("upstream_error", "boom", True)]
    )
    assert stream[-1] == {"type": "error", "error": {"type": "overloaded_error", "message": "boom"}}


_texts = st.text(alphabet=st.characters(codec="utf-8"), max_size=6)
_event = st.one_of(
    _texts.map(TextDelta),
    _texts.map(ReasoningDelta),
    st.builds(lambda s: ReasoningDetail(0, ANTHROPIC, text="", signature=s), _texts),
    st.builds(lambda d: ReasoningDetail(0, GOOGLE, data=d or "x"), _texts),
    st.builds(
        lambda i, a: ToolCallDelta(i, f"t{i}", "f", a),
        st.integers(0, 2),
        st.sampled_from(["", "{}"]),
    ),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_event, max_size=12), st.sampled_from(["stop", "length", "tool_calls"]))
def test_any_answer_streams_as_the_sdk_folds_the_whole(middle: list[Event], finish: str) -> None:
    events: list[Event] = [ResponseStarted("p"), *middle, Usage(5, 3), ResponseDone(finish)]
    stream = stream_of(events)
    message = Message.model_validate(whole(events))
    folded = sdk_fold(stream)
    # The whole answer's tool inputs are parsed once; the SDK's fold parses as it goes.
    for block in folded["content"]:
        if block["type"] == "tool_use":
            block["input"] = block["input"] or {}
    assert folded == message.model_dump(exclude_none=True)
    assert all(not (b["type"] == "text" and not b["text"].strip()) for b in folded["content"])


@settings(max_examples=100, deadline=None)
@given(st.lists(_event, max_size=12))
def test_without_thinking_the_answer_is_the_same_less_its_thinking(middle: list[Event]) -> None:
    events: list[Event] = [ResponseStarted("p"), *middle, ResponseDone("stop")]
    shown, hidden = whole(events), whole(events, thinking=False)
    assert sdk_fold(stream_of(events, thinking=False)) == Message.model_validate(hidden).model_dump(
        exclude_none=True
    )
    kept = [b for b in hidden["content"] if b["type"] not in ("thinking", "redacted_thinking")]
    assert kept == hidden["content"]

    def said(message: dict[str, Any]) -> tuple[str, list[Any]]:
        blocks = message["content"]
        text = "".join(b["text"] for b in blocks if b["type"] == "text")
        # Whitespace alone opens no block: with thinking between them, two texts are two
        # blocks, and whitespace at the second's start is not written; without, one block.
        return "".join(text.split()), [b["id"] for b in blocks if b["type"] == "tool_use"]

    assert said(hidden) == said(shown)


@settings(max_examples=200, deadline=None)
@given(st.lists(_event, max_size=16))
def test_the_encoders_short_way_for_tokens_writes_what_the_long_way_does(
    middle: list[Event],
) -> None:
    events: list[Event] = [ResponseStarted("p"), *middle, ResponseDone("stop")]
    for thinking in (True, False):
        encoder, slow = MessageEncoder(builder(thinking=thinking)), builder(thinking=thinking)
        fast = b"".join(encoder.encode(e) for e in events)
        assert fast == b"".join(sse(item) for e in events for item in slow.feed(e))


# --- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "status", "kind"),
    [
        (InvalidRequest("x"), 400, "invalid_request_error"),
        (Unauthorized("x"), 401, "authentication_error"),
        (BudgetExceeded("x"), 402, "billing_error"),
        (Forbidden("x"), 403, "permission_error"),
        (ModelNotFound("x"), 404, "not_found_error"),
        (BodyTooLarge("x"), 413, "request_too_large"),
        (RateLimited("x"), 429, "rate_limit_error"),
        (InternalError("x"), 500, "api_error"),
        (UpstreamServerError("x"), 502, "api_error"),
        (Overloaded("x"), 529, "overloaded_error"),
        (AllProvidersFailed([]), 529, "overloaded_error"),
        (UpstreamTimeout("x"), 504, "timeout_error"),
    ],
)
def test_error_shapes(error: GatewayError, status: int, kind: str) -> None:
    got_status, got = anthropic_error(error)
    assert got_status == status
    assert got == {"type": "error", "error": {"type": kind, "message": error.message}}
    assert (
        anthropic_stream_error(error)
        == (f"event: error\ndata: {json.dumps(got, separators=(',', ':'))}\n\n").encode()
    )


def test_a_stop_sequence_named_by_the_vendor_is_the_stop_reason() -> None:
    events: list[Event] = [ResponseStarted("p"), TextDelta("x"), ResponseDone("stop", "END")]
    message = whole(events)
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", "END")
    assert stream_of(events)[-2]["delta"] == {
        "stop_reason": "stop_sequence",
        "stop_sequence": "END",
    }


def test_an_answer_without_its_start_event_still_opens_with_message_start() -> None:
    stream = stream_of([TextDelta("x"), ResponseDone("stop")])
    assert [e["type"] for e in stream][:3] == ["message_start", "ping", "content_block_start"]
    assert whole([TextDelta("x"), ResponseDone("stop")])["content"] == [
        {"type": "text", "text": "x"}
    ]
