"""The Responses API's WebSocket mode in front of a real vLLM 0.32 (CPU, tiny random Qwen3): the
openai SDK's ``client.responses.connect()`` (async, on asyncio in a thread), every event read
through its strict types, runs a two-step function-tool loop with ``store: false``, the
second turn sending only the call's output and ``previous_response_id``. The tiny model never
calls a tool by itself (a named ``tool_choice`` makes vLLM write the call) nor stops (the
answer runs to ``max_output_tokens``)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.e2e.responses_socket import aread_until_done, async_client, in_asyncio
from tests.vllm.helpers import ALIAS, PROMPT
from tests.vllm.test_gateway_vllm_responses import NO_THINK, WEATHER
from trio_gateway.process.serve import GatewayHandle

pytestmark = pytest.mark.vllm


async def loop(v1: str) -> list[Any]:
    client = async_client(v1)
    common: Any = {"model": ALIAS, "tools": [WEATHER], "reasoning": NO_THINK, "store": False}
    async with client.responses.connect() as connection:
        await connection.response.create(
            input=[{"role": "user", "content": PROMPT}],
            tool_choice={"type": "function", "name": "get_weather"},
            max_output_tokens=40,
            temperature=0,
            **common,
        )
        call_step = (await aread_until_done(connection))[-1]
        assert call_step.type == "response.completed", call_step
        (call,) = [i for i in call_step.response.output if i.type == "function_call"]
        output: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}
        await connection.response.create(
            input=[output],
            previous_response_id=call_step.response.id,
            tool_choice="none",
            max_output_tokens=16,
            temperature=0,
            **common,
        )
        answer = (await aread_until_done(connection))[-1]
    await client.close()
    return [call_step.response, answer]


async def test_a_tool_loop_over_the_socket_on_real_vllm(gateway: GatewayHandle) -> None:
    v1 = f"{gateway.base_url}/v1"
    call_step, answer = await trio.to_thread.run_sync(in_asyncio(lambda: loop(v1)))
    assert answer.type == "response.incomplete", answer
    response = answer.response
    assert response.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in response.output] == ["message"]
    assert response.output_text and response.usage.output_tokens == 16
    # vLLM got the whole loop, rebuilt from the socket's memory: the call and its output
    # make the second prompt longer than the first.
    assert response.usage.input_tokens > call_step.usage.input_tokens + 5
    assert response.previous_response_id == call_step.id
