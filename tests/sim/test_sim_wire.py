"""The wire format against real vLLM 0.32.0 transcripts: byte-exact where the content can be
reproduced, key-structure-exact everywhere."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from trio_gateway.sim.script import Generation, Token, TokenKind
from trio_gateway.sim.wire import ResponseContext, StreamRenderer, completion_body, metrics_text

from .helpers import fixture_events, fixture_json, fixture_text, key_tree, ordered


def tok(kind: TokenKind, text: str = "", tool_index: int = 0) -> Token:
    return Token(kind=kind, text=text, tool_index=tool_index)


HIDDEN = tok("hidden")


def context_like(first: dict[str, Any], **fields: Any) -> ResponseContext:
    values: dict[str, Any] = {
        "response_id": first["id"],
        "created": first["created"],
        "model": first["model"],
        "system_fingerprint": "vllm-0.32.0-0f4fe69a",
        "prompt_tokens": 23,
        "tool_call_ids": (),
    }
    return ResponseContext(**{**values, **fields})


def render(ctx: ResponseContext, generation: Generation) -> list[str]:
    renderer = StreamRenderer(ctx, generation)
    events = b"".join(b"".join(renderer.token(i)) for i in range(len(generation.tokens)))
    return [e.removeprefix(b"data: ").decode() for e in events.split(b"\n\n") if e]


def contents(*texts: str) -> list[Token]:
    return [tok("content", t) for t in texts]


def tool_fragments(name: str, pieces: list[str]) -> list[Token]:
    return [tok("tool_name", name), *(tok("tool_args", p) for p in pieces)]


CITY_X = ['{"', "c", "i", "t", "y", '":', ' "', "x", '"}']

# fixture -> (tokens, finish_reason, context fields); the token texts are the fixture's, the
# hidden tokens stand where vLLM generated a token that showed nothing.
STREAMS: dict[str, tuple[list[Token], str, dict[str, Any]]] = {
    "b_stream_no_stream_options.sse": (
        [HIDDEN, *contents("lse", "\ufffdfa", "et"), HIDDEN, HIDDEN, HIDDEN, HIDDEN],
        "length",
        {},
    ),
    "b_stream_include_usage_false.sse": (
        [HIDDEN, *contents("rld", "hello", "one", "think", "\ufffd\u0016"), HIDDEN, HIDDEN],
        "length",
        {},
    ),
    "b_stream_include_usage_true.sse": (
        [HIDDEN, *contents("six", "the", " four", "\ufffd true", "eather", "are", "fo")],
        "length",
        {"include_usage": True},
    ),
    "b_stream_continuous_usage.sse": (
        [HIDDEN, *contents(" rain", "ew", "true", " stream", "res", "ant"), HIDDEN],
        "length",
        {"include_usage": True, "continuous_usage": True},
    ),
    "reasoning_stream_True.txt": (
        [HIDDEN, tok("reasoning", "abc"), HIDDEN, *contents("hello"), HIDDEN],
        "stop",
        {},
    ),
    "toolcall_nothink_stream_True.txt": (
        [HIDDEN, *tool_fragments("get_weather", CITY_X), HIDDEN],
        "tool_calls",
        {"tool_call_ids": ("chatcmpl-tool-a9ea1301bfc8a0dd",)},
    ),
    "reasoning_then_toolcall_stream_True.txt": (
        [
            tok("reasoning", "<think>"),
            tok("reasoning", "abc"),
            HIDDEN,
            *contents("\n", "\n"),
            *tool_fragments("get_weather", CITY_X),
            HIDDEN,
        ],
        "tool_calls",
        {"tool_call_ids": ("chatcmpl-tool-8c49d1608518edbc",)},
    ),
}


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_streams_match_real_vllm_byte_for_byte(name: str) -> None:
    expected = fixture_events(name)
    tokens, finish, fields = STREAMS[name]
    ctx = context_like(json.loads(expected[0]), **fields)
    generation = Generation(tokens=tuple(tokens), finish_reason=finish)  # type: ignore[arg-type]
    assert render(ctx, generation) == expected


def test_stream_ends_without_usage_unless_asked() -> None:
    first = json.loads(fixture_events("b_stream_no_stream_options.sse")[0])
    generation = Generation(tokens=(tok("content", "a"), HIDDEN), finish_reason="stop")
    plain = render(context_like(first), generation)
    assert [json.loads(e)["choices"] for e in plain[:-1]][-1][0]["finish_reason"] == "stop"
    assert plain[-1] == "[DONE]"
    assert not any('"usage"' in e for e in plain)
    with_usage = render(context_like(first, include_usage=True), generation)
    usage = json.loads(with_usage[-2])
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 2


def test_every_chunk_has_the_fixture_key_structure() -> None:
    # The abort transcript is the longest plain stream: the first chunk and a token chunk.
    real = [json.loads(e) for e in fixture_events("e_abort_after_20_chunks.sse")]
    tokens = (tok("content", "x"), tok("content", "y"), HIDDEN)
    generation = Generation(tokens=tokens, finish_reason="stop")
    ours = [json.loads(e) for e in render(context_like(real[0]), generation)[:-1]]
    assert key_tree(ours[0]) == key_tree(real[0])
    assert key_tree(ours[1]) == key_tree(real[1])


NON_STREAM: dict[str, tuple[list[Token], str, dict[str, Any]]] = {
    "a_nonstream_thinking_True.json": (
        [
            tok(
                "reasoning",
                "lse\ufffdnhefaet\ufffd\ufffd\ufffdsixthe four\ufffd "
                "trueeatherareforldhelloonethink",
            ),
            *[tok("reasoning", "")] * 19,
        ],
        "length",
        {"prompt_tokens": 17},
    ),
    "a_nonstream_thinking_False.json": (
        [
            tok(
                "content",
                "\ufffd\u0016six rainewtrue streamresant\ufffdassistantde\u0005"
                "<tool_call> answer\n fox cloud",
            ),
            *[HIDDEN] * 19,
        ],
        "length",
        {"prompt_tokens": 23},
    ),
    "c_user_store_metadata.json": (
        [tok("content", "gh^ s\ufffdunction"), *[HIDDEN] * 4],
        "length",
        {"prompt_tokens": 23},
    ),
    "toolcall_nothink_stream_False.txt": (
        [*tool_fragments("get_weather", CITY_X), *[HIDDEN] * 35],
        "tool_calls",
        {"prompt_tokens": 302, "tool_call_ids": ("chatcmpl-tool-a1303f3ba7469706",)},
    ),
}


@pytest.mark.parametrize("name", sorted(NON_STREAM))
def test_non_stream_bodies_match_real_vllm(name: str) -> None:
    expected = fixture_json(name)
    tokens, finish, fields = NON_STREAM[name]
    ctx = context_like(expected, system_fingerprint=expected["system_fingerprint"], **fields)
    generation = Generation(tokens=tuple(tokens), finish_reason=finish)  # type: ignore[arg-type]
    body = completion_body(ctx, generation, len(tokens))
    assert ordered(body) == ordered(expected)


def test_metrics_carry_the_real_series_names_and_labels() -> None:
    real = fixture_text("metrics_after_e.txt")[1]
    ours = metrics_text("qwen3-32b", {"vllm:num_requests_running": 4, "success:length": 2})
    series = re.compile(r"^(vllm:[a-z_]+\{[^}]*\}) ", re.MULTILINE)
    ours_series = set(series.findall(ours))
    assert ours_series <= set(series.findall(real))
    assert 'vllm:num_requests_running{engine="0",model_name="qwen3-32b"} 4.0' in ours
    for name in (
        "vllm:num_requests_waiting",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:prompt_tokens_total",
        "vllm:generation_tokens_total",
        "vllm:kv_cache_usage_perc",
    ):
        assert f"# TYPE {name} " in ours
        assert f'{name}{{engine="0",model_name="qwen3-32b"}} 0.0' in ours
