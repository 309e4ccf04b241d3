"""``parallel_tool_calls: false`` stops the GPU after the first complete tool call.

The simulator behaves as vLLM 0.32 does: under the flag it generates every call the model
writes and shows only the first. The gateway ends the answer at the first call's closing brace
and closes the upstream, so the simulator aborts the rest. Its own planner says at which token
the first call's arguments closed, and its counters say how many it generated in all.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio_websocket
from openai import AsyncOpenAI

from tests.e2e.harness import FAST_SIM, Stack, chat, script
from tests.e2e.test_events_sse import parse_events
from tests.e2e.test_ws import TIMEOUT_S, Transcript, request, send, ws_url
from trio_gateway.sim.request import ChatRequest as SimRequest
from trio_gateway.sim.request import parse_chat_request
from trio_gateway.sim.script import plan_generation

# "A few": the gateway reads the closing fragment, closes the connection, the simulator sees it
# and aborts, while it decodes a token every 2 ms.
MAX_TOKENS_AFTER_CLOSE = 4


def long_arguments(word: str) -> dict[str, Any]:
    # Braces, brackets and escaped quotes inside strings: the scanner must not be fooled.
    return {"query": f'{word} "quoted" {{not: [a brace]}} ' + word * 60, "limit": [1, {"n": 2}]}


CALLS = [
    ("search_docs", long_arguments("alpha ")),
    ("search_web", long_arguments("bravo ")),
    ("search_code", long_arguments("gamma ")),
]
THREE_CALLS = script(*({"tool_call": {"name": n, "arguments": a}} for n, a in CALLS))
TOOLS: Any = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name, _ in CALLS
]
FIRST_ARGUMENTS = json.dumps(CALLS[0][1], ensure_ascii=False)


def body(**fields: Any) -> dict[str, Any]:
    return chat(THREE_CALLS, tools=TOOLS, **fields)


@attrs.frozen
class Plan:
    closed_at: int  # tokens generated when the first call's arguments closed
    total: int  # tokens the whole answer takes


def planned(sent: Any) -> Plan:
    """What the simulator plans for the body the gateway sent it."""
    request = parse_chat_request(json.dumps(sent).encode(), FAST_SIM)
    assert isinstance(request, SimRequest), request
    tokens = plan_generation(request, FAST_SIM).tokens
    last_arg = max(i for i, t in enumerate(tokens) if t.kind == "tool_args" and t.tool_index == 0)
    return Plan(closed_at=last_arg + 1, total=len(tokens))


async def generated_after_close(stack: Stack) -> tuple[int, Plan]:
    """Wait for the simulator's abort; the tokens it generated after the first call closed."""
    with trio.fail_after(5):
        stats = await stack.sim.engine.wait_until(lambda s: s.aborts >= 1 and not s.running)
    assert stats.aborts == 1
    plan = planned(stats.last_request_body)
    # Three calls of one length: generating them all costs over three times the first.
    assert plan.total > 3 * plan.closed_at
    return stats.tokens_generated - plan.closed_at, plan


def early_stops(stack: Stack) -> float:
    value = stack.gateway.router.metrics.registry.get_sample_value(
        "gateway_tool_call_early_stops_total", {"provider": "sim-a"}
    )
    return float(value or 0.0)


