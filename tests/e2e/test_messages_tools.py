"""Agents on ``/v1/messages``: tools, images, and a three-step tool loop with thinking on, the
``anthropic`` SDK as the client, against the simulator as vLLM (Qwen3-like reasoning, nothing
signed), as Anthropic (signed thinking blocks, which it refuses changed or missing mid loop)
and as Gemini 3 (thought signatures on function calls, refused when missing)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import pytest

from tests.e2e.harness import Stack, script
from tests.e2e.test_cloud_providers import PIXEL, Fleet, fleet, only
from tests.e2e.test_thinking_tool_loop import QUESTION, STEPS, vendor_fleet
from trio_gateway.fronts.messages.events import decode_signature

WEATHER: Any = {
    "name": "get_weather",
    "description": "Weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = script(
    {"reasoning": "I should look it up"},
    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
)


def client_of(base_url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key="unused", max_retries=0)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_tool_call_is_a_tool_use_block(stack: Stack, stream: bool) -> None:
    client = client_of(stack.gateway.base_url)
    kwargs: Any = {
        "model": "agent-lite",
        "max_tokens": 300,
        "tools": [WEATHER],
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "messages": [{"role": "user", "content": CALL}],
        "thinking": {"type": "adaptive"},
    }
    if stream:
        deltas: list[str] = []
        async with client.messages.stream(**kwargs) as events:
            async for event in events:
                if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                    deltas.append(event.delta.partial_json)
            message = await events.get_final_message()
        assert json.loads("".join(deltas)) == {"city": "Paris"}
    else:
        message = await client.messages.create(**kwargs)
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    call: Any = message.content[1]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
    sent = (await stack.sim_stats())["last_request_body"]
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather in a city",
                "parameters": WEATHER["input_schema"],
            },
        }
    ]
    assert sent["tool_choice"] == "auto" and sent["parallel_tool_calls"] is False
    await client.close()


PARIS, LYON = {"city": "P"}, {"city": "L"}


async def test_tool_choice_kinds_and_tool_results(stack: Stack) -> None:
    client = client_of(stack.gateway.base_url)
    history: Any = [
        {"role": "user", "content": "weather?"},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": PARIS},
                {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": LYON},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": [{"type": "text", "text": "no such city"}],
                },
                {"type": "text", "text": script({"text": "done"})},
            ],
        },
    ]
    expected = {
        "auto": "auto",
        "any": "required",
        "none": "none",
        "tool": {"type": "function", "function": {"name": "get_weather"}},
    }
    for kind, chat_choice in expected.items():
        choice: Any = {"type": kind} | ({"name": "get_weather"} if kind == "tool" else {})
        await client.messages.create(
            model="agent-lite", max_tokens=50, tools=[WEATHER], tool_choice=choice, messages=history
        )
        sent = (await stack.sim_stats())["last_request_body"]
        assert sent["tool_choice"] == chat_choice, kind
    messages = sent["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "user"]
    assert messages[1]["content"] == "Let me look."
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["toolu_1", "toolu_2"]
    assert json.loads(messages[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "P"}
    assert messages[2] == {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"}
    assert messages[3]["content"] == "Error: no such city"
    await client.close()


async def test_images_base64_and_url_become_image_parts() -> None:
    async with fleet(only("anthropic")) as f:
        client = client_of(f.gateway.base_url)
        media, data = PIXEL.removeprefix("data:").split(";base64,")
        content: Any = [
            {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}},
            {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
            {"type": "text", "text": script({"text": "a pixel"})},
        ]
        message = await client.messages.create(
            model="agent-lite", max_tokens=50, messages=[{"role": "user", "content": content}]
        )
        assert message.content[0].type == "text" and message.content[0].text == "a pixel"
        sent = await f.last_body("anthropic")
        blocks = sent["messages"][0]["content"]
        assert blocks[0]["source"] == {"type": "base64", "media_type": media, "data": data}
        assert blocks[1]["source"] == {"type": "url", "url": "https://example.com/a.png"}
        await client.close()


# --- the tool loop with thinking ---------------------------------------------------------------


def thinking_sent(vendor: str, body: dict[str, Any]) -> bool:
    if vendor == "vllm":
        return bool(body.get("chat_template_kwargs", {}).get("enable_thinking") is True)
    if vendor == "anthropic":
        return bool(body.get("thinking", {}).get("type") == "enabled")
    config = body["generationConfig"]["thinkingConfig"]
    return bool(config.get("thinkingLevel") or config.get("thinkingBudget"))


def replayed(vendor: str, body: dict[str, Any]) -> Any:
    """What the vendor got back of the assistant's last turn: its thinking, or its signature."""
    if vendor == "anthropic":
        turn = body["messages"][-2]
        assert turn["role"] == "assistant"
        return turn["content"][0]
    turn = body["contents"][-2]
    call = next(part for part in turn["parts"] if "functionCall" in part)
    return call.get("thoughtSignature")


def expected(vendor: str, message: Any) -> Any:
    thinking = [b for b in message.content if b.type == "thinking"]
    assert thinking, "the answer has no thinking block"
    block = thinking[-1]
    if vendor == "anthropic":
        assert block.thinking == "I should look it up" and block.signature
        return {"type": "thinking", "thinking": block.thinking, "signature": block.signature}
    entry = decode_signature(block.signature)
    assert entry is not None and entry["format"] == "google-gemini-v1"
    call = next(b for b in message.content if b.type == "tool_use")
    assert entry["id"] == call.id  # the signature of the call it was sent on
    return entry["data"]


async def ask(client: anthropic.AsyncAnthropic, messages: list[Any], *, stream: bool) -> Any:
    kwargs: Any = {
        "model": "agent-lite",
        "max_tokens": 4096,
        "tools": [WEATHER],
        "thinking": {"type": "enabled", "budget_tokens": 2048},
        "messages": messages,
    }
    if not stream:
        return await client.messages.create(**kwargs)
    async with client.messages.stream(**kwargs) as events:
        return await events.get_final_message()


async def run_loop(f: Fleet, vendor: str, *, stream: bool) -> None:
    client = client_of(f.gateway.base_url)
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    previous: Any = None
    for step in range(STEPS):
        message = await ask(client, messages, stream=stream)
        assert message.stop_reason == "tool_use", step
        sent = await f.last_body(vendor)
        assert thinking_sent(vendor, sent), f"step {step}: thinking was off"
        if previous is not None and vendor != "vllm":
            assert replayed(vendor, sent) == expected(vendor, previous), f"step {step}"
        if vendor == "vllm":
            assert [b.type for b in message.content] == ["thinking", "tool_use"]
        previous = message
        # As the SDK's docs do it: the content blocks as they came.
        messages.append({"role": "assistant", "content": message.content})
        call = next(b for b in message.content if b.type == "tool_use")
        result = {"type": "tool_result", "tool_use_id": call.id, "content": "18C"}
        messages.append({"role": "user", "content": [result]})
    assert f.sims[vendor].engine.stats().requests == STEPS
    await client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("vendor", ["vllm", "anthropic", "gemini"])
async def test_a_three_step_tool_loop_keeps_thinking_on(vendor: str, stream: bool) -> None:
    async with vendor_fleet(vendor) as f:
        await run_loop(f, vendor, stream=stream)
