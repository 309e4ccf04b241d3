"""What a span says (ops/spans.py, pure): the GenAI attributes of a request and of its usage
record, the content recorded only as the conventions' JSON and only within its bound."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.core.events import (
    CompletionText,
    Event,
    ReasoningDelta,
    ResponseDone,
    TextDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.kind import RequestKind
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.usage import UsageRecord
from trio_gateway.ops.spans import (
    MAX_CONTENT_CHARS,
    AnswerWatch,
    input_messages,
    provider_name,
    record_attributes,
    request_attributes,
)


def request(body: dict[str, Any], kind: RequestKind = RequestKind.CHAT, **kw: Any) -> ChatRequest:
    return ChatRequest(
        alias="agent-lite",
        body=body,
        stream=kw.pop("stream", False),
        include_usage=False,
        reasoning=None,
        required=frozenset(),
        kind=kind,
        **kw,
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ({"max_tokens": 40, "temperature": 0, "top_p": 1}, (40, 0.0, 1.0)),
        ({"max_completion_tokens": 7, "max_tokens": 40}, (7, None, None)),
        # JSON's true is no number; a float max_tokens is no token count.
        ({"max_tokens": 4.5, "temperature": True, "top_p": "0.9"}, (None, None, None)),
        ({}, (None, None, None)),
    ],
)
def test_the_sampling_fields_are_taken_as_numbers_only(
    body: dict[str, Any], expected: tuple[object, ...]
) -> None:
    attributes = request_attributes(request(body), "chatcmpl-1")
    got = tuple(
        attributes.get(f"gen_ai.request.{f}") for f in ("max_tokens", "temperature", "top_p")
    )
    assert got == expected
    assert type(got[1]) is (float if expected[1] is not None else type(None))


@pytest.mark.parametrize(
    ("kind", "front", "operation", "endpoint"),
    [
        (RequestKind.CHAT, None, "chat", "chat"),
        (RequestKind.CHAT, "messages", "chat", "messages"),
        (RequestKind.CHAT, "responses", "chat", "responses"),
        (RequestKind.COMPLETIONS, None, "text_completion", "completions"),
        (RequestKind.EMBEDDINGS, None, "embeddings", "embeddings"),
    ],
)
def test_the_operation_is_the_endpoints(
    kind: RequestKind, front: str | None, operation: str, endpoint: str
) -> None:
    attributes = request_attributes(
        request({}, kind, front=front, key_name="search", priority=3, stream=True), "id-1"
    )
    assert attributes == {
        "gen_ai.operation.name": operation,
        "gen_ai.request.model": "agent-lite",
        "gen_ai.response.id": "id-1",
        "gen_ai.request.stream": True,
        "trio_gateway.endpoint": endpoint,
        "trio_gateway.key": "search",
        "trio_gateway.priority": 3,
    }


@pytest.mark.parametrize(
    ("provider_type", "name"),
    [
        ("openai_compatible", "vllm"),
        ("openai", "openai"),
        ("anthropic", "anthropic"),
        ("gemini", "gcp.gemini"),
        ("vertex", "gcp.vertex_ai"),
    ],
)
def test_provider_names_are_the_conventions_well_known_values(
    provider_type: str, name: str
) -> None:
    assert provider_name(provider_type) == name


def record(**kw: Any) -> UsageRecord:
    fields: dict[str, Any] = {
        "request_id": "r",
        "key": None,
        "alias": "agent-lite",
        "provider": "sim-a",
        "outcome": "completed",
        "started_at": 1.0,
    }
    return UsageRecord(**(fields | kw))


def test_a_completed_record_has_its_tokens_cached_and_reasoning_included() -> None:
    attributes = record_attributes(
        record(
            prompt_tokens=12,
            completion_tokens=30,
            cached_tokens=8,
            reasoning_tokens=20,
            ttft_s=0.25,
            key="search",
            priority=1,
            filtered="pii:mask,secrets:block",
        )
    )
    assert attributes == {
        "trio_gateway.outcome": "completed",
        "trio_gateway.cancelled": False,
        "gen_ai.request.model": "agent-lite",
        "trio_gateway.provider": "sim-a",
        "trio_gateway.key": "search",
        "trio_gateway.priority": 1,
        "trio_gateway.filtered": ("pii:mask", "secrets:block"),
        "gen_ai.response.time_to_first_chunk": 0.25,
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.usage.cache_read.input_tokens": 8,
        "gen_ai.usage.reasoning.output_tokens": 20,
        "trio_gateway.usage.estimated": False,
    }


def test_a_cancellation_is_no_error_and_a_refusal_has_no_tokens() -> None:
    cancelled = record_attributes(record(outcome="cancelled", error_code="client_gone"))
    assert cancelled["trio_gateway.cancelled"] is True
    assert cancelled["trio_gateway.code"] == "client_gone"
    assert "error.type" not in cancelled
    refused = record_attributes(
        record(outcome="refused", error_code="rate_limited", provider=None, alias=None)
    )
    assert refused["error.type"] == refused["trio_gateway.code"] == "rate_limited"
    assert not any(k.startswith("gen_ai.usage") for k in refused)
    assert "gen_ai.request.model" not in refused and "trio_gateway.provider" not in refused


def test_input_messages_follow_the_conventions_schema() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "be brief"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "look", "arguments": '{"at": "it"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "a cat"},
        ]
    }
    assert json.loads(input_messages(request(body)) or "") == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        # Media by their type only: no base64 in a trace.
        {
            "role": "user",
            "parts": [{"type": "text", "content": "what is this?"}, {"type": "image_url"}],
        },
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "call_1", "name": "look", "arguments": '{"at": "it"}'}
            ],
        },
        {
            "role": "tool",
            "parts": [{"type": "tool_call_response", "id": "call_1", "response": "a cat"}],
        },
    ]


def test_a_completion_prompt_and_an_embedding_input_are_one_user_message() -> None:
    prompt = request({"prompt": ["one", "two"]}, RequestKind.COMPLETIONS)
    assert json.loads(input_messages(prompt) or "") == [
        {"role": "user", "parts": [{"type": "text", "content": t} for t in ("one", "two")]}
    ]
    embedding = request({"input": "vector me"}, RequestKind.EMBEDDINGS)
    assert json.loads(input_messages(embedding) or "")[0]["parts"][0]["content"] == "vector me"


def test_content_past_the_bound_is_left_out_whole() -> None:
    long = request({"messages": [{"role": "user", "content": "x" * MAX_CONTENT_CHARS}]})
    assert input_messages(long) is None
    watch = AnswerWatch(capture=True)
    watch.feed([TextDelta("y" * (MAX_CONTENT_CHARS // 2))] * 3)
    assert watch.overflowed and watch.output_messages() is None


def test_the_answer_watch_notes_finish_reasons_and_captures_only_when_asked() -> None:
    events: list[Event] = [
        ReasoningDelta("hmm"),
        TextDelta("rye "),
        TextDelta("bread"),
        ToolCallDone(0, "call_1", "bake", {"t": 200}, '{"t": 200}', True),
        Usage(prompt_tokens=3, completion_tokens=4),
        ResponseDone("tool_calls"),
    ]
    quiet = AnswerWatch(capture=False)
    quiet.feed(events)
    assert quiet.finish_reasons == ["tool_calls"]
    assert quiet.output_messages() is None
    loud = AnswerWatch(capture=True)
    loud.feed(events[:2])
    loud.feed(events[2:])
    assert json.loads(loud.output_messages() or "") == [
        {
            "role": "assistant",
            "parts": [
                {"type": "text", "content": "rye bread"},
                {"type": "tool_call", "id": "call_1", "name": "bake", "arguments": {"t": 200}},
            ],
            "finish_reason": "tool_calls",
        }
    ]


def test_completion_choices_are_one_message_each() -> None:
    watch = AnswerWatch(capture=True)
    watch.feed(
        [
            CompletionText(0, "a"),
            CompletionText(1, "b"),
            CompletionText(0, "c", finish_reason="stop"),
            CompletionText(1, "", finish_reason="length"),
        ]
    )
    assert watch.finish_reasons == ["stop", "length"]
    messages = json.loads(watch.output_messages() or "")
    assert [m["parts"][0]["content"] for m in messages] == ["ac", "b"]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.text(max_size=200), max_size=30))
def test_captured_text_is_the_text_streamed_in_any_split(pieces: list[str]) -> None:
    watch = AnswerWatch(capture=True)
    for piece in pieces:
        watch.feed([TextDelta(piece)])
    watch.feed([ResponseDone("stop")])
    output = watch.output_messages()
    if not pieces:
        assert output is None
    else:
        assert json.loads(output or "")[0]["parts"][0]["content"] == "".join(pieces)