def sse_chunks(text: str) -> list[dict[str, Any]]:
    lines = [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


async def test_streamed_answer_ends_at_the_first_call(stack: Stack) -> None:
    request_body = body(
        stream=True, stream_options={"include_usage": True}, parallel_tool_calls=False
    )
    async with httpx.AsyncClient() as client:
        response = await client.post(stack.v1 + "/chat/completions", json=request_body)
    assert response.status_code == 200, response.text
    chunks = sse_chunks(response.text)
    fragments = [
        call
        for chunk in chunks
        for choice in chunk["choices"]
        for call in choice["delta"].get("tool_calls") or []
    ]
    assert {f["index"] for f in fragments} == {0}
    assert [f["function"].get("name") for f in fragments if "id" in f] == ["search_docs"]
    arguments = "".join(f["function"].get("arguments") or "" for f in fragments)
    assert arguments == FIRST_ARGUMENTS
    finishes = [c["finish_reason"] for ch in chunks for c in ch["choices"] if c["finish_reason"]]
    assert finishes == ["tool_calls"]
    assert chunks[-1]["choices"] == []

    after, plan = await generated_after_close(stack)
    assert 0 <= after <= MAX_TOKENS_AFTER_CLOSE
    # Usage up to the closing fragment, exact (the simulator's continuous usage stats).
    assert chunks[-1]["usage"]["completion_tokens"] == plan.closed_at
    assert chunks[-1]["usage"]["prompt_tokens"] > 0
    assert early_stops(stack) == 1


async def test_non_streamed_answer_through_the_openai_sdk(stack: Stack) -> None:
    client = AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    completion = await client.chat.completions.create(
        model="agent-lite",
        messages=body()["messages"],
        tools=TOOLS,
        parallel_tool_calls=False,
    )
    await client.close()
    choice = completion.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.tool_calls is not None
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "search_docs"
    assert json.loads(call.function.arguments) == CALLS[0][1]

    after, plan = await generated_after_close(stack)
    assert 0 <= after <= MAX_TOKENS_AFTER_CLOSE
    assert completion.usage is not None
    assert completion.usage.completion_tokens == plan.closed_at
    assert early_stops(stack) == 1


async def test_streamed_through_the_openai_sdk(stack: Stack) -> None:
    client = AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="agent-lite",
        messages=body()["messages"],
        tools=TOOLS,
        parallel_tool_calls=False,
        stream=True,
        stream_options={"include_usage": True},
    )
    indexes, pieces, finish, usage = set(), [], None, None
    async for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
            for call in choice.delta.tool_calls or []:
                indexes.add(call.index)
                pieces.append((call.function and call.function.arguments) or "")
    await client.close()
    assert indexes == {0}
    assert "".join(pieces) == FIRST_ARGUMENTS
    assert finish == "tool_calls"
    after, plan = await generated_after_close(stack)
    assert 0 <= after <= MAX_TOKENS_AFTER_CLOSE
    assert usage is not None and usage.completion_tokens == plan.closed_at


async def test_the_events_front_ends_at_the_first_call_too(stack: Stack) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(stack.v1 + "/events", json=body(parallel_tool_calls=False))
    assert response.status_code == 200, response.text
    events = parse_events(response.content)
    done = [e for e in events if e["type"] == "tool_call.done"]
    assert [(d["name"], d["arguments"]) for d in done] == [("search_docs", CALLS[0][1])]
    assert {e["index"] for e in events if e["type"] == "tool_call.delta"} == {0}
    assert events[-1]["type"] == "response.done"
    assert events[-1]["finish_reason"] == "tool_calls"
    after, _ = await generated_after_close(stack)
    assert 0 <= after <= MAX_TOKENS_AFTER_CLOSE


async def test_the_websocket_front_ends_at_the_first_call_too(stack: Stack) -> None:
    transcript = Transcript()
    with trio.fail_after(TIMEOUT_S):
        async with trio_websocket.open_websocket_url(ws_url(stack)) as ws:
            fields = {"tools": TOOLS, "parallel_tool_calls": False}
            await send(ws, request("r1", THREE_CALLS, **fields))
            await transcript.read_until(ws, lambda: transcript.ended("r1"))
    events = transcript.by_id["r1"]
    done = [e for e in events if e["type"] == "tool_call.done"]
    assert [d["name"] for d in done] == ["search_docs"]
    assert events[-1]["type"] == "response.done"
    assert events[-1]["finish_reason"] == "tool_calls"
    after, _ = await generated_after_close(stack)
    assert 0 <= after <= MAX_TOKENS_AFTER_CLOSE


@pytest.mark.parametrize("flag", [{}, {"parallel_tool_calls": True}], ids=["absent", "true"])
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_without_the_flag_every_call_comes_through(
    stack: Stack, flag: dict[str, Any], stream: bool
) -> None:
    async with httpx.AsyncClient() as client:
        response = await client.post(
            stack.v1 + "/chat/completions", json=body(stream=stream, **flag)
        )
    assert response.status_code == 200, response.text
    if stream:
        fragments = [
            call
            for chunk in sse_chunks(response.text)
            for choice in chunk["choices"]
            for call in choice["delta"].get("tool_calls") or []
        ]
        calls: list[tuple[str, Any]] = []
        for index in range(len(CALLS)):
            mine = [f for f in fragments if f["index"] == index]
            name = mine[0]["function"]["name"]
            text = "".join(f["function"].get("arguments") or "" for f in mine)
            calls.append((name, json.loads(text)))
    else:
        message = response.json()["choices"][0]["message"]
        calls = [
            (c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message["tool_calls"]
        ]
    assert calls == CALLS
    stats = stack.sim.engine.stats()
    assert stats.aborts == 0
    plan = planned(stats.last_request_body)
    assert stats.tokens_generated == plan.total
    assert early_stops(stack) == 0
    async with httpx.AsyncClient() as client:
        page = (await client.get(stack.gateway.base_url + "/metrics")).text
    assert 'gateway_tool_call_early_stops_total{provider="sim-a"} 0.0' in page
