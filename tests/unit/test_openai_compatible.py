"""The openai_compatible provider's pure parts, against real vLLM transcripts."""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_gateway.config.schema import ProviderConfig
from trio_gateway.core.capability import Capability
from trio_gateway.core.errors import ContextLengthExceeded, GatewayError, UpstreamProtocolError
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
from trio_gateway.core.request import parse_chat_request
from trio_gateway.core.sse import SSEDecoder
from trio_gateway.providers.openai_compatible.dialect import (
    ChunkParser,
    OpenAICompatibleDialect,
    build_body,
)

from .fixtures import transcript

PROVIDER = ProviderConfig(
    name="vllm-a",
    type="openai_compatible",
    base_url="http://127.0.0.1:8000/v1",
    model="qwen3-32b",
    capabilities=frozenset({Capability.REASONING, Capability.TOOLS}),
)


def parse_stream(raw: bytes) -> list[Event]:
    decoder = SSEDecoder()
    parser = ChunkParser("vllm-a")
    events: list[Event] = []
    for sse in decoder.feed(raw) + decoder.close():
        events += parser.feed_data(sse.data)
    return events + parser.close()


def kinds(events: list[Event]) -> list[str]:
    return [type(e).__name__ for e in events]


def test_usage_chunk_becomes_usage_event() -> None:
    _, raw = transcript("b_stream_include_usage_true.sse")
    events = parse_stream(raw)
    assert events[0] == ResponseStarted("vllm-a")
    assert "".join(e.text for e in events if isinstance(e, TextDelta)) == (
        "sixthe four\ufffd trueeatherarefo"
    )
    assert events[-2:] == [
        Usage(prompt_tokens=23, completion_tokens=8, reasoning_tokens=0, cached_tokens=None),
        ResponseDone("length"),
    ]


def test_no_usage_without_include_usage() -> None:
    _, raw = transcript("b_stream_no_stream_options.sse")
    events = parse_stream(raw)
    assert not any(isinstance(e, Usage) for e in events)
    assert events[-1] == ResponseDone("length")


def test_continuous_usage_only_the_closing_total_counts() -> None:
    _, raw = transcript("b_stream_continuous_usage.sse")
    usages = [e for e in parse_stream(raw) if isinstance(e, Usage)]
    assert usages == [Usage(23, 8, 0, None)]


def test_reasoning_field_becomes_reasoning_delta() -> None:
    _, raw = transcript("reasoning_stream_True.txt")
    assert parse_stream(raw) == [
        ResponseStarted("vllm-a"),
        ReasoningDelta("abc"),
        TextDelta("hello"),
        ResponseDone("stop"),
    ]


def test_older_reasoning_content_name_is_accepted() -> None:
    parser = ChunkParser("p")
    chunk = {"choices": [{"index": 0, "delta": {"reasoning_content": "hm"}}]}
    assert parser.feed_data(json.dumps(chunk).encode())[1:] == [ReasoningDelta("hm")]


def test_tool_call_fragments_pass_through_and_assemble_at_finish() -> None:
    _, raw = transcript("reasoning_then_toolcall_stream_True.txt")
    events = parse_stream(raw)
    deltas = [e for e in events if isinstance(e, ToolCallDelta)]
    assert deltas[0].id == "chatcmpl-tool-8c49d1608518edbc"
    assert deltas[0].name == "get_weather"
    assert "".join(d.arguments for d in deltas) == '{"city": "x"}'
    [done] = [e for e in events if isinstance(e, ToolCallDone)]
    assert done.arguments == {"city": "x"} and done.arguments_valid
    # Done comes after every fragment and before the end.
    assert kinds(events)[-2:] == ["ToolCallDone", "ResponseDone"]
    assert events[-1] == ResponseDone("tool_calls")


def test_stream_cut_before_finish_is_a_protocol_error() -> None:
    _, raw = transcript("e_abort_after_20_chunks.sse")
    with pytest.raises(UpstreamProtocolError, match="before the answer finished"):
        parse_stream(raw)


def test_inband_error_chunk_is_classified() -> None:
    parser = ChunkParser("p")
    body = {"error": {"message": "maximum context length is 10 tokens", "code": 400}}
    with pytest.raises(ContextLengthExceeded):
        parser.feed_data(json.dumps(body).encode())


