"""The OpenAI front's exact bytes: the compact JSON of every chunk, key by key, as OpenAI sends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from trio_gateway.core.events import (
    ErrorEvent,
    Event,
    ResponseCancelled,
    ResponseDone,
    ResponseStarted,
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    Usage,
)
from trio_gateway.fronts.openai_chunks import ChunkEncoder, ResponseAccumulator, dumps

HEAD = '{"id":"chatcmpl-1","object":"chat.completion.chunk","created":7,"model":"agent-lite"'


def encoder(*, include_usage: bool) -> ChunkEncoder:
    return ChunkEncoder(
        completion_id="chatcmpl-1", created=7, model="agent-lite", include_usage=include_usage
    )


def chunk(delta: str, *, usage: bool) -> bytes:
    tail = ',"logprobs":null,"finish_reason":null}]' + (',"usage":null}' if usage else "}")
    return f'data: {HEAD},"choices":[{{"index":0,"delta":{delta}{tail}\n\n'.encode()


@pytest.mark.parametrize("include_usage", [False, True])
def test_every_chunk_is_compact_json_with_the_exact_keys(include_usage: bool) -> None:
    enc = encoder(include_usage=include_usage)
    u = include_usage
    assert enc.encode(ResponseStarted("p")) == chunk('{"role":"assistant","content":""}', usage=u)
    assert enc.encode(TextDelta("héllo 世界")) == chunk('{"content":"héllo 世界"}', usage=u)
    first = ToolCallDelta(index=1, id="call-1", name="get", arguments="")
    assert enc.encode(first) == chunk(
        '{"tool_calls":[{"index":1,"id":"call-1","type":"function",'
        '"function":{"name":"get","arguments":""}}]}',
        usage=u,
    )
    more = ToolCallDelta(index=1, id=None, name=None, arguments='{"a":')
    assert enc.encode(more) == chunk(
        '{"tool_calls":[{"index":1,"function":{"arguments":"{\\"a\\":"}}]}', usage=u
    )
    assert enc.encode(ToolCallDone(1, "call-1", "get", {}, "{}", True)) == b""
    assert enc.encode(ResponseCancelled("client_gone")) == b""


def test_the_finish_chunk_then_usage_then_done_when_usage_was_asked() -> None:
    enc = encoder(include_usage=True)
    assert enc.encode(Usage(3, 4, reasoning_tokens=1, cached_tokens=2)) == b""
    finish = HEAD + ',"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]'
    usage = (
        HEAD + ',"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7,'
        '"prompt_tokens_details":{"cached_tokens":2},'
        '"completion_tokens_details":{"reasoning_tokens":1}}}'
    )
    expected = f'data: {finish},"usage":null}}\n\ndata: {usage}\n\ndata: [DONE]\n\n'.encode()
    assert enc.encode(ResponseDone("stop")) == expected


def test_no_usage_key_at_all_when_usage_was_not_asked() -> None:
    enc = encoder(include_usage=False)
    enc.encode(Usage(3, 4))
    finish = HEAD + ',"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"length"}]}'
    assert enc.encode(ResponseDone("length")) == f"data: {finish}\n\ndata: [DONE]\n\n".encode()


def test_an_error_event_is_one_openai_error_object() -> None:
    event = ErrorEvent(code="upstream_error", message="vllm went away", retryable=True)
    out = encoder(include_usage=False).encode(event)
    assert out == (
        b'data: {"error":{"message":"vllm went away","type":"server_error",'
        b'"code":"upstream_error"}}\n\n'
    )


def test_an_unknown_event_is_a_type_error_naming_it() -> None:
    with pytest.raises(TypeError, match=r"^unknown event 'not an event'$"):
        encoder(include_usage=False).encode("not an event")  # type: ignore[arg-type]


def test_dumps_is_compact_and_keeps_non_ascii() -> None:
    assert dumps({"a": [1, "é世😀"]}) == '{"a":[1,"é世😀"]}'.encode()


def accumulate(*events: Event) -> dict[str, Any]:
    acc = ResponseAccumulator(completion_id="chatcmpl-2", created=9, model="agent-lite")
    for event in events:
        acc.add(event)
    return acc.result()


def test_a_whole_answer_has_the_exact_openai_shape() -> None:
    body = accumulate(ResponseStarted("p"), TextDelta("hi"), Usage(1, 2), ResponseDone("stop"))
    assert json.loads(dumps(body)) == {
        "id": "chatcmpl-2",
        "object": "chat.completion",
        "created": 9,
        "model": "agent-lite",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "hi", "refusal": None},
                "logprobs": None,
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": 1,
            "completion_tokens": 2,
            "total_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": None},
            "completion_tokens_details": {"reasoning_tokens": None},
        },
    }


def test_an_unfinished_answer_has_no_usage_and_no_finish_reason() -> None:
    body = accumulate(TextDelta("partial"))
    assert "usage" not in body
    assert body["choices"][0]["finish_reason"] is None
    assert body["choices"][0]["message"]["content"] == "partial"


def test_tool_calls_keep_their_raw_arguments_and_mark_invalid_ones() -> None:
    body = accumulate(
        TextDelta("\n\n"),
        ToolCallDone(0, "c0", "f", {"a": 1}, '{"a": 1}', True),
        ToolCallDone(1, "c1", "g", '{"a": ', '{"a": ', False),
        ResponseDone("tool_calls"),
    )
    message = body["choices"][0]["message"]
    assert message["content"] is None
    assert message["tool_calls"] == [
        {"id": "c0", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}},
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "g", "arguments": '{"a": '},
            "arguments_valid": False,
        },
    ]


def test_usage_asked_but_never_reported_sends_no_usage_chunk() -> None:
    enc = encoder(include_usage=True)
    finish = HEAD + ',"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]'
    assert (
        enc.encode(ResponseDone("stop"))
        == f'data: {finish},"usage":null}}\n\ndata: [DONE]\n\n'.encode()
    )
