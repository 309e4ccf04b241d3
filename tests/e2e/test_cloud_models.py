"""Cloud models as they are, end to end: each simulator serves a real model name and refuses
what that model refuses (sim/vendor_models.py); the gateway's probes make every one of them
healthy, and `reasoning: false` reaches each in the form it takes, or is refused naming it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import attrs
import httpx
import pytest
import trio

from tests.e2e.harness import FAST_SIM, Stack, chat, running_gateway, script, wait_until
from trio_gateway.capacity.health import State
from trio_gateway.config.load import parse_config
from trio_gateway.sim import SimHandle, serve_sim

KEY = "sk-cloud-model-0123456789abcdef"
PROBES = "probe_interval_s = 0.1\nprobe_timeout_s = 2.0\nunhealthy_after = 1\nstartup_grace_s = 0\n"


@asynccontextmanager
async def cloud(
    vendor: str, model: str, *, probe: bool = False, extra: str = "", **sim: Any
) -> AsyncIterator[Stack]:
    """One vendor's simulator serving ``model``, behind a gateway with one provider."""
    async with trio.open_nursery() as nursery:
        config = attrs.evolve(FAST_SIM, dialect=vendor, api_key=KEY, served_model_name=model, **sim)
        handle: SimHandle = await nursery.start(serve_sim, config)
        base = handle.base_url + ("/v1" if vendor == "openai" else "")
        text = f"""
[server]
listen = "127.0.0.1:0"
[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "{vendor}"
type = "{vendor}"
base_url = "{base}"
model = "{model}"
api_key_env = "KEY"
capabilities = ["reasoning"]
probe = {str(probe).lower()}
{PROBES if probe else ""}{extra}
"""
        gateway_config = parse_config(text, source="test.toml", environ={"KEY": KEY})
        async with running_gateway(gateway_config) as gateway:
            yield Stack(sim=handle, gateway=gateway)
        nursery.cancel_scope.cancel()


async def last_body(stack: Stack) -> dict[str, Any]:
    body: dict[str, Any] = (await stack.sim_stats())["last_request_body"]
    return body


def thinking_sent(body: dict[str, Any]) -> dict[str, Any]:
    config: dict[str, Any] = body.get("generationConfig") or {}
    return config.get("thinkingConfig") or {}


@pytest.mark.parametrize(
    ("vendor", "model"),
    [
        ("openai", "gpt-5.1"),
        ("openai", "o3"),
        ("openai", "gpt-5-pro"),
        ("gemini", "gemini-2.5-pro"),
        ("gemini", "gemini-3-pro-preview"),
    ],
)
async def test_the_probe_makes_every_cloud_model_healthy(vendor: str, model: str) -> None:
    """Before, the probe said `reasoning: false`: each of these models refused it (minimal,
    a budget of 0), so the provider failed every probe and never became healthy."""
    async with cloud(vendor, model, probe=True) as stack:
        health = stack.gateway.router.health[vendor]
        await wait_until(lambda: stack.sim.engine.stats().requests >= 2)
        assert health.state is State.HEALTHY, health.last_error
        body = await last_body(stack)
        assert "reasoning_effort" not in body and "temperature" not in body
        assert set(thinking_sent(body)) <= {"includeThoughts"}


async def test_a_probe_the_provider_refuses_is_logged_once_and_keeps_it_in_rotation(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A model whose context cannot hold even the probe answers it with a 400: the provider
    is up (it answered), so it stays in rotation, and the refusal is logged once as what it
    is, a configuration error."""
    caplog.set_level(logging.ERROR)
    async with cloud("openai", "gpt-4o", probe=True, max_model_len=2) as stack:
        await wait_until(lambda: stack.sim.engine.stats().requests >= 3)
        health = stack.gateway.router.health["openai"]
        assert health.state is State.HEALTHY
        assert "maximum context length" in (health.last_error or "")
        async with httpx.AsyncClient() as client:
            ready = await client.get(stack.gateway.base_url + "/readyz")
        assert ready.status_code == 200
    refusals = [r for r in caplog.records if "probe's own request was refused" in r.getMessage()]
    assert len(refusals) == 1
    assert "maximum context length" in refusals[0].getMessage()


@pytest.mark.parametrize(
    ("vendor", "model", "least"),
    [
        ("openai", "o3", {"reasoning_effort": "low"}),
        ("openai", "gpt-5-pro-2025-10-06", {"reasoning_effort": "high"}),
        ("gemini", "gemini-2.5-pro", {"thinkingBudget": 128}),
        ("gemini", "gemini-3-pro-preview", {"thinkingLevel": "LOW"}),
    ],
)
async def test_reasoning_off_to_a_model_that_cannot_stop_is_refused_or_its_least(
    vendor: str, model: str, least: dict[str, Any]
) -> None:
    async with cloud(vendor, model) as stack, httpx.AsyncClient(timeout=10) as client:
        refused = await client.post(stack.v1 + "/chat/completions", json=chat(reasoning=False))
        assert refused.status_code == 400, refused.text
        error = refused.json()["error"]
        assert (error["code"], error["param"]) == ("unsupported_parameter", "reasoning")
        assert repr(model) in error["message"]
        assert stack.sim.engine.stats().requests == 0  # refused before anything was sent
    async with (
        cloud(vendor, model, extra='reasoning_off = "lowest"') as stack,
        httpx.AsyncClient(timeout=10) as client,
    ):
        answer = await client.post(
            stack.v1 + "/chat/completions", json=chat(script({"text": "ok"}), reasoning=False)
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"] == "ok"
        body = await last_body(stack)
        sent = body if vendor == "openai" else thinking_sent(body)
        assert {k: sent.get(k) for k in least} == least


@pytest.mark.parametrize(
    ("vendor", "model", "effort", "sent"),
    [
        ("openai", "gpt-5", "none", {"reasoning_effort": "minimal"}),
        ("openai", "gpt-5.1-2025-11-13", "none", {"reasoning_effort": "none"}),
        ("gemini", "gemini-2.5-flash", "none", {"thinkingBudget": 0}),
        ("gemini", "gemini-3-pro-preview", "medium", {"thinkingLevel": "HIGH"}),
        ("gemini", "gemini-3-flash-preview", "none", {"thinkingLevel": "MINIMAL"}),
    ],
)
async def test_each_model_is_sent_the_effort_it_takes(
    vendor: str, model: str, effort: str, sent: dict[str, Any]
) -> None:
    async with cloud(vendor, model) as stack, httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(
            stack.v1 + "/chat/completions",
            json=chat(script({"text": "ok"}), reasoning_effort=effort, temperature=0.3),
        )
        assert answer.status_code == 200, answer.text
        body = await last_body(stack)
        got = body if vendor == "openai" else thinking_sent(body)
        assert {k: got.get(k) for k in sent} == sent
