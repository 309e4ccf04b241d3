"""Output filters keep the order of an answer's parts (issue 40, item 3): a field's held-back
text goes out as soon as that field cannot go on, so reasoning that ends in the first letters of
a pattern ("look u" + "p", "p" held for "project-falcon") still comes before the tool call that
follows it, on the chat stream and on ``/v1/messages`` (whose clients refuse a thinking block
after a ``tool_use``)."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
from anthropic.types import ToolParam

from tests.e2e.harness import Stack, chat, script
from tests.e2e.test_filters import TIMEOUT_S, TOOLS, payloads, stack
from tests.e2e.test_filters_agent_fronts import sse_events

__all__ = ["stack"]  # the fixture, shared with test_filters.py

REASONING = "look up"
THEN_A_CALL = script(
    {"reasoning": REASONING},
    {"tool_call": {"name": "save", "arguments": {"code": "x project-falcon y"}}},
)
MESSAGES_TOOLS: list[ToolParam] = [{"name": "save", "input_schema": {"type": "object"}}]


def chunk_kinds(chunks: list[Any]) -> list[str]:
    """The kind of each delta of a chat stream, runs of one kind made one."""
    kinds: list[str] = []
    for chunk in chunks:
        if not isinstance(chunk, dict) or not chunk.get("choices"):
            continue
        delta = chunk["choices"][0]["delta"]
        for kind in ("reasoning_content", "content", "tool_calls"):
            value = delta.get(kind)
            if kind == "content" and isinstance(value, str):
                value = value.strip()  # the blank line Qwen3 writes after its thinking
            if value and (not kinds or kinds[-1] != kind):
                kinds.append(kind)
    return kinds


async def test_chat_stream_says_the_reasoning_whole_before_the_tool_call(stack: Stack) -> None:
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.post(
            stack.v1 + "/chat/completions", json=chat(THEN_A_CALL, tools=TOOLS, stream=True)
        )
    assert response.status_code == 200, response.text
    chunks = payloads(response.text)
    assert chunk_kinds(chunks) == ["reasoning_content", "tool_calls"]
    reasoning = "".join(
        c["choices"][0]["delta"].get("reasoning_content") or ""
        for c in chunks
        if isinstance(c, dict) and c.get("choices")
    )
    assert reasoning == REASONING
    arguments = "".join(
        call["function"].get("arguments") or ""
        for c in chunks
        if isinstance(c, dict) and c.get("choices")
        for call in c["choices"][0]["delta"].get("tool_calls") or []
    )
    assert json.loads(arguments) == {"code": "x *** y"}


async def test_messages_stream_has_one_thinking_block_then_the_tool_use(stack: Stack) -> None:
    body = {
        "model": "agent-lite",
        "max_tokens": 2000,
        "stream": True,
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "tools": MESSAGES_TOOLS,
        "messages": [{"role": "user", "content": THEN_A_CALL}],
    }
    async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        response = await client.post(stack.v1 + "/messages", json=body)
    assert response.status_code == 200, response.text
    events = sse_events(response.text)
    starts = [
        data["content_block"]["type"] for name, data in events if name == "content_block_start"
    ]
    assert starts == ["thinking", "tool_use"]
    thinking = "".join(
        data["delta"]["thinking"]
        for name, data in events
        if name == "content_block_delta" and data["delta"]["type"] == "thinking_delta"
    )
    assert thinking == REASONING


async def test_messages_whole_through_the_sdk_is_thinking_then_tool_use(stack: Stack) -> None:
    client = anthropic.AsyncAnthropic(
        base_url=stack.v1.removesuffix("/v1"), api_key="none", max_retries=0
    )
    message = await client.messages.create(
        model="agent-lite",
        max_tokens=2000,
        thinking={"type": "enabled", "budget_tokens": 1024},
        tools=MESSAGES_TOOLS,
        messages=[{"role": "user", "content": THEN_A_CALL}],
    )
    assert [block.type for block in message.content] == ["thinking", "tool_use"]
    thinking = message.content[0]
    assert thinking.type == "thinking" and thinking.thinking == REASONING
    tool_use = message.content[1]
    assert tool_use.type == "tool_use" and tool_use.input == {"code": "x *** y"}
