"""The Messages front's pure parts: an Anthropic body → the chat body (``messages_request``),
events → Anthropic's stream and message (``messages_events``), its error shapes. The judge of
the output is the ``anthropic`` SDK: its types parse every event and the whole message, and its
own stream accumulator folds the events into the message the front builds."""

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
    UnsupportedParameter,
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
from trio_gateway.core.request import validate_chat_body
from trio_gateway.fronts.messages_events import (
    MessageAccumulator,
    MessageBuilder,
    MessageEncoder,
    anthropic_error,
    anthropic_stream_error,
    decode_signature,
    encode_signature,
    sse,
)
from trio_gateway.fronts.messages_request import session_of, translate

EVENTS: Any = pydantic.TypeAdapter(RawMessageStreamEvent)


def body(**fields: Any) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "hi"}],
    } | fields


def chat(**fields: Any) -> dict[str, Any]:
    translated = translate(body(**fields))
    validate_chat_body(translated.body)  # every translation is a valid chat body
    return translated.body


# --- the request -------------------------------------------------------------------------------


def test_the_minimal_body() -> None:
    assert chat() == {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100,
    }


@pytest.mark.parametrize(
    ("system", "expected"),
    [
        ("be brief", "be brief"),
        ([{"type": "text", "text": "a", "cache_control": {"type": "ephemeral"}}], "a"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "a\n\nb"),
    ],
)
def test_system_as_a_string_or_blocks(system: Any, expected: str) -> None:
    assert chat(system=system)["messages"][0] == {"role": "system", "content": expected}


def test_tool_results_come_first_as_tool_messages_and_images_follow() -> None:
    image = {"type": "image", "source": {"type": "url", "url": "https://x/a.png"}}
    messages = [
        {"role": "user", "content": "go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": 1}}],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "and then?"},
                {
                    "type": "tool_result",
                    "tool_use_id": "t1",
                    "content": [{"type": "text", "text": "x"}, image],
                },
            ],
        },
    ]
    out = chat(messages=messages)["messages"]
    assert [m["role"] for m in out] == ["user", "assistant", "tool", "user"]
    assert out[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
        ],
    }
    assert out[2] == {"role": "tool", "tool_call_id": "t1", "content": "x"}
    assert out[3]["content"] == [
        {"type": "text", "text": "and then?"},
        {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
    ]


def test_an_error_result_says_so() -> None:
    result = {"type": "tool_result", "tool_use_id": "t1", "is_error": True, "content": "boom"}
    call = {"type": "tool_use", "id": "t1", "name": "f", "input": {}}
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    assert chat(messages=messages)["messages"][2]["content"] == "Error: boom"


def test_a_base64_image_is_a_data_url() -> None:
    source = {"type": "base64", "media_type": "image/png", "data": "AAAA"}
    content = [{"type": "image", "source": source}, {"type": "text", "text": "what?"}]
    (message,) = chat(messages=[{"role": "user", "content": content}])["messages"]
    assert message["content"][0] == {
        "type": "image_url",
        "image_url": {"url": "data:image/png;base64,AAAA"},
    }


def test_thinking_blocks_become_reasoning_details() -> None:
    google = ReasoningDetail(0, GOOGLE, data="sig-g", tool_call_id="t1")
    content = [
        {"type": "thinking", "thinking": "hmm", "signature": "sig-a"},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "thinking", "thinking": "qwen", "signature": ""},  # unsigned: nothing to return
        {"type": "thinking", "thinking": "", "signature": encode_signature(google)},
        {"type": "text", "text": "ok"},
        {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
    ]
    messages = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": content},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "1"}]},
    ]
    assistant = chat(messages=messages)["messages"][1]
    assert assistant["content"] == "ok"
    assert assistant["reasoning_details"] == [
        {
            "type": "reasoning.text",
            "text": "hmm",
            "signature": "sig-a",
            "format": ANTHROPIC,
            "index": 0,
        },
        {"type": "reasoning.encrypted", "data": "opaque", "format": ANTHROPIC, "index": 1},
        {"type": "reasoning.encrypted", "data": "sig-g", "id": "t1", "format": GOOGLE, "index": 0},
    ]


