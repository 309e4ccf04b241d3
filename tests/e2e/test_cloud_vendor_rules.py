"""What each cloud vendor refuses, and what the gateway does so that a client's request is not
refused for it: each vendor a simulator that refuses what that vendor refuses, in its words."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import pytest
import trio

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


def sse_items(text: str) -> list[Any]:
    return [
        json.loads(line[len("data: ") :]) for line in text.split("\n") if line.startswith("data: {")
    ]


async def test_a_gemini_answer_that_is_no_answer_is_an_upstream_error() -> None:
    """MALFORMED_FUNCTION_CALL, TOO_MANY_TOOL_CALLS... once ended as ``stop``: an empty answer
    that looked like success. Now an ``upstream_error`` naming Gemini's reason, in-band once
    the answer has begun; a safety stop is ``content_filter``. None of it makes the provider
    unhealthy (it answered)."""
    async with (
        vendor("gemini", "gemini-2.5-flash") as stack,
        httpx.AsyncClient(timeout=10) as client,
    ):
        url = stack.v1 + "/chat/completions"
        malformed = script({"text": "let me call"}, {"vendor_finish": "MALFORMED_FUNCTION_CALL"})
        streamed = await client.post(url, json=chat(malformed, stream=True))
        assert streamed.status_code == 200
        items = sse_items(streamed.text)
        assert items[0]["choices"][0]["delta"].get("content") in ("", None)
        content = "".join(
            i["choices"][0]["delta"].get("content") or "" for i in items if i.get("choices")
        )
        assert content == "let me call"
        assert all(not c.get("finish_reason") for i in items for c in i.get("choices", []))
        error = items[-1]["error"]
        assert error["code"] == "upstream_error" and error["provider"] == "gemini"
        assert "finishReason MALFORMED_FUNCTION_CALL" in error["message"]
        assert streamed.text.endswith("data: [DONE]\n\n")

        for reason in ("TOO_MANY_TOOL_CALLS", "OTHER", "SOMETHING_NEW"):
            whole = await client.post(url, json=chat(script({"vendor_finish": reason})))
            assert whole.status_code == 502, whole.text
            assert whole.json()["error"]["code"] == "upstream_error"
            assert f"finishReason {reason}" in whole.json()["error"]["message"]

        # Four answers that were none, and the provider is as healthy as before them.
        health = stack.gateway.router.health["gemini"].snapshot(trio.current_time())
        assert (health.consecutive_failures, health.last_error) == (0, None)

        filtered = await client.post(url, json=chat(script({"vendor_finish": "SAFETY"})))
        assert filtered.status_code == 200, filtered.text
        assert filtered.json()["choices"][0]["finish_reason"] == "content_filter"


async def test_json_object_is_refused_for_anthropic_not_dropped() -> None:
    """Anthropic has no JSON mode without a schema: the client is told, and nothing is sent
    (the field used to be dropped, and the answer came back as free text)."""
    async with fleet(only("anthropic")) as f, httpx.AsyncClient(timeout=10) as client:
        body = chat("answer in JSON", response_format={"type": "json_object"})
        refused = await client.post(f.v1 + "/chat/completions", json=body)
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_parameter", "response_format")
        assert f.sims["anthropic"].engine.stats().requests == 0
