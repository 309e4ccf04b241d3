"""A three-step tool loop over ``/v1/responses`` with thinking on, as an agent runs it with the
openai SDK: stateless (``store: false``, each answer's output items appended to the input with
the call's ``function_call_output``), against vLLM's (Qwen3-like reasoning), Anthropic's and
Gemini 3's simulators. Signed thinking rides in the reasoning items' ``encrypted_content``,
sealed: the client can't read it, and the vendor gets its signatures back untouched (the
Anthropic simulator refuses a loop without its signed thinking, Gemini 3's a call without its
signature)."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from tests.e2e.test_cloud_providers import Fleet
from tests.e2e.test_thinking_tool_loop import QUESTION, replayed, thinking_sent, vendor_fleet
from trio_gateway.fronts.responses.route import service_of

STEPS = 3
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


async def ask(client: openai.AsyncOpenAI, items: list[Any], *, stream: bool) -> Any:
    kwargs: Any = {
        "model": "agent-lite",
        "input": items,
        "tools": [WEATHER],
        "reasoning": {"effort": "low"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    if not stream:
        return await client.responses.create(**kwargs)
    async with client.responses.stream(**kwargs) as events:
        async for _ in events:
            pass
        return await events.get_final_response()


def expected(f: Fleet, vendor: str, output: list[Any]) -> Any:
    """What the vendor must get back, from the reasoning items of the answer (opened with the
    gateway's key: the client itself cannot)."""
    sealer = service_of(f.gateway.router).sealer
    details = [
        detail
        for item in output
        if item.type == "reasoning" and item.encrypted_content
        for detail in (sealer.open(item.encrypted_content) or [])
    ]
    assert details, "no reasoning item carries the signed thinking"
    (detail,) = details
    if vendor == "anthropic":
        assert detail["text"] == "I should look it up"
        return {"type": "thinking", "thinking": detail["text"], "signature": detail["signature"]}
    call = next(item for item in output if item.type == "function_call")
    assert detail["id"] == call.call_id
    return detail["data"]


async def run_loop(f: Fleet, vendor: str, *, stream: bool) -> None:
    client = openai.AsyncOpenAI(base_url=f.v1, api_key="unused", max_retries=0)
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    previous: list[Any] | None = None
    for step in range(STEPS):
        response = await ask(client, items, stream=stream)
        assert response.status == "completed", f"step {step}: {response.error}"
        kinds = [item.type for item in response.output]
        assert "reasoning" in kinds and kinds[-1] in ("function_call", "reasoning"), kinds
        call = next(item for item in response.output if item.type == "function_call")
        assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
        sent = await f.last_body(vendor)
        if vendor == "vllm":
            # Qwen3's reasoning as the reasoning item's text; the history as chat turns.
            reasoning = next(item for item in response.output if item.type == "reasoning")
            assert reasoning.content[0].text == "I should look it up"
            roles = [m["role"] for m in sent["messages"]]
            assert roles == ["user"] + ["assistant", "tool"] * step
        else:
            assert thinking_sent(vendor, sent), f"step {step}: thinking was off"
            for item in response.output:
                if item.type == "reasoning" and item.encrypted_content:
                    assert "look it up" not in item.encrypted_content
            if previous is not None:
                assert replayed(vendor, sent) == expected(f, vendor, previous), f"step {step}"
        previous = response.output
        # The agent's loop: the answer's items as they came, then the call's output.
        items += [item.model_dump(exclude_none=True) for item in response.output]
        items.append({"type": "function_call_output", "call_id": call.call_id, "output": "18C"})
    assert f.sims[vendor].engine.stats().requests == STEPS
    await client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("vendor", ["vllm", "anthropic", "gemini"])
async def test_a_three_step_tool_loop_keeps_thinking_on(vendor: str, stream: bool) -> None:
    async with vendor_fleet(vendor) as f:
        await run_loop(f, vendor, stream=stream)