@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "f"}, {"type": "function", "function": {"name": "f"}}),
    ],
)
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    tools = [{"name": "f", "input_schema": {"type": "object"}}]
    out = chat(tools=tools, tool_choice=choice | {"disable_parallel_tool_use": True})
    assert out["tool_choice"] == expected
    assert out["tools"] == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    assert out.get("parallel_tool_calls") is (None if choice["type"] == "none" else False)


def test_server_tools_are_dropped_and_named() -> None:
    tools = [{"type": "web_search_20250305", "name": "web_search"}]
    translated = translate(body(tools=tools, tool_choice={"type": "any"}))
    assert "tools" not in translated.body and "tool_choice" not in translated.body
    assert translated.dropped == (
        ("server_tool", "web_search_20250305"),
        ("tool_choice", "tool_choice"),
    )


@pytest.mark.parametrize(
    ("fields", "reasoning", "effort"),
    [
        ({"thinking": {"type": "enabled", "budget_tokens": 1024}}, True, "low"),
        ({"thinking": {"type": "enabled", "budget_tokens": 8000}}, True, "medium"),
        ({"thinking": {"type": "enabled", "budget_tokens": 16000}}, True, "high"),
        (
            {"thinking": {"type": "enabled", "budget_tokens": 60000}, "max_tokens": 64000},
            True,
            "xhigh",
        ),
        ({"thinking": {"type": "disabled"}}, False, None),
        ({"thinking": {"type": "adaptive", "display": "omitted"}}, True, None),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, True, "high"),
        ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "max"}}, True, "xhigh"),
        ({"output_config": {"effort": "low"}}, None, "low"),
        ({}, None, None),
    ],
)
def test_thinking_and_effort(
    fields: dict[str, Any], reasoning: bool | None, effort: str | None
) -> None:
    out = chat(**({"max_tokens": 64000} | fields))
    assert out.get("reasoning") is reasoning
    assert out.get("reasoning_effort") == effort


