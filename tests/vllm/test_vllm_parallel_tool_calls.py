"""``parallel_tool_calls: false`` in front of a real vLLM 0.32: the GPU stops after the first call.

vLLM's hermes parser under the flag returns only the first call but generates every call the
model writes. The tiny model is forced (``structured_outputs.regex``) to write a short call and
then a long one; the gateway must hand the client the short one and close the upstream, so that
vLLM's ``vllm:generation_tokens_total`` grows by about the first call, not both.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from tests.vllm.helpers import (
    ALIAS,
    PROVIDER,
    TOOL_CALL_RE,
    WEATHER_TOOL,
    vllm_gateway,
    wait_generation_settled,
)
from tests.vllm.vllm_server import VllmServer
from trio_gateway.process.serve import GatewayHandle

pytestmark = pytest.mark.vllm

Json = dict[str, Any]

# Some 150-250 tokens of the tiny model's tokenizer: the call nobody should pay for.
LONG_CITY = "weather in paris " * 40
SECOND_CALL_RE = (
    r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "'
    + LONG_CITY
    + r'"\}\}\n</tool_call>'
)
TWO_CALLS_RE = TOOL_CALL_RE + r"\n" + SECOND_CALL_RE


def body(pattern: str, **fields: Any) -> Json:
    return {
        "model": ALIAS,
        "messages": [{"role": "user", "content": "what is the weather in paris"}],
        "max_tokens": 600,
        "temperature": 0,
        "tools": [WEATHER_TOOL],
        "tool_choice": "auto",
        "reasoning": False,
        "structured_outputs": {"regex": pattern},
        **fields,
    }


@pytest.fixture
async def gateway(vllm_server: VllmServer) -> AsyncIterator[GatewayHandle]:
    async with vllm_gateway(vllm_server) as handle:
        yield handle


async def generated_by(
    gateway: GatewayHandle, root: httpx.AsyncClient, request: Json
) -> tuple[float, Json]:
    """POST through the gateway; vLLM's generated tokens for it (once nothing runs), and the
    whole answer."""
    before = await wait_generation_settled(root, within=30)
    async with httpx.AsyncClient(base_url=gateway.base_url, timeout=120.0) as client:
        response = await client.post("/v1/chat/completions", json=request)
    assert response.status_code == 200, response.text
    after = await wait_generation_settled(root, within=30)
    answer: Json = response.json()
    return after - before, answer


def calls_of(answer: Json) -> list[tuple[str, Any]]:
    message = answer["choices"][0]["message"]
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message.get("tool_calls") or []
    ]


async def test_parallel_tool_calls_false_stops_vllm_after_the_first_call(
    vllm_server: VllmServer, gateway: GatewayHandle
) -> None:
    async with httpx.AsyncClient(base_url=vllm_server.root_url, timeout=30.0) as root:
        # What each shape costs when generated to its end.
        one, answer = await generated_by(gateway, root, body(TOOL_CALL_RE))
        assert calls_of(answer) == [("get_weather", {"city": "x"})]
        both, answer = await generated_by(gateway, root, body(TWO_CALLS_RE))
        assert calls_of(answer) == [
            ("get_weather", {"city": "x"}),
            ("get_weather", {"city": LONG_CITY}),
        ]
        assert both > 4 * one, (one, both)

        stopped, answer = await generated_by(
            gateway, root, body(TWO_CALLS_RE, parallel_tool_calls=False)
        )
    summary = f"tokens generated: first call alone {one}, both {both}, stopped {stopped}"
    print(summary)
    assert calls_of(answer) == [("get_weather", {"city": "x"})], summary
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    assert answer["usage"]["completion_tokens"] <= stopped
    # About the first call, plus the few tokens vLLM makes while the close reaches it: far
    # less than both.
    assert stopped < one + 20, summary
    assert stopped * 3 < both, summary
    stops = gateway.router.metrics.registry.get_sample_value(
        "gateway_tool_call_early_stops_total", {"provider": PROVIDER}
    )
    assert stops == 1
