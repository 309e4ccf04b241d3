"""The gateway in front of a real vLLM 0.32 (CPU, tiny random Qwen3): what issue 3 asks of its
answers: streams and usage, reasoning, tool calls, errors. What vLLM's own counters show of the
gateway (aborts, queues, /load, billing): test_gateway_vllm_engine.py.

Each test runs the gateway in-process on a free port with one provider, `vllm`, pointing at the
session's real server (tests/vllm/helpers.py), and talks to it with the official openai SDK or
raw httpx. The tiny model never stops by itself (unforced answers run to max_tokens) and writes
exactly what a `structured_outputs.regex` spells, `<think>` / `<tool_call>` included, so vLLM's
reasoning and tool parsers see what a real Qwen3 writes (see test_vllm_raw.py). The regex is a
vLLM extension field: that the forced shapes come out proves the gateway passes it untouched.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from tests.e2e.harness import wait_until
from tests.vllm.helpers import (
    ALIAS,
    PROVIDER,
    TOOL_CALL_RE,
    WEATHER_TOOL,
    Json,
    chat,
    chunks_of,
    messages,
    post,
)
from tests.vllm.vllm_server import VllmServer
from tests.vllm.wire_shape import kinds_of
from trio_gateway.process.serve import GatewayHandle

pytestmark = pytest.mark.vllm

REASONING_RE = "<think>abc</think>\n\nhello"
TOO_LONG = "hello world weather " * 300  # 2400 tokens for the tiny model's tokenizer


def regex(pattern: str) -> Json:
    """vLLM's structured outputs: the tiny model writes exactly this (temperature 0)."""
    return {"structured_outputs": {"regex": pattern}}


@pytest.fixture
async def sdk(gateway: GatewayHandle) -> AsyncIterator[AsyncOpenAI]:
    client = AsyncOpenAI(base_url=gateway.base_url + "/v1", api_key="unused", max_retries=0)
    yield client
    await client.close()


def joined(chunks: list[Json], key: str) -> str:
    return "".join(c["choices"][0]["delta"].get(key) or "" for c in chunks if c["choices"])


def gateway_tokens(gateway: GatewayHandle, kind: str) -> float:
    """The gateway's token counter (as on its /metrics), read in-process."""
    labels = {"alias": ALIAS, "provider": PROVIDER, "kind": kind}
    value = gateway.router.metrics.registry.get_sample_value("gateway_tokens_total", labels)
    return value or 0.0


async def tokens_counted(gateway: GatewayHandle, kind: str, *, since: float) -> float:
    """Wait until the gateway counted tokens beyond `since`; return how many more."""
    await wait_until(lambda: gateway_tokens(gateway, kind) > since)
    return gateway_tokens(gateway, kind) - since


# --- streaming, usage ------------------------------------------------------------------------


async def test_sdk_stream_forwards_the_usage_chunk_when_asked(sdk: AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model=ALIAS,
        messages=messages(),
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"reasoning": False},
    )
    chunks = [chunk async for chunk in stream]
    *answer, last = chunks
    assert last.choices == [] and last.usage is not None
    assert last.usage.completion_tokens == 8  # the tiny model runs to max_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + 8
    assert all(c.usage is None for c in answer), "exactly one usage chunk, the last"
    assert all(c.model == ALIAS for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in answer)
    assert text, "thinking is off: the answer is content"
    assert [c.choices[0].finish_reason for c in answer if c.choices[0].finish_reason] == ["length"]


async def test_stream_without_include_usage_has_no_usage_but_the_gateway_counted_it(
    gw: httpx.AsyncClient, gateway: GatewayHandle
) -> None:
    """The gateway always asks vLLM for usage; the client that did not ask never sees it."""
    no_usage: list[Json] = [{}, {"stream_options": {"include_usage": False}}]
    for options in no_usage:
        before = gateway_tokens(gateway, "completion")
        body = chat(max_tokens=8, temperature=0, stream=True, reasoning=False, **options)
        transcript = await post(gw, body)
        chunks = chunks_of(transcript)
        assert kinds_of(transcript.events or ()) == ("role", "content", "finish", "done")
        assert not any("usage" in c for c in chunks)
        # vLLM sends usage in a stream only when asked: the gateway asked, and counts it
        # once the request is over (just after the client got [DONE]).
        assert await tokens_counted(gateway, "completion", since=before) == 8


