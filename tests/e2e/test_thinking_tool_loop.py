"""An agent's tool loop through the gateway keeps the model thinking: each assistant answer
carries what its vendor needs to go on (``reasoning_details``: Anthropic's signed thinking
blocks, Gemini's thought signatures), and a client that appends the message as it received it,
the normal agent loop with the official openai SDK, gets them back to the vendor untouched.

The simulators keep the vendors' rules: Anthropic's refuses thinking mid loop without the
turn's signed thinking and a changed signature; Gemini's refuses a changed or foreign thought
signature and (a thinking model) a function call replayed without its signature."""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import openai
import pytest
import trio

from tests.e2e.harness import FAST_SIM, running_gateway, script
from tests.e2e.test_cloud_providers import ENV, KEYS, WEATHER, Fleet, fleet, only, provider
from trio_gateway.capacity.health import State
from trio_gateway.config.load import parse_config
from trio_gateway.sim import SimHandle, serve_sim

STEPS = 3
# A thinking model that refuses a function call sent back without its signature.
GEMINI_3 = "gemini-3-pro-preview"
QUESTION = "weather? " + script(
    {"reasoning": "I should look it up"},
    {"tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}},
)


@asynccontextmanager
async def vendor_fleet(vendor: str) -> AsyncIterator[Fleet]:
    """The gateway with one provider: the vendor's simulator (Gemini as Gemini 3)."""
    if vendor != "gemini":
        async with fleet(only(vendor)) as f:
            yield f
        return
    async with trio.open_nursery() as nursery:
        sim_config = attrs.evolve(
            FAST_SIM, dialect="gemini", api_key=KEYS["gemini"], served_model_name=GEMINI_3
        )
        sim: SimHandle = await nursery.start(serve_sim, sim_config)
        toml = provider("gemini", sim, weight=100, vision=False)
        toml = re.sub(r'(?m)^model = "[^"]*"$', f'model = "{GEMINI_3}"', toml, count=1)
        assert GEMINI_3 in toml
        text = '[server]\nlisten = "127.0.0.1:0"\n[aliases.agent-lite]\n' + toml
        config = parse_config(text, source="test.toml", environ=ENV)
        async with running_gateway(config) as gateway:
            yield Fleet(gateway=gateway, sims={"gemini": sim})
        nursery.cancel_scope.cancel()


async def ask(client: openai.AsyncOpenAI, messages: list[Any], *, stream: bool) -> Any:
    """One step of the loop: the assistant message as an agent keeps it to send back."""
    kwargs: Any = {"model": "agent-lite", "tools": [WEATHER], "reasoning_effort": "low"}
    if not stream:
        completion = await client.chat.completions.create(messages=messages, **kwargs)
        assert completion.choices[0].finish_reason == "tool_calls"
        # As OpenAI's own guides do it: the message object itself, extra fields and all.
        return completion.choices[0].message
    calls: dict[int, dict[str, Any]] = {}
    details: list[Any] = []
    content = ""
    chunks = await client.chat.completions.create(messages=messages, stream=True, **kwargs)
    async for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            # Each entry arrives whole, once: appended in order.
            details += (delta.model_extra or {}).get("reasoning_details") or []
            for fragment in delta.tool_calls or ():
                call = calls.setdefault(
                    fragment.index,
                    {"id": "", "type": "function", "function": {"name": "", "arguments": ""}},
                )
                call["id"] += fragment.id or ""
                if fragment.function is not None:
                    call["function"]["name"] += fragment.function.name or ""
                    call["function"]["arguments"] += fragment.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    message["tool_calls"] = [calls[i] for i in sorted(calls)]
    message["reasoning_details"] = details
    return message


def details_of(message: Any) -> Any:
    if isinstance(message, dict):
        return message["reasoning_details"]
    return (message.model_extra or {}).get("reasoning_details")


def first_call_id(message: Any) -> str:
    if isinstance(message, dict):
        return str(message["tool_calls"][0]["id"])
    return str(message.tool_calls[0].id)


def thinking_sent(vendor: str, body: dict[str, Any]) -> bool:
    if vendor == "anthropic":
        return bool(body.get("thinking", {}).get("type") == "enabled")
    # Gemini 3 thinks at a level (2.5 at a budget; a budget of 0 is off).
    config = body["generationConfig"]["thinkingConfig"]
    on = bool(config.get("thinkingLevel")) or bool(config.get("thinkingBudget"))
    return on and config.get("includeThoughts") is True


def replayed(vendor: str, body: dict[str, Any]) -> Any:
    """What the vendor got back of the assistant's last turn: its thinking, or its signature."""
    if vendor == "anthropic":
        turn = body["messages"][-2]
        assert turn["role"] == "assistant"
        return turn["content"][0]
    turn = body["contents"][-2]
    assert turn["role"] == "model"
    call = next(part for part in turn["parts"] if "functionCall" in part)
    return call.get("thoughtSignature")


def expected(vendor: str, message: Any) -> Any:
    """What the vendor must get back, from the message's reasoning_details as received."""
    details = details_of(message)
    assert details, "the answer carries no reasoning_details"
    if vendor == "anthropic":
        (detail,) = details
        assert detail["type"] == "reasoning.text" and detail["format"] == "anthropic-claude-v1"
        assert detail["text"] == "I should look it up"
        return {"type": "thinking", "thinking": detail["text"], "signature": detail["signature"]}
    (detail,) = details
    assert detail["type"] == "reasoning.encrypted" and detail["format"] == "google-gemini-v1"
    # The signature of the call it was sent on.
    assert detail["id"] == first_call_id(message)
    return detail["data"]


async def run_loop(f: Fleet, vendor: str, *, stream: bool) -> None:
    client = openai.AsyncOpenAI(base_url=f.v1, api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    previous: Any = None
    for step in range(STEPS):
        message = await ask(client, messages, stream=stream)
        sent = await f.last_body(vendor)
        assert thinking_sent(vendor, sent), f"step {step}: thinking was off"
        if previous is not None:
            assert replayed(vendor, sent) == expected(vendor, previous), f"step {step}"
        previous = message
        messages.append(message)
        result = {"role": "tool", "tool_call_id": first_call_id(message), "content": "18C"}
        messages.append(result)
    assert f.sims[vendor].engine.stats().requests == STEPS


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("vendor", ["anthropic", "gemini"])
async def test_a_three_step_tool_loop_keeps_thinking_on(vendor: str, stream: bool) -> None:
    async with vendor_fleet(vendor) as f:
        await run_loop(f, vendor, stream=stream)


@pytest.mark.parametrize("vendor", ["anthropic", "gemini"])
async def test_the_event_stream_carries_them_for_the_loop_too(vendor: str) -> None:
    """``/v1/events``: the answer's ``reasoning.detail`` events, appended to the assistant
    message sent back, keep the loop thinking, as on Chat Completions."""
    from tests.e2e.test_events_sse import parse_events

    async with vendor_fleet(vendor) as f, httpx.AsyncClient(timeout=10) as client:
        body: dict[str, Any] = {
            "model": "agent-lite",
            "tools": [WEATHER],
            "reasoning_effort": "low",
            "messages": [{"role": "user", "content": QUESTION}],
        }
        previous: Any = None
        for step in range(2):
            response = await client.post(f.v1 + "/events", json=body)
            assert response.status_code == 200, response.text
            events = parse_events(response.content)
            sent = await f.last_body(vendor)
            assert thinking_sent(vendor, sent), f"step {step}: thinking was off"
            if previous is not None:
                assert replayed(vendor, sent) == expected(vendor, previous)
            calls = [e for e in events if e["type"] == "tool_call.done"]
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": c["call_id"],
                        "type": "function",
                        "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])},
                    }
                    for c in calls
                ],
                "reasoning_details": [
                    e["detail"] for e in events if e["type"] == "reasoning.detail"
                ],
            }
            previous = message
            result = {"role": "tool", "tool_call_id": calls[0]["call_id"], "content": "18C"}
            body["messages"] += [message, result]


