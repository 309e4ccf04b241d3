"""``POST /v1/responses`` in front of a real vLLM 0.32 (CPU, tiny random Qwen3), the ``openai``
SDK as the client: ``responses.create`` whole, ``responses.stream`` with
``get_final_response()``, reasoning on and off, and a two-step function-tool loop, stateless
(the output items appended to the input) and with ``previous_response_id``. The tiny model
never stops by itself, so a text answer runs to ``max_output_tokens`` (``status:
incomplete``) and token counts are exact. It never calls a tool by itself either: a named
``tool_choice`` makes vLLM write a call."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest

from tests.vllm.helpers import ALIAS, PROMPT
from trio_gateway.process.serve import GatewayHandle

pytestmark = pytest.mark.vllm

WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["x"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
NO_THINK: Any = {"effort": "none"}


@pytest.fixture
async def client(gateway: GatewayHandle) -> AsyncIterator[openai.AsyncOpenAI]:
    sdk = openai.AsyncOpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
    yield sdk
    await sdk.close()


async def ask(client: openai.AsyncOpenAI, *, stream: bool, **fields: Any) -> Any:
    kwargs: Any = {"model": ALIAS, "temperature": 0, **fields}
    if not stream:
        return await client.responses.create(**kwargs)
    async with client.responses.stream(**kwargs) as events:
        ended = None
        async for event in events:
            ended = event
        assert ended is not None
        # The SDK's get_final_response() wants response.completed; an answer cut at
        # max_output_tokens ends with response.incomplete, which carries the response too.
        if ended.type == "response.incomplete":
            return ended.response
        assert ended.type == "response.completed", ended
        return await events.get_final_response()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_reasoning_on_and_off(client: openai.AsyncOpenAI, stream: bool) -> None:
    thinking = await ask(
        client, stream=stream, input=PROMPT, max_output_tokens=16, reasoning={"effort": "low"}
    )
    assert thinking.status == "incomplete", thinking.error
    assert thinking.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in thinking.output] == ["reasoning"]
    assert thinking.output[0].content[0].text
    assert thinking.output_text == ""
    assert thinking.usage.output_tokens == 16
    # 16: the least the API takes (max_output_tokens >= 16, as OpenAI refuses less).
    plain = await ask(client, stream=stream, input=PROMPT, max_output_tokens=16, reasoning=NO_THINK)
    assert plain.status == "incomplete" and plain.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in plain.output] == ["message"]
    assert plain.output_text and plain.usage.output_tokens == 16
    assert plain.usage.output_tokens_details.reasoning_tokens == 0
    assert plain.usage.total_tokens == plain.usage.input_tokens + plain.usage.output_tokens
    # The thinking-off prompt is longer: the template pre-fills an empty think block.
    assert plain.usage.input_tokens > thinking.usage.input_tokens > 0


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("stateful", [False, True], ids=["stateless", "previous_response_id"])
async def test_two_step_function_tool_loop(
    client: openai.AsyncOpenAI, stream: bool, stateful: bool
) -> None:
    items: list[Any] = [{"role": "user", "content": PROMPT}]
    common: Any = {"tools": [WEATHER], "reasoning": NO_THINK, "store": stateful}
    call_step = await ask(
        client,
        stream=stream,
        input=items,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=40,
        **common,
    )
    assert call_step.status == "completed", call_step.error
    (call,) = [item for item in call_step.output if item.type == "function_call"]
    # vLLM, not the gateway, writes these arguments: even constrained to the schema, the tiny
    # random model's guided JSON comes out as `null` (vLLM's own answer, checked without the
    # gateway). What matters here is that they are JSON and go back to vLLM in the next step.
    assert call.name == "get_weather"
    json.loads(call.arguments)
    assert call.call_id
    output = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    if stateful:
        follow_up: Any = {"input": [output], "previous_response_id": call_step.id}
    else:
        follow_up = {"input": [*items, *call_step.output, output]}
    answer = await ask(
        client, stream=stream, tool_choice="none", max_output_tokens=16, **common, **follow_up
    )
    assert answer.status == "incomplete", answer.error
    assert [item.type for item in answer.output] == ["message"]
    assert answer.output_text and answer.usage.output_tokens == 16
    # vLLM saw the whole loop: the call and its output make the second prompt longer.
    assert answer.usage.input_tokens > call_step.usage.input_tokens + 5
