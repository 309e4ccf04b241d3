"""``providers/openai_compatible.py`` to the letter: every message a malformed chunk gets, the
usage a cut stream is billed, a whole (non-streamed) answer, and the table entry's call.

Written for mutation testing (docs/testing.md): the older tests check the error's type; a
client (and an operator reading the log) sees its message, so these pin the message too.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import (
    InvalidRequest,
    UpstreamProtocolError,
    UpstreamRateLimited,
    UpstreamServerError,
)
from trio_gateway.core.events import (
    ReasoningDelta,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.core.request import ChatRequest
from trio_gateway.core.sse import SSEEvent
from trio_gateway.core.usage import PartialUsage
from trio_gateway.providers.openai_compatible.dialect import (
    ChunkParser,
    OpenAICompatibleDialect,
    build_body,
    parse_completion,
)
from trio_gateway.providers.openai_compatible.usage import parse_usage


def data(obj: Any) -> bytes:
    return json.dumps(obj).encode()


def delta(**fields: Any) -> bytes:
    return data({"choices": [{"delta": fields, "finish_reason": None}]})


@pytest.mark.parametrize(
    ("chunk", "message"),
    [
        (b"{", "p sent a chunk that is not JSON: "),
        (b"[1]", "p sent a chunk that is not an object"),
        (data({"choices": {"a": 1}}), "p sent a malformed chunk: 'choices' is not a list"),
        (data({"choices": [1]}), "p sent a malformed chunk: a choice is not an object"),
        (data({"choices": [{"delta": [1]}]}), "p sent a malformed chunk: 'delta' is not an object"),
        (delta(content=1), "p sent a malformed chunk: content is not a string"),
        (delta(reasoning=1), "p sent a malformed chunk: reasoning is not a string"),
        (
            delta(reasoning_content=1),
            "p sent a malformed chunk: reasoning_content is not a string",
        ),
        (delta(tool_calls={"a": 1}), "p sent a malformed chunk: 'tool_calls' is not a list"),
        (
            delta(tool_calls=[1]),
            "p sent a malformed chunk: a tool call fragment is not an object",
        ),
        (
            delta(tool_calls=[{"function": [1]}]),
            "p sent a malformed chunk: a tool call's 'function' is not an object",
        ),
        (delta(tool_calls=[{"index": -1}]), "p sent a malformed chunk: tool call index -1"),
        (delta(tool_calls=[{"index": 128}]), "p sent a malformed chunk: tool call index 128"),
        (delta(tool_calls=[{"index": "0"}]), "p sent a malformed chunk: tool call index '0'"),
        (delta(tool_calls=[{"index": True}]), "p sent a malformed chunk: tool call index True"),
        (
            delta(tool_calls=[{"index": 0, "id": 5}]),
            "p sent a malformed chunk: a tool call id is not a string",
        ),
        (
            delta(tool_calls=[{"index": 0, "function": {"name": 5}}]),
            "p sent a malformed chunk: a tool call name is not a string",
        ),
        (
            delta(tool_calls=[{"index": 0, "function": {"arguments": 5}}]),
            "p sent a malformed chunk: tool call arguments is not a string",
        ),
        (
            data({"choices": [{"delta": {}, "finish_reason": 3}]}),
            "p sent a malformed chunk: finish_reason is not a string",
        ),
    ],
)
def test_each_malformed_chunk_says_what_is_wrong(chunk: bytes, message: str) -> None:
    with pytest.raises(UpstreamProtocolError) as caught:
        ChunkParser("p").feed_data(chunk)
    assert caught.value.message.startswith(message)
    if not message.endswith(": "):
        assert caught.value.message == message
    assert caught.value.provider == "p"


def test_index_127_is_the_last_one_allowed_and_a_missing_index_is_0() -> None:
    parser = ChunkParser("p")
    events = parser.feed_data(delta(tool_calls=[{"index": 127, "id": "a", "function": {}}]))
    assert events[-1] == ToolCallDelta(index=127, id="a", name=None, arguments="")
    events = ChunkParser("p").feed_data(delta(tool_calls=[{"function": {"name": "f"}}]))
    assert events[-1] == ToolCallDelta(index=0, id=None, name="f", arguments="")


def test_arguments_over_the_bound_are_a_malformed_chunk() -> None:
    parser = ChunkParser("p")
    parser.feed_data(delta(tool_calls=[{"index": 0, "id": "a", "function": {"name": "f"}}]))
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.feed_data(
            delta(tool_calls=[{"index": 0, "function": {"arguments": "x" * (1 << 21)}}])
        )
    assert caught.value.message.startswith("p sent a malformed chunk: ")
    assert caught.value.provider == "p"


def test_data_after_done_and_the_closing_messages() -> None:
    parser = ChunkParser("p")
    parser.feed_data(data({"choices": [{"delta": {}, "finish_reason": "stop"}]}))
    assert parser.feed_data(b"[DONE]") == [ResponseDone("stop")]
    assert parser.done
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.feed_data(delta(content="x"))
    assert caught.value.message == "p sent data after [DONE]"
    assert parser.close() == []

    with pytest.raises(UpstreamProtocolError) as caught:
        ChunkParser("p").feed_data(b"[DONE]")
    assert caught.value.message == "p ended the stream without a finish_reason"

    parser = ChunkParser("p")
    parser.feed_data(delta(content="x"))
    assert not parser.done
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.close()
    assert caught.value.message == "p closed the stream before the answer finished"

    parser = ChunkParser("p")
    parser.feed_data(data({"choices": [{"delta": {}, "finish_reason": "length"}]}))
    assert parser.close() == [ResponseDone("length")]
    assert parser.done


def test_feed_takes_the_data_of_an_sse_event() -> None:
    parser = ChunkParser("p")
    assert parser.feed(SSEEvent(data=delta(content="hi"))) == [
        ResponseStarted("p"),
        TextDelta("hi"),
    ]


def test_started_once_and_reasoning_before_content() -> None:
    parser = ChunkParser("p")
    assert parser.feed_data(delta(reasoning="r", content="c")) == [
        ResponseStarted("p"),
        ReasoningDelta("r"),
        TextDelta("c"),
    ]
    assert parser.feed_data(delta(reasoning_content="r2", reasoning="ignored")) == [
        ReasoningDelta("r2")
    ]
    assert parser.feed_data(delta(content="", reasoning="")) == []
    assert parser.feed_data(data({"choices": []})) == []


def test_an_in_band_error_is_classified_with_its_message() -> None:
    with pytest.raises(UpstreamServerError) as caught:
        ChunkParser("p").feed_data(data({"error": {"message": "slow", "code": 500}}))
    assert caught.value.message == "p failed mid-stream: slow"
    with pytest.raises(InvalidRequest) as bad:
        ChunkParser("p").feed_data(data({"object": "error", "message": "bad", "code": 400}))
    assert bad.value.message == "bad"
    assert bad.value.provider == "p"
    with pytest.raises(UpstreamServerError) as text:
        ChunkParser("p").feed_data(data({"error": "out of blocks"}))
    assert text.value.message == "p failed mid-stream: out of blocks"


def test_usage_so_far() -> None:
    parser = ChunkParser("p")
    assert parser.usage_so_far() is None
    parser.feed_data(data({"choices": [], "usage": None}))
    assert parser.usage_so_far() == PartialUsage(Usage(0, 0), estimated=True)

    parser = ChunkParser("p")
    parser.feed_data(delta(content="a"))
    parser.feed_data(delta(reasoning="b"))
    parser.feed_data(delta(tool_calls=[{"index": 0, "id": "c", "function": {"name": "f"}}]))
    assert parser.usage_so_far() == PartialUsage(Usage(0, 3), estimated=True)

    usage = {
        "prompt_tokens": 7,
        "completion_tokens": 2,
        "completion_tokens_details": {"reasoning_tokens": 1},
        "prompt_tokens_details": {"cached_tokens": 4},
    }
    # continuous usage: each chunk's usage is cumulative and exact, with no Usage event.
    events = parser.feed_data(
        data({"choices": [{"delta": {"content": "d"}, "finish_reason": None}], "usage": usage})
    )
    assert events == [TextDelta("d")]
    assert parser.usage_so_far() == PartialUsage(Usage(7, 2, 1, 4), estimated=False)
    parser.feed_data(delta(content="e"))
    parser.feed_data(delta(content="f"))
    assert parser.usage_so_far() == PartialUsage(Usage(7, 4, 1, 4), estimated=True)
    assert parser.feed_data(data({"choices": [], "usage": usage})) == [Usage(7, 2, 1, 4)]
    assert parser.usage_so_far() == PartialUsage(Usage(7, 2, 1, 4), estimated=False)


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({}, Usage(0, 0)),
        ({"prompt_tokens": 3, "completion_tokens": 5}, Usage(3, 5)),
        ({"prompt_tokens": "3", "completion_tokens": 5.0}, Usage(0, 0)),
        ({"prompt_tokens": True, "completion_tokens": None}, Usage(0, 0)),
        (
            {
                "prompt_tokens": 1,
                "completion_tokens": 2,
                "completion_tokens_details": None,
                "prompt_tokens_details": None,
            },
            Usage(1, 2),
        ),
        (
            {
                "completion_tokens_details": {"reasoning_tokens": "1"},
                "prompt_tokens_details": {"cached_tokens": 2.0},
            },
            Usage(0, 0),
        ),
        (
            {
                "completion_tokens_details": {"reasoning_tokens": 0},
                "prompt_tokens_details": {"cached_tokens": 0},
            },
            Usage(0, 0, 0, 0),
        ),
    ],
)
def test_parse_usage(usage: dict[str, Any], expected: Usage) -> None:
    assert parse_usage(usage) == expected


# --- a whole answer ---------------------------------------------------------------------------


def test_a_whole_answer_is_the_stream_it_stands_for() -> None:
    body = data(
        {
            "choices": [
                {
                    "message": {
                        "role": "assistant",
                        "reasoning": "think",
                        "content": "hi",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            },
                            {
                                "id": "c2",
                                "type": "function",
                                "function": {"name": "g", "arguments": "[1]"},
                            },
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 4, "completion_tokens": 6},
        }
    )
    events = parse_completion("p", body)
    assert events == [
        ResponseStarted("p"),
        ReasoningDelta("think"),
        TextDelta("hi"),
        ToolCallDelta(index=0, id="c1", name="f", arguments="{}"),
        ToolCallDelta(index=1, id="c2", name="g", arguments="[1]"),
        ToolCallDone(
            index=0, id="c1", name="f", arguments={}, arguments_raw="{}", arguments_valid=True
        ),
        ToolCallDone(
            index=1, id="c2", name="g", arguments=[1], arguments_raw="[1]", arguments_valid=True
        ),
        Usage(4, 6),
        ResponseDone("tool_calls"),
    ]


def test_a_whole_answer_without_usage_or_calls() -> None:
    body = data({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})
    assert parse_completion("p", body) == [
        ResponseStarted("p"),
        TextDelta("hi"),
        ResponseDone("stop"),
    ]
    body = data(
        {
            "choices": [
                {"message": {"content": "hi", "tool_calls": None}, "finish_reason": "stop"}
            ],
            "usage": "none",
        }
    )
    assert parse_completion("p", body)[-1] == ResponseDone("stop")


@pytest.mark.parametrize(
    "body",
    [
        b"not json",
        b"[]",
        b"{}",
        data({"choices": []}),
        data({"choices": [{}]}),
        data({"choices": 1}),
    ],
)
def test_a_body_that_is_not_a_chat_completion(body: bytes) -> None:
    with pytest.raises(UpstreamProtocolError) as caught:
        parse_completion("p", body)
    assert caught.value.message == "p sent a whole answer that is not a chat completion"
    assert caught.value.provider == "p"


def test_a_whole_answer_whose_message_is_not_an_object() -> None:
    body = data({"choices": [{"message": "hi", "finish_reason": "stop"}]})
    assert parse_completion("p", body) == [ResponseStarted("p"), ResponseDone("stop")]


def test_a_whole_answer_with_a_tool_call_that_is_not_an_object() -> None:
    body = data({"choices": [{"message": {"tool_calls": [1]}, "finish_reason": "stop"}]})
    with pytest.raises(UpstreamProtocolError) as caught:
        parse_completion("p", body)
    assert caught.value.message == "p sent a malformed chunk: a tool call fragment is not an object"


# --- the request and the table entry ----------------------------------------------------------


def request(body: dict[str, Any], reasoning: bool | None = None) -> ChatRequest:
    return ChatRequest(
        alias="a",
        body=body,
        stream=True,
        include_usage=False,
        reasoning=reasoning,
        required=frozenset(),
    )


def vllm(**overrides: Any) -> ProviderConfig:
    fields: dict[str, Any] = {
        "name": "p",
        "type": "openai_compatible",
        "model": "qwen",
        "base_url": "http://h/v1/",
        "capabilities": frozenset({Capability.REASONING}),
    }
    fields.update(overrides)
    return ProviderConfig(**fields)


def test_build_body_merges_enable_thinking_into_the_clients_template_kwargs() -> None:
    body = build_body(
        request({"messages": [], "chat_template_kwargs": {"x": 1}}, reasoning=False), vllm()
    )
    assert body["chat_template_kwargs"] == {"x": 1, "enable_thinking": False}
    body = build_body(request({"messages": [], "chat_template_kwargs": "odd"}, True), vllm())
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    body = build_body(request({"messages": []}, None), vllm())
    assert "chat_template_kwargs" not in body
    body = build_body(request({"messages": [], "top_k": 3}), vllm(strip_fields=("top_k",)))
    assert body == {
        "messages": [],
        "model": "qwen",
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }


def test_the_dialect_builds_the_call_parses_and_classifies() -> None:
    dialect = OpenAICompatibleDialect()
    call = dialect.build_call(request({"messages": [{"role": "user", "content": "é"}]}), vllm())
    assert call.url == "http://h/v1/chat/completions"
    assert call.headers == {"content-type": "application/json", "accept": "text/event-stream"}
    assert "é".encode() in call.body
    assert json.loads(call.body)["model"] == "qwen"
    assert dialect.auth_headers("k") == {"authorization": "Bearer k"}
    parser = dialect.new_parser("p")
    assert parser.feed_data(delta(content="x")) == [ResponseStarted("p"), TextDelta("x")]
    whole = data({"choices": [{"message": {"content": "y"}, "finish_reason": "stop"}]})
    assert dialect.parse_whole("p", whole)[-1] == ResponseDone("stop")
    error = dialect.classify_error(
        "p", 429, data({"error": {"message": "later"}}), {"retry-after": "3"}
    )
    assert isinstance(error, UpstreamRateLimited)
    assert error.retry_after_s == 3
    assert error.provider == "p"
    assert "later" in error.message


def test_the_assembler_s_bound_is_the_message() -> None:
    parser = ChunkParser("p")
    parser.feed_data(delta(tool_calls=[{"index": 0, "id": "a", "function": {"name": "f"}}]))
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.feed_data(
            delta(tool_calls=[{"index": 0, "function": {"arguments": "x" * (1 << 21)}}])
        )
    assert caught.value.message == (
        "p sent a malformed chunk: tool call 0 arguments exceed 1048576 bytes"
    )


def test_a_close_before_the_finish_names_the_provider() -> None:
    parser = ChunkParser("p")
    parser.feed_data(delta(content="x"))
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.close()
    assert caught.value.provider == "p"


def test_a_whole_answer_s_tool_calls_that_are_not_a_list_are_ignored() -> None:
    body = data(
        {"choices": [{"message": {"content": "hi", "tool_calls": "x"}, "finish_reason": "stop"}]}
    )
    assert parse_completion("p", body) == [
        ResponseStarted("p"),
        TextDelta("hi"),
        ResponseDone("stop"),
    ]


def test_a_whole_answer_through_the_dialect_names_the_provider() -> None:
    body = data({"choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]})
    assert OpenAICompatibleDialect().parse_whole("p", body)[0] == ResponseStarted("p")


def test_the_closing_errors_name_the_provider() -> None:
    parser = ChunkParser("p")
    parser.feed_data(data({"choices": [{"delta": {}, "finish_reason": "stop"}]}))
    parser.feed_data(b"[DONE]")
    with pytest.raises(UpstreamProtocolError) as caught:
        parser.feed_data(delta(content="x"))
    assert caught.value.provider == "p"
    with pytest.raises(UpstreamProtocolError) as caught:
        ChunkParser("p").feed_data(b"[DONE]")
    assert caught.value.provider == "p"