@pytest.mark.parametrize("data", [b"{not json", b"[1, 2]"])
def test_garbage_chunks_are_protocol_errors(data: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        ChunkParser("p").feed_data(data)


def request(**fields: Any) -> Any:
    body = {"model": "agent-lite", "messages": [{"role": "user", "content": "hi"}], **fields}
    return parse_chat_request(json.dumps(body).encode())


def test_build_body_rewrites_model_and_always_asks_for_usage() -> None:
    body = build_body(request(stream=False, temperature=0.2, top_k=5), PROVIDER)
    assert body["model"] == "qwen3-32b"
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["temperature"] == 0.2 and body["top_k"] == 5  # vLLM extensions pass


def test_build_body_strips_ignored_and_gateway_fields() -> None:
    body = build_body(
        request(store=True, metadata={"k": "v"}, user="u1", reasoning=True, seed=1), PROVIDER
    )
    assert not {"store", "metadata", "user", "reasoning", "reasoning_effort"} & body.keys()
    assert body["seed"] == 1
    extra = ProviderConfig(
        name="p",
        type="openai_compatible",
        base_url="http://x/v1",
        model="m",
        strip_fields=("seed",),
    )
    assert "seed" not in build_body(request(seed=1), extra)


@pytest.mark.parametrize(
    ("fields", "template"),
    [
        ({"reasoning": False}, {"enable_thinking": False}),
        ({"reasoning_effort": "none"}, {"enable_thinking": False}),
        ({"reasoning_effort": "high"}, {"enable_thinking": True}),
        (
            {"reasoning": False, "chat_template_kwargs": {"custom": 1}},
            {"custom": 1, "enable_thinking": False},
        ),
        ({}, None),
    ],
)
def test_reasoning_switch_becomes_enable_thinking(
    fields: dict[str, Any], template: dict[str, Any] | None
) -> None:
    body = build_body(request(**fields), PROVIDER)
    assert body.get("chat_template_kwargs") == template


def test_reasoning_switch_is_not_sent_to_providers_without_reasoning() -> None:
    plain = ProviderConfig(name="p", type="openai_compatible", base_url="http://x/v1", model="m")
    assert "chat_template_kwargs" not in build_body(request(reasoning=False), plain)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                [
                    "choices",
                    "delta",
                    "content",
                    "reasoning",
                    "reasoning_content",
                    "tool_calls",
                    "function",
                    "name",
                    "arguments",
                    "index",
                    "id",
                    "finish_reason",
                    "usage",
                    "prompt_tokens",
                    "error",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=400, deadline=None)
@given(chunks=st.lists(JSON, max_size=4))
def test_any_chunk_gives_events_or_the_one_upstream_error(chunks: list[Any]) -> None:
    """Whatever an upstream sends, the parser answers with events or a GatewayError (which
    the client sees as an error), never with a crash."""
    parser = ChunkParser("p")
    try:
        for chunk in chunks:
            parser.feed_data(json.dumps(chunk).encode())
        parser.feed_data(b"[DONE]")
    except GatewayError:
        pass


@pytest.mark.parametrize(
    "chunk",
    [
        {"choices": {"0": {}}},
        {"choices": ["x"]},
        {"choices": [{"delta": ["x"]}]},
        {"choices": [{"delta": {"content": 123}}]},
        {"choices": [{"delta": {"tool_calls": {"index": 0}}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": -1}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"index": 10**9}]}}]},
        {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": 7}}]}}]},
        {"choices": [{"finish_reason": 1}]},
    ],
)
def test_malformed_chunks_are_protocol_errors(chunk: dict[str, Any]) -> None:
    with pytest.raises(UpstreamProtocolError, match="malformed chunk"):
        ChunkParser("p").feed_data(json.dumps(chunk).encode())


def test_an_output_limit_above_the_providers_max_output_tokens_is_lowered_to_it() -> None:
    """vLLM refuses max_tokens over its max_model_len; an agent asks 32000 on every turn."""
    capped = attrs.evolve(PROVIDER, max_output_tokens=4096)
    assert build_body(request(max_tokens=32000), capped)["max_tokens"] == 4096
    both = build_body(request(max_tokens=32000, max_completion_tokens=9000), capped)
    assert (both["max_tokens"], both["max_completion_tokens"]) == (4096, 4096)
    assert build_body(request(max_tokens=100), capped)["max_tokens"] == 100
    # Without the setting the limit goes as the client gave it (vLLM's own context is unknown).
    assert build_body(request(max_tokens=32000), PROVIDER)["max_tokens"] == 32000
    dialect = OpenAICompatibleDialect()
    assert dialect.max_output_tokens(request(max_tokens=32000), capped) == 4096


def test_vllms_stop_reason_names_the_stop_sequence() -> None:
    def answer(stop_reason: object, finish: str = "stop") -> Event:
        chunks = [
            {"choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]},
            {
                "choices": [
                    {"index": 0, "delta": {}, "finish_reason": finish, "stop_reason": stop_reason}
                ]
            },
        ]
        raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
        return parse_stream(raw + b"data: [DONE]\n\n")[-1]

    assert answer("END") == ResponseDone(finish_reason="stop", stop_sequence="END")
    assert answer(None) == ResponseDone(finish_reason="stop")
    assert answer(151645) == ResponseDone(finish_reason="stop")  # a stop token's id
    assert answer("END", "length") == ResponseDone(finish_reason="length")
