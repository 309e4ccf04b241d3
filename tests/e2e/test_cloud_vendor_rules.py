"""What each cloud vendor refuses, and what the gateway does so that a client's request is not
refused for it: each vendor a simulator that refuses what that vendor refuses, in its words."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import pytest

from tests.e2e.harness import FAST_SIM, Stack, chat, running_gateway, running_sim, script
from tests.e2e.test_cloud_providers import KEYS, fleet, only
from trio_gateway.config.load import parse_config

HAIKU = "claude-3-5-haiku-20241022"  # writes at most 8192 tokens an answer


@asynccontextmanager
async def vendor(
    kind: str, model: str, *, sim: dict[str, Any] | None = None, extra: str = ""
) -> AsyncIterator[Stack]:
    """One ``kind`` provider (``anthropic``, ``gemini``) serving ``model`` from its simulator."""
    config = attrs.evolve(
        FAST_SIM, dialect=kind, served_model_name=model, api_key=KEYS[kind], **(sim or {})
    )
    async with running_sim(config) as handle:
        text = f"""
[server]
listen = "127.0.0.1:0"
[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "{kind}"
type = "{kind}"
base_url = "{handle.base_url}"
model = "{model}"
api_key_env = "KEY"
capabilities = ["tools", "reasoning", "json_schema"]
probe = false
{extra}
"""
        gateway_config = parse_config(text, source="test.toml", environ={"KEY": KEYS[kind]})
        async with running_gateway(gateway_config) as gateway:
            yield Stack(sim=handle, gateway=gateway)


async def test_a_whitespace_only_stop_sequence_is_not_sent_to_anthropic() -> None:
    """Anthropic answers 400 to ``stop_sequences: ["\\n"]``: the gateway drops it, keeps the
    others, and the client gets its answer."""
    async with fleet(only("anthropic")) as f, httpx.AsyncClient(timeout=10) as client:
        for stop, sent in ((["\n"], None), (["\n", "END"], ["END"])):
            body = chat(script({"text": "one line"}), stop=stop)
            answer = await client.post(f.v1 + "/chat/completions", json=body)
            assert answer.status_code == 200, answer.text
            assert answer.json()["choices"][0]["message"]["content"] == "one line"
            assert (await f.last_body("anthropic")).get("stop_sequences") == sent


@pytest.mark.parametrize(
    ("fields", "max_tokens", "thinking"),
    [
        # The client's 100 are honoured: no room for Anthropic's least budget (1024), so no
        # thinking (the gateway once sent 16384 + 100, past Haiku's cap).
        ({"reasoning_effort": "high", "max_tokens": 100}, 100, {"type": "disabled"}),
        # No limit: default_max_tokens (4096), the budget inside it.
        ({"reasoning_effort": "high"}, 4096, {"type": "enabled", "budget_tokens": 4095}),
        # More than the model writes: its cap, the budget inside it.
        (
            {"reasoning_effort": "xhigh", "max_completion_tokens": 50000},
            8192,
            {"type": "enabled", "budget_tokens": 8191},
        ),
        ({"max_tokens": 20000}, 8192, None),
    ],
)
async def test_anthropic_gets_the_clients_limit_with_thinking_inside_it(
    fields: dict[str, Any], max_tokens: int, thinking: dict[str, Any] | None
) -> None:
    """The simulator refuses what Anthropic refuses: max_tokens over the model's cap,
    budget_tokens under 1024 or not under max_tokens."""
    sim = {"max_model_len": 65536, "max_output_tokens": 8192}
    async with (
        vendor("anthropic", HAIKU, sim=sim) as stack,
        httpx.AsyncClient(timeout=10) as client,
    ):
        body = chat(script({"reasoning": "hmm"}, {"text": "fine"}), **fields)
        answer = await client.post(stack.v1 + "/chat/completions", json=body)
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "fine"
        sent = (await stack.sim_stats())["last_request_body"]
        assert sent["max_tokens"] == max_tokens
        assert sent.get("thinking") == thinking