async def test_raw_stream_wire_with_usage(gw: httpx.AsyncClient) -> None:
    transcript = await post(
        gw,
        chat(max_tokens=8, stream=True, stream_options={"include_usage": True}),
    )
    chunks = chunks_of(transcript)
    assert transcript.media_type == "text/event-stream"
    # Thinking on (vLLM's default): all of it is reasoning, renamed for the OpenAI front.
    assert kinds_of(transcript.events or ()) == ("role", "reasoning", "finish", "usage", "done")
    assert not any("reasoning" in c["choices"][0]["delta"] for c in chunks if c["choices"])
    usage = chunks[-1]["usage"]
    assert usage["completion_tokens"] == 8
    assert type(usage["completion_tokens_details"]["reasoning_tokens"]) is int
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("chatcmpl-")


async def test_non_stream_is_assembled_from_the_upstream_stream(sdk: AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(
        model=ALIAS, messages=messages(), max_tokens=8, temperature=0
    )
    choice = completion.choices[0]
    assert completion.model == ALIAS and completion.object == "chat.completion"
    assert choice.finish_reason == "length"
    assert choice.message.content is None  # thinking on: everything was reasoning
    reasoning = getattr(choice.message, "reasoning_content", None)
    assert isinstance(reasoning, str) and reasoning
    # Usage on a non-stream answer built from a stream: only there because the gateway
    # asked vLLM for it (stream_options.include_usage upstream).
    assert completion.usage is not None and completion.usage.completion_tokens == 8


# --- reasoning ---------------------------------------------------------------------------


async def test_reasoning_is_split_from_content(sdk: AsyncOpenAI, gw: httpx.AsyncClient) -> None:
    stream = await sdk.chat.completions.create(
        model=ALIAS,
        messages=messages(),
        max_tokens=60,
        temperature=0,
        stream=True,
        extra_body=regex(REASONING_RE),
    )
    reasoning, content = [], []
    async for chunk in stream:
        for choice in chunk.choices:
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            content.append(choice.delta.content or "")
    assert "".join(reasoning) == "abc"
    assert "".join(content).strip() == "hello"
    # On the wire: every reasoning delta before the first content delta.
    transcript = await post(
        gw, chat(max_tokens=60, temperature=0, stream=True, **regex(REASONING_RE))
    )
    assert kinds_of(transcript.events or ()) == ("role", "reasoning", "content", "finish", "done")

    completion = await sdk.chat.completions.create(
        model=ALIAS,
        messages=messages(),
        max_tokens=60,
        temperature=0,
        extra_body=regex(REASONING_RE),
    )
    message = completion.choices[0].message
    assert getattr(message, "reasoning_content", None) == "abc"
    assert (message.content or "").strip() == "hello"
    assert completion.choices[0].finish_reason == "stop"


@pytest.mark.parametrize("switch", [{"reasoning": False}, {"reasoning_effort": "none"}])
async def test_thinking_switched_off(
    switch: Json, gw: httpx.AsyncClient, vllm_server: VllmServer
) -> None:
    transcript = await post(gw, chat(max_tokens=8, temperature=0, **switch))
    assert transcript.status == 200, transcript.text
    body = transcript.body
    message = body["choices"][0]["message"]
    assert "reasoning_content" not in message and isinstance(message["content"], str)
    assert body["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    # The switch reached vLLM as chat_template_kwargs.enable_thinking=false: the prompt is the
    # one vLLM renders with the empty think block pre-filled, token for token.
    async with httpx.AsyncClient(
        base_url=vllm_server.base_url, headers=vllm_server.auth_headers, timeout=60
    ) as direct:

        async def prompt_tokens(thinking: bool) -> int:
            resp = await direct.post(
                "/chat/completions",
                json={
                    "model": vllm_server.served_model_name,
                    "messages": messages(),
                    "max_tokens": 1,
                    "chat_template_kwargs": {"enable_thinking": thinking},
                },
            )
            tokens: int = resp.json()["usage"]["prompt_tokens"]
            return tokens

        off, on = await prompt_tokens(False), await prompt_tokens(True)
    assert off != on
    assert body["usage"]["prompt_tokens"] == off


# --- tool calls --------------------------------------------------------------------------


async def test_tool_call_fragments_stream_through(sdk: AsyncOpenAI) -> None:
    stream = await sdk.chat.completions.create(
        model=ALIAS,
        messages=messages(),
        max_tokens=60,
        temperature=0,
        stream=True,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        reasoning_effort="none",
        extra_body=regex(TOOL_CALL_RE),
    )
    fragments: list[Any] = []
    finish = None
    async for chunk in stream:
        for choice in chunk.choices:
            fragments.extend(choice.delta.tool_calls or [])
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert len(fragments) >= 3, "fragments are relayed as they come, not buffered"
    first, rest = fragments[0], fragments[1:]
    assert first.id.startswith("chatcmpl-tool-") and first.type == "function"
    assert first.index == 0 and first.function.name == "get_weather"
    assert all(f.index == 0 and f.id is None and f.function.name is None for f in rest)
    arguments = (first.function.arguments or "") + "".join(f.function.arguments for f in rest)
    assert json.loads(arguments) == {"city": "x"}


async def test_tool_call_non_stream_is_assembled(sdk: AsyncOpenAI) -> None:
    completion = await sdk.chat.completions.create(
        model=ALIAS,
        messages=messages(),
        max_tokens=60,
        temperature=0,
        tools=[WEATHER_TOOL],
        tool_choice="auto",
        reasoning_effort="none",
        extra_body=regex(TOOL_CALL_RE),
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    assert choice.message.tool_calls is not None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("chatcmpl-tool-") and call.type == "function"
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "x"}


async def test_reasoning_then_tool_call(gw: httpx.AsyncClient) -> None:
    # Thinking first, then the call: reasoning deltas, the "\n\n" Qwen3 writes after
    # </think> as content, then the call's fragments.
    body = chat(
        max_tokens=80,
        temperature=0,
        stream=True,
        tools=[WEATHER_TOOL],
        **regex("<think>abc</think>\n\n" + TOOL_CALL_RE),
    )
    transcript = await post(gw, body)
    chunks = chunks_of(transcript)
    assert kinds_of(transcript.events or ()) == (
        *("role", "reasoning", "content", "tool_first", "tool_args", "finish", "done"),
    )
    assert joined(chunks, "reasoning_content") == "abc"
    # Not streamed: the whitespace before the call is no content, as in vLLM's own answer.
    whole = await gw.post("/v1/chat/completions", json={**body, "stream": False})
    message = whole.json()["choices"][0]["message"]
    assert message["content"] is None
    assert message["reasoning_content"] == "abc"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"city": "x"}


# --- errors ------------------------------------------------------------------------------


async def test_context_length_exceeded(sdk: AsyncOpenAI, gw: httpx.AsyncClient) -> None:
    """vLLM says 400 BadRequestError param input_tokens; the client gets one error code."""
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as raised:
            await sdk.chat.completions.create(
                model=ALIAS, messages=messages(TOO_LONG), max_tokens=10, stream=stream
            )
        assert raised.value.code == "context_length_exceeded"
        transcript = await post(gw, chat(TOO_LONG, max_tokens=10, stream=stream))
        assert transcript.status == 400 and transcript.media_type == "application/json"
        error = transcript.body["error"]
        assert set(error) == {"message", "type", "code", "param", "provider"}
        assert error["code"] == "context_length_exceeded"
        assert error["type"] == "invalid_request_error"
        assert error["param"] == "input_tokens" and error["provider"] == PROVIDER
        assert "maximum context length is 2048 tokens" in error["message"]


async def test_max_tokens_over_the_model_length_is_an_invalid_request(
    gw: httpx.AsyncClient,
) -> None:
    transcript = await post(gw, chat(max_tokens=3000))
    assert transcript.status == 400
    error = transcript.body["error"]
    assert error["code"] == "invalid_request" and error["param"] == "max_tokens"
    assert "max_model_len=2048" in error["message"] and error["provider"] == PROVIDER
