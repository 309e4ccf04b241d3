"""``POST /v1/messages`` in front of a real vLLM 0.32 (CPU, tiny random Qwen3), the ``anthropic``
SDK as the client: thinking on and off, whole and streamed, usage as vLLM counts it, and a
client that leaves making vLLM abort. The tiny model never stops by itself, so every answer
runs to ``max_tokens`` (``stop_reason: max_tokens``) and token counts are exact; with thinking
on all of it is thinking."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anthropic
import httpx
import pytest

from tests.vllm.helpers import ALIAS, PROMPT, metric, wait_generation_settled, wait_metric
from tests.vllm.vllm_server import VllmServer
from trio_gateway.process.serve import GatewayHandle

pytestmark = pytest.mark.vllm


@pytest.fixture
async def client(gateway: GatewayHandle) -> AsyncIterator[anthropic.AsyncAnthropic]:
    sdk = anthropic.AsyncAnthropic(base_url=gateway.base_url, api_key="unused", max_retries=0)
    yield sdk
    await sdk.close()


@pytest.fixture
async def root(vllm_server: VllmServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=vllm_server.root_url, timeout=30.0) as vllm:
        yield vllm


def request(max_tokens: int, **fields: Any) -> dict[str, Any]:
    return {
        "model": ALIAS,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": PROMPT}],
        "extra_body": {"temperature": 0},
        **fields,
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_thinking_on_and_off(client: anthropic.AsyncAnthropic, stream: bool) -> None:
    async def ask(**fields: Any) -> Any:
        if not stream:
            return await client.messages.create(**request(**fields))
        async with client.messages.stream(**request(**fields)) as events:
            return await events.get_final_message()

    thinking = await ask(max_tokens=12, thinking={"type": "adaptive"})
    assert [b.type for b in thinking.content] == ["thinking"]
    assert thinking.content[0].thinking and thinking.content[0].signature == ""
    assert thinking.stop_reason == "max_tokens" and thinking.usage.output_tokens == 12
    plain = await ask(max_tokens=8, thinking={"type": "disabled"})
    assert [b.type for b in plain.content] == ["text"]
    assert plain.stop_reason == "max_tokens" and plain.usage.output_tokens == 8
    assert plain.usage.output_tokens_details is not None
    assert plain.usage.output_tokens_details.thinking_tokens == 0
    # The thinking-off prompt is longer: the template pre-fills an empty think block.
    assert plain.usage.input_tokens > thinking.usage.input_tokens > 0


async def test_a_client_that_leaves_makes_vllm_abort(
    client: anthropic.AsyncAnthropic, root: httpx.AsyncClient
) -> None:
    before = await wait_generation_settled(root, within=30)
    seen = 0
    fields = {"thinking": {"type": "disabled"}}
    async with client.messages.stream(**request(2000, **fields)) as events:
        async for _ in events.text_stream:
            seen += 1
            if seen == 20:
                break
        assert await metric(root, "vllm:num_requests_running") == 1
    await wait_metric(root, "vllm:num_requests_running", 0, within=10)
    generated = await wait_generation_settled(root, within=30) - before
    assert 19 <= generated < 200, generated  # not the 2000 asked for