def test_sampling_stops_metadata_format_and_stream() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string"}}}
    out = chat(
        temperature=0.5,
        top_p=0.9,
        top_k=40,
        stop_sequences=["END", "STOP"],
        metadata={"user_id": "user_abc_account__session_1234-abcd"},
        output_config={"format": {"type": "json_schema", "schema": schema}},
        stream=True,
    )
    assert (out["temperature"], out["top_p"], out["top_k"]) == (0.5, 0.9, 40)
    assert out["stop"] == ["END", "STOP"] and out["stream"] is True
    assert out["user"] == "user_abc_account__session_1234-abcd"
    assert out["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }


@pytest.mark.parametrize(
    ("user_id", "session"),
    [
        ('{"device_id":"d","account_uuid":"","session_id":"s-1"}', "s-1"),
        ("user_abc_account_9f_session_5c1f-0f4e", "5c1f-0f4e"),
        ('{"device_id":"d"}', None),
        ("{not json", None),
        ("plain-user", None),
    ],
)
def test_the_session_in_a_claude_code_user_id(user_id: str, session: str | None) -> None:
    assert session_of(user_id) == session
    assert translate(body(metadata={"user_id": user_id})).session_id == session


def test_unknown_fields_are_dropped_with_bounded_labels() -> None:
    translated = translate(body(context_management={"edits": []}, some_future_field=1))
    assert "context_management" not in translated.body
    assert translated.dropped == (
        ("context_management", "context_management"),
        ("other", "some_future_field"),
    )


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"max_tokens": "8"}, "max_tokens: Input should be a valid integer"),
        ({"max_tokens": 0}, "max_tokens: Input should be greater than or equal to 1"),
        ({"messages": []}, "messages: at least one message is required"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "system", "content": "x"}]}, "at least one message is required"),
        ({"messages": [{"role": "user"}]}, "messages.0.content: Field required"),
        (
            {"messages": [{"role": "user", "content": [{"type": "video"}]}]},
            "messages.0.content.0.type",
        ),
        ({"temperature": 1.5}, "temperature: Input should be between 0 and 1"),
        ({"thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
        ({"thinking": {"type": "enabled", "budget_tokens": 2000}}, "max_tokens: must be greater"),
        ({"tool_choice": {"type": "tool"}}, "tool_choice.name: Field required"),
        ({"output_config": {"effort": "extreme"}}, "output_config.effort"),
        ({"model": ""}, "model: Field required"),
    ],
)
def test_refusals_in_anthropics_words(fields: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        translate(body(**fields))
    assert says in refused.value.message


def test_max_tokens_is_required_except_to_count() -> None:
    without = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(InvalidRequest, match="max_tokens: Field required"):
        translate(without)
    assert "max_tokens" not in translate(without, count_only=True).body


def test_a_broken_gateway_signature_and_a_files_api_image_are_refused() -> None:
    bad = {"type": "thinking", "thinking": "", "signature": "tgw1.!!!"}
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": [bad]}]
    with pytest.raises(InvalidRequest, match="signature"):
        translate(body(messages=messages))
    image = {"type": "image", "source": {"type": "file", "file_id": "f"}}
    with pytest.raises(UnsupportedParameter):
        translate(body(messages=[{"role": "user", "content": [image]}]))


# --- the answer --------------------------------------------------------------------------------


def builder() -> MessageBuilder:
    return MessageBuilder(message_id="msg-1", model="alias", input_tokens=7)


def stream_of(events: list[Event]) -> list[dict[str, Any]]:
    """The Anthropic events of a stream, each parsed by the SDK's own event types."""
    encoder = MessageEncoder(builder())
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


def whole(events: list[Event]) -> dict[str, Any]:
    accumulator = MessageAccumulator(builder())
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
        "msg-1",
        "alias",
    )
    assert sdk_fold(stream) == Message.model_validate(message).model_dump(exclude_none=True)


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


@settings(max_examples=200, deadline=None)
@given(st.lists(_event, max_size=16))
def test_the_encoders_short_way_for_tokens_writes_what_the_long_way_does(
    middle: list[Event],
) -> None:
    events: list[Event] = [ResponseStarted("p"), *middle, ResponseDone("stop")]
    encoder, slow = MessageEncoder(builder()), builder()
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


def test_the_request_names_its_front_session_and_counts_what_it_dropped() -> None:
    from types import SimpleNamespace

    from trio_gateway.fronts.messages import messages_request
    from trio_gateway.ops.metrics import Metrics

    metrics = Metrics(lambda: [])
    router: Any = SimpleNamespace(aliases={"m": None}, metrics=metrics)
    user_id = json.dumps({"device_id": "d", "session_id": "s-42"})
    raw = json.dumps(body(metadata={"user_id": user_id}, context_management={}, x_new=1))
    request = messages_request(router, raw.encode(), None)
    assert (request.front, request.session_id, request.alias) == ("messages", "s-42", "m")
    counted = {
        field: metrics.registry.get_sample_value(
            "gateway_front_dropped_fields_total", {"front": "messages", "field": field}
        )
        for field in ("context_management", "other")
    }
    assert counted == {"context_management": 1.0, "other": 1.0}


def test_an_answer_without_its_start_event_still_opens_with_message_start() -> None:
    stream = stream_of([TextDelta("x"), ResponseDone("stop")])
    assert [e["type"] for e in stream][:3] == ["message_start", "ping", "content_block_start"]
    assert whole([TextDelta("x"), ResponseDone("stop")])["content"] == [
        {"type": "text", "text": "x"}
    ]


def test_a_system_message_in_the_list_stays_in_its_place() -> None:
    messages = [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
    ]
    assert chat(system="top", messages=messages)["messages"] == [
        {"role": "system", "content": "top"},
        {"role": "user", "content": "hi"},
        {"role": "system", "content": "# Environment"},
    ]