def _altered(signature: str) -> str:
    """The signature with one byte changed, still valid base64: what a client's bug makes."""
    raw = bytearray(base64.b64decode(signature))
    raw[-1] ^= 1
    return base64.b64encode(bytes(raw)).decode()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_altered_gemini_signature_is_the_clients_400(stream: bool) -> None:
    """Gemini refuses a thought signature it did not issue ("Corrupted thought signature.").
    The gateway passes it through as the client's error, a 400 ``invalid_request`` naming the
    provider, and the provider stays healthy: it answered, correctly. The message as received
    still goes on."""
    async with vendor_fleet("gemini") as f:
        client = openai.AsyncOpenAI(base_url=f.v1, api_key="unused", max_retries=0)
        messages: list[Any] = [{"role": "user", "content": QUESTION}]
        first = await ask(client, messages, stream=stream)
        message = first if isinstance(first, dict) else first.model_dump(exclude_none=True)
        result = {"role": "tool", "tool_call_id": first_call_id(first), "content": "18C"}
        (detail,) = message["reasoning_details"]
        bad = message | {"reasoning_details": [detail | {"data": _altered(detail["data"])}]}
        with pytest.raises(openai.BadRequestError) as refused:
            await ask(client, [*messages, bad, result], stream=stream)
        error = refused.value.body
        assert isinstance(error, dict)
        assert error["code"] == "invalid_request" and error["provider"] == "gemini"
        assert error["message"] == "Corrupted thought signature."
        assert refused.value.status_code == 400
        assert (await f.last_body("gemini"))["contents"][-2]["parts"][0]["thoughtSignature"] == (
            _altered(detail["data"])
        )
        health = f.gateway.router.health["gemini"].snapshot(trio.current_time())
        assert health.state is State.HEALTHY and health.consecutive_failures == 0
        assert health.last_error is None
        # The same loop with the message untouched goes on.
        await ask(client, [*messages, first, result], stream=stream)
        assert f.sims["gemini"].engine.stats().requests == 3
