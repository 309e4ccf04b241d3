"""Two tool calls from an upstream that sends them one after the other, and from one that
interleaves their fragments (``index`` 0, 1, 0, 1 …, the simulator's ``interleave`` script):
each front gives two whole calls. Clients: the openai SDK on the simulator itself (the wire
really interleaves) and on the chat front, the anthropic SDK on ``/v1/messages`` (whole and
streamed), the openai SDK's Responses stream on ``/v1/responses``."""

from __future__ import annotations

import itertools
import json
from typing import Any

import anthropic
import pytest
from openai import AsyncOpenAI

from tests.e2e.harness import Stack, script

CALLS: list[dict[str, Any]] = [
    {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
    {"name": "get_time", "arguments": {"tz": "Europe/Paris"}},
]
EXPECTED = [(c["name"], c["arguments"]) for c in CALLS]
SCHEMA: Any = {"type": "object", "properties": {"city": {"type": "string"}}}
ORDERS = pytest.mark.parametrize("interleave", [False, True], ids=["sequential", "interleaved"])


def question(interleave: bool) -> str:
    return script({"tool_calls": CALLS, "interleave": interleave})


def chat_tools() -> Any:
    return [
        {"type": "function", "function": {"name": c["name"], "parameters": SCHEMA}} for c in CALLS
    ]


@ORDERS
async def test_the_simulators_wire_interleaves_as_asked(stack: Stack, interleave: bool) -> None:
    client = AsyncOpenAI(base_url=stack.sim.base_url + "/v1", api_key="sim-key", max_retries=0)
    indices: list[int] = []
    stream = await client.chat.completions.create(
        model="qwen3-32b",
        messages=[{"role": "user", "content": question(interleave)}],
        tools=chat_tools(),
        stream=True,
    )
    async for chunk in stream:
        for fragment in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
            indices.append(fragment.index)
    switches = sum(a != b for a, b in itertools.pairwise(indices))
    assert switches > 10 if interleave else switches == 1
    await client.close()


@ORDERS
async def test_the_chat_front_assembles_both_calls(stack: Stack, interleave: bool) -> None:
    client = AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    completion = await client.chat.completions.create(
        model="agent-lite",
        messages=[{"role": "user", "content": question(interleave)}],
        tools=chat_tools(),
    )
    calls: Any = completion.choices[0].message.tool_calls
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == EXPECTED
    await client.close()


@ORDERS
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_messages_gives_one_tool_use_block_per_call(
    stack: Stack, interleave: bool, stream: bool
) -> None:
    client = anthropic.AsyncAnthropic(
        base_url=stack.gateway.base_url, api_key="unused", max_retries=0
    )
    kwargs: Any = {
        "model": "agent-lite",
        "max_tokens": 400,
        "tools": [{"name": c["name"], "input_schema": SCHEMA} for c in CALLS],
        "messages": [{"role": "user", "content": question(interleave)}],
    }
    if stream:
        starts: list[str] = []
        async with client.messages.stream(**kwargs) as events:
            async for event in events:
                if event.type == "content_block_start":
                    starts.append(event.content_block.type)
            message = await events.get_final_message()
        assert starts == ["tool_use", "tool_use"]
    else:
        message = await client.messages.create(**kwargs)
    blocks: Any = message.content
    assert [(b.type, b.name, b.input) for b in blocks] == [("tool_use", *e) for e in EXPECTED]
    ids = [b.id for b in blocks]
    assert all(ids) and len(set(ids)) == 2
    assert message.stop_reason == "tool_use"
    await client.close()


@ORDERS
async def test_responses_gives_one_function_call_item_per_call(
    stack: Stack, interleave: bool
) -> None:
    client = AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    tools: Any = [{"type": "function", "name": c["name"], "parameters": SCHEMA} for c in CALLS]
    deltas: list[int] = []
    async with client.responses.stream(
        model="agent-lite", input=question(interleave), tools=tools
    ) as events:
        async for event in events:
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.output_index)
        response = await events.get_final_response()
    calls: Any = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == EXPECTED
    assert all(c.call_id for c in calls) and len({c.call_id for c in calls}) == 2
    # Each delta names its item: the Responses stream passes the interleaving on.
    switches = sum(a != b for a, b in itertools.pairwise(deltas))
    assert switches > 10 if interleave else switches == 1
    await client.close()
