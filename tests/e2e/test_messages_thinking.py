"""``/v1/messages`` shows thinking only to a request that enabled it, as Anthropic does: no
``thinking`` (or ``{"type": "disabled"}``) gets no thinking block, whole or streamed, and the
Vercel AI SDK has no "unsupported reasoning metadata" to warn about. Whether the provider is
then asked not to think is the alias's ``messages_without_thinking``. Message ids are
Anthropic's shape. The anthropic SDK is the client, the simulator (vLLM, Qwen3-like thinking
on by default) the upstream."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anthropic
import pytest

from tests.e2e.harness import (
    Stack,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)

HELLO = script({"reasoning": "think 思考"}, {"text": "Hello 世界 🌍"})
# Anthropic's message ids: msg_01 and 22 more letters and digits (msg_013Zva2CMHLNnXjNJJKqJ2EF).
MESSAGE_ID = re.compile(r"msg_01[0-9A-Za-z]{22}")
THINKING: dict[str, Any] = {
    "absent": None,
    "disabled": {"type": "disabled"},
    "enabled": {"type": "enabled", "budget_tokens": 1024},
    "adaptive": {"type": "adaptive"},
}


def thinking_tokens(message: Any) -> int:
    count: int = message.usage.output_tokens_details.thinking_tokens
    return count


async def ask(stack: Stack, thinking: Any, *, stream: bool) -> Any:
    client = anthropic.AsyncAnthropic(
        base_url=stack.gateway.base_url, api_key="unused", max_retries=0
    )
    kwargs: Any = {
        "model": "agent-lite",
        "max_tokens": 2000,
        "messages": [{"role": "user", "content": HELLO}],
    }
    if thinking is not None:
        kwargs["thinking"] = thinking
    kinds: list[str] = []
    if stream:
        async with client.messages.stream(**kwargs) as events:
            async for event in events:
                if event.type == "content_block_start":
                    kinds.append(event.content_block.type)
            message = await events.get_final_message()
        assert kinds == [block.type for block in message.content]
    else:
        message = await client.messages.create(**kwargs)
    await client.close()
    return message


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("thinking", list(THINKING))
async def test_thinking_blocks_only_when_the_request_enabled_thinking(
    stack: Stack, thinking: str, stream: bool
) -> None:
    message = await ask(stack, THINKING[thinking], stream=stream)
    stats = await stack.sim_stats()
    kinds = [block.type for block in message.content]
    if thinking in ("enabled", "adaptive"):
        assert kinds == ["thinking", "text"]
        assert message.content[0].thinking == "think 思考"
    else:
        assert kinds == ["text"]
    assert message.content[-1].text == "Hello 世界 🌍"
    # Dropped thinking was still generated: it counts, as the upstream counted it.
    assert message.usage.output_tokens == stats["tokens_generated"]
    thought = 0 if thinking == "disabled" else 3  # "think", " 思", "考"
    assert thinking_tokens(message) == thought
    sent = stats["last_request_body"].get("chat_template_kwargs", {})
    # The default (model_default): without thinking, the model is told nothing.
    expected = {"absent": None, "disabled": False, "enabled": True, "adaptive": True}[thinking]
    assert sent.get("enable_thinking") == expected


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_message_ids_are_anthropics_shape(stack: Stack, stream: bool) -> None:
    first = await ask(stack, None, stream=stream)
    second = await ask(stack, None, stream=stream)
    assert MESSAGE_ID.fullmatch(first.id) and MESSAGE_ID.fullmatch(second.id)
    assert first.id != second.id


@asynccontextmanager
async def alias_stack(setting: str) -> AsyncIterator[Stack]:
    async with running_sim() as sim:
        providers = f'messages_without_thinking = "{setting}"\n' + provider_toml(
            "sim-a", sim.base_url
        )
        async with running_gateway(gateway_config(providers)) as gateway:
            yield Stack(sim=sim, gateway=gateway)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_an_alias_may_turn_unasked_thinking_off(stream: bool) -> None:
    async with alias_stack("off") as stack:
        message = await ask(stack, None, stream=stream)
        stats = await stack.sim_stats()
        assert [block.type for block in message.content] == ["text"]
        assert stats["last_request_body"]["chat_template_kwargs"] == {"enable_thinking": False}
        assert thinking_tokens(message) == 0
        thought = await ask(stack, THINKING["enabled"], stream=stream)
        assert [block.type for block in thought.content] == ["thinking", "text"]
