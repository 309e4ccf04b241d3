"""The OpenAI front's encoders: events → chunks the official SDK parses, and whole responses."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from trio_gateway.core.errors import UpstreamServerError
from trio_gateway.core.events import (
    Event,
    ReasoningDelta,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.sse import SSEDecoder
from trio_gateway.fronts.openai_chunks import ChunkEncoder, ResponseAccumulator, error_chunk

EVENTS: list[Event] = [
    ResponseStarted("vllm-a"),
    ReasoningDelta("hmm"),
    TextDelta("Hello 世界"),
    ToolCallDelta(0, "call-1", "get_weather", ""),
    ToolCallDelta(0, None, None, '{"city": '),
    ToolCallDelta(0, None, None, '"Paris"}'),
    ToolCallDone(0, "call-1", "get_weather", {"city": "Paris"}, '{"city": "Paris"}', True),
    Usage(10, 5, 2, None),
    ResponseDone("tool_calls"),
]


def encode(include_usage: bool) -> list[Any]:
    encoder = ChunkEncoder(
        completion_id="chatcmpl-x", created=1, model="agent-lite", include_usage=include_usage
    )
    wire = b"".join(encoder.encode(e) for e in EVENTS)
    payloads = [s.data for s in SSEDecoder().feed(wire)]
    assert payloads[-1] == b"[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def test_chunks_validate_as_the_sdk_types() -> None:
    chunks = encode(include_usage=True)
    parsed = [ChatCompletionChunk.model_validate(c) for c in chunks]
    assert all(c.model == "agent-lite" and c.id == "chatcmpl-x" for c in parsed)
    assert parsed[0].choices[0].delta.role == "assistant"
    assert chunks[1]["choices"][0]["delta"] == {"reasoning_content": "hmm"}
    assert parsed[2].choices[0].delta.content == "Hello 世界"
    first_call = parsed[3].choices[0].delta.tool_calls
    assert first_call is not None and first_call[0].id == "call-1"
    assert first_call[0].function is not None and first_call[0].function.name == "get_weather"
    assert parsed[-2].choices[0].finish_reason == "tool_calls"
    # The usage chunk comes last, with no choices, only because the client asked.
    assert parsed[-1].choices == []
    assert parsed[-1].usage is not None and parsed[-1].usage.total_tokens == 15
    assert chunks[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 2}


def test_no_usage_chunk_unless_asked() -> None:
    chunks = encode(include_usage=False)
    assert all("usage" not in c for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_error_chunk_is_openai_shaped() -> None:
    wire = error_chunk(UpstreamServerError("vllm-a failed mid-stream: x", provider="vllm-a"))
    [sse] = SSEDecoder().feed(wire)
    error = json.loads(sse.data)["error"]
    assert error["code"] == "upstream_error" and error["provider"] == "vllm-a"
    assert set(error) >= {"message", "type", "code", "param"}


def test_accumulator_builds_a_chat_completion() -> None:
    acc = ResponseAccumulator(completion_id="chatcmpl-x", created=1, model="agent-lite")
    for event in EVENTS:
        acc.add(event)
    body = acc.result()
    completion = ChatCompletion.model_validate(body)
    message = completion.choices[0].message
    assert message.content == "Hello 世界"
    assert body["choices"][0]["message"]["reasoning_content"] == "hmm"
    assert message.tool_calls is not None
    call = message.tool_calls[0]
    assert call.function.arguments == '{"city": "Paris"}'  # type: ignore[union-attr]
    assert completion.choices[0].finish_reason == "tool_calls"
    assert completion.usage is not None and completion.usage.prompt_tokens == 10


def test_invalid_tool_arguments_are_marked() -> None:
    acc = ResponseAccumulator(completion_id="c", created=1, model="m")
    acc.add(ToolCallDone(0, "c1", "f", '{"a": ', '{"a": ', False))
    acc.add(ResponseDone("tool_calls"))
    [call] = acc.result()["choices"][0]["message"]["tool_calls"]
    assert call["arguments_valid"] is False
    assert call["function"]["arguments"] == '{"a": '


def test_whitespace_before_a_tool_call_is_no_content() -> None:
    acc = ResponseAccumulator(completion_id="c", created=1, model="m")
    acc.add(ReasoningDelta("think"))
    acc.add(TextDelta("\n\n"))
    acc.add(ToolCallDone(0, "c1", "f", {}, "{}", True))
    acc.add(ResponseDone("tool_calls"))
    assert acc.result()["choices"][0]["message"]["content"] is None
    plain = ResponseAccumulator(completion_id="c", created=1, model="m")
    plain.add(TextDelta("\n\n"))
    plain.add(ResponseDone("stop"))
    assert plain.result()["choices"][0]["message"]["content"] == "\n\n"


@settings(max_examples=300)
@given(st.text(), st.booleans(), st.booleans())
def test_text_chunks_are_the_bytes_json_dumps_gives(
    text: str, reasoning: bool, include_usage: bool
) -> None:
    """The token chunks are built from prepared bytes around one escaped string; they must be
    exactly what dumping the whole chunk gives, for any text (quotes, controls, U+2028, emoji)."""
    encoder = ChunkEncoder(
        completion_id="chatcmpl-x", created=7, model="agent-lite", include_usage=include_usage
    )
    field = "reasoning_content" if reasoning else "content"
    event = ReasoningDelta(text) if reasoning else TextDelta(text)
    chunk: dict[str, Any] = {
        "id": "chatcmpl-x",
        "object": "chat.completion.chunk",
        "created": 7,
        "model": "agent-lite",
        "choices": [{"index": 0, "delta": {field: text}, "logprobs": None, "finish_reason": None}],
    }
    if include_usage:
        chunk["usage"] = None
    expected = json.dumps(chunk, ensure_ascii=False, separators=(",", ":")).encode()
    assert encoder.encode(event) == b"data: " + expected + b"\n\n"
