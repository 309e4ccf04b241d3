"""The official openai SDK as the client: sync (in a thread) and async, stream and not."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
import trio
from openai import AsyncOpenAI, OpenAI

from tests.e2e.harness import Stack, script, wait_until

TOOLS: Any = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]
TOOL_SCRIPT = script(
    {"reasoning": "I should look it up"},
    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
)


def user(content: str) -> Any:
    return [{"role": "user", "content": content}]


async def test_async_sdk_streams_text_reasoning_and_usage(stack: Stack) -> None:
    client = AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="agent-lite",
        messages=user(script({"reasoning": "think 思考"}, {"text": "Hello 世界 🌍"})),
        stream=True,
        stream_options={"include_usage": True},
    )
    text, reasoning, usage, finish = [], [], None, None
    async for chunk in stream:
        assert chunk.model == "agent-lite"
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text.append(choice.delta.content or "")
            reasoning.append(getattr(choice.delta, "reasoning_content", None) or "")
            finish = choice.finish_reason or finish
    assert "".join(text).strip() == "Hello 世界 🌍"
    assert "".join(reasoning) == "think 思考"
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0
    await client.close()


async def test_async_sdk_tool_call_non_stream(stack: Stack) -> None:
    client = AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    completion = await client.chat.completions.create(
        model="agent-lite", messages=user(TOOL_SCRIPT), tools=TOOLS
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    call: Any = choice.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert completion.usage is not None and completion.usage.total_tokens > 0
    await client.close()


async def test_async_sdk_errors_are_typed(stack: Stack) -> None:
    client = AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="nope", messages=user("x"))
    assert missing.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as too_long:
        await client.chat.completions.create(model="agent-lite", messages=user("w " * 5000))
    assert too_long.value.code == "context_length_exceeded"
    await client.close()


async def test_models_list_and_retrieve(stack: Stack) -> None:
    client = AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    listed = [model.id async for model in client.models.list()]
    assert "agent-lite" in listed
    model = await client.models.retrieve("agent-lite")
    assert (model.id, model.object, model.owned_by) == ("agent-lite", "model", "trio-gateway")
    with pytest.raises(openai.NotFoundError) as missing:
        await client.models.retrieve("nope")
    assert missing.value.code == "model_not_found"
    await client.close()


async def test_async_sdk_mid_stream_error_raises(stack: Stack) -> None:
    client = AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="agent-lite", messages=user(script({"text": "a b"}, {"drop": True})), stream=True
    )
    with pytest.raises(openai.APIError, match=r"connection lost|closed the stream"):
        async for _ in stream:
            pass
    await client.close()


def sync_session(base_url: str) -> dict[str, Any]:
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    whole = client.chat.completions.create(
        model="agent-lite", messages=user(script({"text": "plain answer"})), reasoning_effort="none"
    )
    pieces = []
    with client.chat.completions.create(
        model="agent-lite", messages=user(TOOL_SCRIPT), tools=TOOLS, stream=True
    ) as stream:
        for chunk in stream:
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or []:
                    if call.function and call.function.arguments:
                        pieces.append(call.function.arguments)
    return {"whole": whole.choices[0].message.content, "args": "".join(pieces)}


async def test_sync_sdk(stack: Stack) -> None:
    result = await trio.to_thread.run_sync(sync_session, stack.v1)
    assert result["whole"] == "plain answer"
    assert json.loads(result["args"]) == {"city": "Paris"}


def readme_streams(base_url: str, count: int) -> int:
    """The README's snippet, ``count`` times: each stream read to its end. Returns how many
    ended with a finish_reason."""
    client = OpenAI(base_url=base_url, api_key="unused", max_retries=0)
    finished = 0
    for _ in range(count):
        finish = None
        for chunk in client.chat.completions.create(
            model="agent-lite", messages=user(script({"text": "Hello there."})), stream=True
        ):
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        finished += finish is not None
    client.close()
    return finished


async def test_streams_the_sync_sdk_reads_to_the_end_are_recorded_completed(stack: Stack) -> None:
    """The sync SDK closes its connection on ``[DONE]`` without reading the body's last chunk:
    that close is no cancellation (it was one for 3 to 30 of 100 before)."""
    finished = await trio.to_thread.run_sync(readme_streams, stack.v1, 100)
    assert finished == 100
    await wait_until(lambda: stack.gateway.app.open_requests == 0)
    registry = stack.gateway.router.metrics.registry
    cancelled = registry.get_sample_value("gateway_cancellations_total", {"cause": "client_gone"})
    completed = registry.get_sample_value(
        "gateway_requests_total",
        {"alias": "agent-lite", "provider": "sim-a", "outcome": "ok", "code": ""},
    )
    assert (cancelled or 0.0, completed) == (0.0, 100.0)
