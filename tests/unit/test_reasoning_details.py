"""``reasoning_details``: the answer's signed reasoning on OpenAI's wire (chunks, the whole
answer, the event stream) and the request's shape, checked at the front."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from trio_gateway.core.errors import InvalidRequest
from trio_gateway.core.events import (
    Event,
    ReasoningDelta,
    ReasoningDetail,
    ResponseDone,
    ResponseStarted,
    ToolCallDelta,
    ToolCallDone,
)
from trio_gateway.core.events_codec import EventEncoder
from trio_gateway.core.reasoning_details import ANTHROPIC, GOOGLE, MAX_DETAILS, detail_object
from trio_gateway.core.request import validate_chat_body
from trio_gateway.core.sse import SSEDecoder
from trio_gateway.fronts.openai_chunks import ChunkEncoder, ResponseAccumulator

THINKING = ReasoningDetail(0, ANTHROPIC, text="hmm", signature="c2ln")
REDACTED = ReasoningDetail(1, ANTHROPIC, data="ZW5j")
SIGNED_CALL = ReasoningDetail(0, GOOGLE, data="dGhvdWdodA==", tool_call_id="call_1")

WIRE: list[tuple[ReasoningDetail, dict[str, Any]]] = [
    (
        THINKING,
        {
            "type": "reasoning.text",
            "text": "hmm",
            "signature": "c2ln",
            "format": "anthropic-claude-v1",
            "index": 0,
        },
    ),
    (
        REDACTED,
        {"type": "reasoning.encrypted", "data": "ZW5j", "format": ANTHROPIC, "index": 1},
    ),
    (
        SIGNED_CALL,
        {
            "type": "reasoning.encrypted",
            "data": "dGhvdWdodA==",
            "id": "call_1",
            "format": "google-gemini-v1",
            "index": 0,
        },
    ),
]


@pytest.mark.parametrize(("detail", "wire"), WIRE)
def test_each_detail_has_openrouters_shape(detail: ReasoningDetail, wire: dict[str, Any]) -> None:
    assert detail_object(detail) == wire


EVENTS: list[Event] = [
    ResponseStarted("anthropic"),
    ReasoningDelta("hmm"),
    THINKING,
    REDACTED,
    ToolCallDelta(0, "toolu_1", "get_weather", '{"city": "Paris"}'),
    ToolCallDone(0, "toolu_1", "get_weather", {"city": "Paris"}, '{"city": "Paris"}', True),
    ResponseDone("tool_calls"),
]


def test_a_stream_carries_each_detail_whole_once_on_the_delta() -> None:
    encoder = ChunkEncoder(completion_id="c", created=1, model="a", include_usage=False)
    wire = b"".join(encoder.encode(e) for e in EVENTS)
    chunks = [
        ChatCompletionChunk.model_validate(json.loads(s.data))
        for s in SSEDecoder().feed(wire)
        if s.data != b"[DONE]"
    ]
    details = [
        entry
        for chunk in chunks
        for choice in chunk.choices
        for entry in (choice.delta.model_extra or {}).get("reasoning_details") or ()
    ]
    # Appended in order, they are the whole answer's reasoning_details.
    assert details == [detail_object(THINKING), detail_object(REDACTED)]


def test_a_whole_answer_carries_them_on_the_message() -> None:
    accumulator = ResponseAccumulator(completion_id="c", created=1, model="a")
    for event in EVENTS:
        accumulator.add(event)
    message = ChatCompletion.model_validate(accumulator.result()).choices[0].message
    assert (message.model_extra or {})["reasoning_details"] == [
        detail_object(THINKING),
        detail_object(REDACTED),
    ]


def test_an_answer_without_them_has_no_field() -> None:
    accumulator = ResponseAccumulator(completion_id="c", created=1, model="a")
    for event in (ResponseStarted("x"), ReasoningDelta("hmm"), ResponseDone("stop")):
        accumulator.add(event)
    assert "reasoning_details" not in accumulator.result()["choices"][0]["message"]


def test_the_event_stream_carries_them_as_reasoning_detail() -> None:
    encoder = EventEncoder(request_id="r", alias="a")
    out = encoder.encode(SIGNED_CALL)
    assert out["type"] == "reasoning.detail"
    assert out["detail"] == detail_object(SIGNED_CALL)


# --- the request -------------------------------------------------------------------------------

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}


def assistant(details: Any, **fields: Any) -> dict[str, Any]:
    message = {"role": "assistant", "content": "ok", "reasoning_details": details}
    return message | fields


def body(message: dict[str, Any]) -> dict[str, Any]:
    return {"model": "a", "messages": [{"role": "user", "content": "hi"}, message]}


VALID: list[Any] = [
    [],
    [wire for _, wire in WIRE],
    # What OpenRouter-shaped answers hold besides: summaries, nulls, keys of their own.
    [{"type": "reasoning.summary", "summary": "s", "format": None, "index": 0, "extra": 1}],
    None,
]


@pytest.mark.parametrize("details", VALID)
def test_an_assistant_message_may_carry_them(details: Any) -> None:
    validate_chat_body(body(assistant(details)))
    validate_chat_body(body(assistant(details, content=None, tool_calls=[CALL])))


BAD: list[tuple[Any, str]] = [
    ("x", "messages[1].reasoning_details"),
    ([1], "messages[1].reasoning_details[0]"),
    ([{"text": "x"}], "messages[1].reasoning_details[0].type"),
    ([{"type": "reasoning.secret"}], "messages[1].reasoning_details[0].type"),
    ([{"type": "reasoning.text", "text": 1}], "messages[1].reasoning_details[0].text"),
    ([{"type": "reasoning.text", "signature": []}], "messages[1].reasoning_details[0].signature"),
    ([{"type": "reasoning.encrypted", "data": {}}], "messages[1].reasoning_details[0].data"),
    ([{"type": "reasoning.encrypted", "id": 5}], "messages[1].reasoning_details[0].id"),
    ([{"type": "reasoning.text", "index": -1}], "messages[1].reasoning_details[0].index"),
    ([{"type": "reasoning.text", "format": 2}], "messages[1].reasoning_details[0].format"),
    ([{"type": "reasoning.summary"}] * (MAX_DETAILS + 1), "messages[1].reasoning_details"),
]


@pytest.mark.parametrize(("details", "param"), BAD)
def test_a_bad_shape_is_refused_with_its_param(details: Any, param: str) -> None:
    # A message with one string of content too: the fast path must not skip the check.
    with pytest.raises(InvalidRequest) as caught:
        validate_chat_body(body(assistant(details)))
    assert caught.value.param == param


def test_they_do_not_stand_in_for_content() -> None:
    message = {"role": "assistant", "reasoning_details": [wire for _, wire in WIRE]}
    with pytest.raises(InvalidRequest) as caught:
        validate_chat_body(body(message))
    assert caught.value.param == "messages[1].content"


# --- upstreams that speak OpenAI's chat --------------------------------------------------------


@pytest.mark.parametrize("kind", ["openai", "openai_compatible"])
def test_an_openai_shaped_upstream_never_gets_them(kind: str) -> None:
    """A history from Anthropic or Gemini may reach OpenAI (which refuses fields it does not
    know) or vLLM on failover: the extension is left out, the client's body untouched."""
    from trio_gateway.config.schema import ProviderConfig
    from trio_gateway.providers.openai.dialect import build_body as openai_body
    from trio_gateway.providers.openai_compatible.dialect import build_body as compatible_body

    build = openai_body if kind == "openai" else compatible_body
    provider = ProviderConfig(name="p", type=kind, model="m")  # type: ignore[arg-type]
    sent_back = assistant([wire for _, wire in WIRE], content=None, tool_calls=[CALL])
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "ok"}
    request = validate_chat_body(
        {**body(sent_back), "messages": [*body(sent_back)["messages"], tool]}
    )
    out = build(request, provider)
    assert [m.get("reasoning_details") for m in out["messages"]] == [None, None, None]
    assert out["messages"][1]["tool_calls"] == [CALL]
    assert request.body["messages"][1]["reasoning_details"]
