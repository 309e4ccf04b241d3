"""Reasoning that must go back to its vendor survives turns on a Responses WebSocket: the
three-step tool loop of ``test_responses_tool_loop.py``, but each turn sends only the call's
output and the previous response's id, with ``store: false`` (the socket's memory holds the
turns). Anthropic's simulator refuses a loop without its signed thinking, Gemini 3's a call
without its thought signature; vLLM's reasoning goes back as the chat turns it was."""

from __future__ import annotations

import json
from typing import Any

import pytest
import trio
import trio_websocket

from tests.e2e.responses_socket import strict
from tests.e2e.test_responses_tool_loop import STEPS, WEATHER, expected
from tests.e2e.test_thinking_tool_loop import QUESTION, replayed, thinking_sent, vendor_fleet

TIMEOUT_S = 30


async def answer(ws: trio_websocket.WebSocketConnection) -> Any:
    while True:
        event = strict(await ws.get_message())
        if event.type in ("response.completed", "response.failed", "error"):
            return event


@pytest.mark.parametrize("vendor", ["vllm", "anthropic", "gemini"])
async def test_a_tool_loop_on_a_socket_keeps_thinking_on(vendor: str) -> None:
    async with vendor_fleet(vendor) as f:
        url = f.gateway.base_url.replace("http://", "ws://") + "/v1/responses"
        new_input: list[Any] = [{"role": "user", "content": QUESTION}]
        previous: Any = None
        async with trio_websocket.open_websocket_url(url) as ws:
            for step in range(STEPS):
                create: dict[str, Any] = {
                    "type": "response.create",
                    "model": "agent-lite",
                    "input": new_input,
                    "tools": [WEATHER],
                    "reasoning": {"effort": "low"},
                    "store": False,
                    "include": ["reasoning.encrypted_content"],
                }
                if previous is not None:
                    create["previous_response_id"] = previous.id
                await ws.send_message(json.dumps(create))
                with trio.fail_after(TIMEOUT_S):
                    done = await answer(ws)
                assert done.type == "response.completed", f"step {step}: {done}"
                response = done.response
                call = next(item for item in response.output if item.type == "function_call")
                sent = await f.last_body(vendor)
                if vendor == "vllm":
                    roles = [m["role"] for m in sent["messages"]]
                    assert roles == ["user"] + ["assistant", "tool"] * step
                else:
                    assert thinking_sent(vendor, sent), f"step {step}: thinking was off"
                    if previous is not None:
                        want = expected(f, vendor, previous.output)
                        assert replayed(vendor, sent) == want, f"step {step}"
                previous = response
                new_input = [
                    {"type": "function_call_output", "call_id": call.call_id, "output": "18C"}
                ]
        assert f.sims[vendor].engine.stats().requests == STEPS
