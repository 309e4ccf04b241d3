"""The deployment the gateway was designed for, end to end: an alias on a text-only vLLM
(weight 100) with cloud vendors behind it (weight 0), each a simulator speaking that vendor's
wire, each answer checked through the official openai SDK and raw httpx."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import openai
import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.e2e.harness import FAST_SIM, chat, running_gateway, script, wait_until
from trio_gateway.config.load import parse_config
from trio_gateway.dispatch.router import QUOTA_COOL_DOWN_S
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.sim import SimHandle, serve_sim

KEYS = {
    "vllm": "sim-key",
    "openai": "sk-openai-secret-0123456789abcdef",
    "anthropic": "sk-ant-secret-0123456789abcdef",
    "gemini": "AIzaGeminiSecret0123456789abcdefghij",
}
ENV = {f"{name.upper()}_KEY": key for name, key in KEYS.items()}
# Each vendor's simulator serves a model of a known family, so it refuses what that model
# refuses (sim/vendor_models.py); vLLM and Anthropic's simulators judge no model name.
MODELS = {
    "vllm": "qwen3-32b",
    "openai": "gpt-5.1",
    "anthropic": "qwen3-32b",
    "gemini": "gemini-2.5-flash",
}
PROVIDER_TYPE = {
    "vllm": "openai_compatible",
    "openai": "openai",
    "anthropic": "anthropic",
    "gemini": "gemini",
}
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
PIXEL = (
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def provider(name: str, sim: SimHandle, *, weight: int, vision: bool, max_inflight: int = 8) -> str:
    kind = PROVIDER_TYPE[name]
    base = sim.base_url + ("/v1" if kind in ("openai_compatible", "openai") else "")
    capabilities = ["tools", "reasoning", "json_schema"] + (["vision"] if vision else [])
    return f"""
[[aliases.agent-lite.providers]]
name = "{name}"
type = "{kind}"
base_url = "{base}"
model = "{MODELS[name]}"
api_key_env = "{name.upper()}_KEY"
max_inflight = {max_inflight}
queue_timeout_s = 0.0
capabilities = {json.dumps(capabilities)}
weight = {weight}
probe = false
"""


@attrs.frozen
class Fleet:
    gateway: GatewayHandle
    sims: dict[str, SimHandle]

    @property
    def v1(self) -> str:
        return self.gateway.base_url + "/v1"

    async def last_body(self, name: str) -> dict[str, Any]:
        async with httpx.AsyncClient() as client:
            stats = (await client.get(self.sims[name].base_url + "/sim/stats?bodies=1")).json()
        body: dict[str, Any] = stats["last_request_body"]
        return body


@asynccontextmanager
async def fleet(
    names: tuple[str, ...] = ("vllm", "anthropic", "gemini"),
    *,
    keys: dict[str, str] | None = None,
    vllm_inflight: int = 8,
) -> AsyncIterator[Fleet]:
    """vLLM first (weight 100, text only); every other vendor weight 0 with vision."""
    async with trio.open_nursery() as nursery:
        sims: dict[str, SimHandle] = {}
        for name in names:
            dialect = "vllm" if name == "vllm" else name
            sim_config = attrs.evolve(
                FAST_SIM, dialect=dialect, api_key=KEYS[name], served_model_name=MODELS[name]
            )
            sims[name] = await nursery.start(serve_sim, sim_config)
        text = '[server]\nlisten = "127.0.0.1:0"\n[aliases.agent-lite]\n' + "".join(
            provider(
                name,
                sims[name],
                weight=100 if name == "vllm" else 0,
                vision=name != "vllm",
                max_inflight=vllm_inflight if name == "vllm" else 8,
            )
            for name in names
        )
        env = dict(ENV)
        for name, key in (keys or {}).items():
            env[f"{name.upper()}_KEY"] = key
        config = parse_config(text, source="test.toml", environ=env)
        async with running_gateway(config) as gateway:
            yield Fleet(gateway=gateway, sims=sims)
        nursery.cancel_scope.cancel()


def only(name: str, *others: str) -> tuple[str, ...]:
    return (name, *others)


async def test_an_image_request_skips_the_text_only_vllm() -> None:
    async with fleet(("vllm", "anthropic")) as f, httpx.AsyncClient(timeout=10) as client:
        content = [
            {"type": "text", "text": "what is this? " + script({"text": "a pixel"})},
            {"type": "image_url", "image_url": {"url": PIXEL}},
        ]
        body = {"model": "agent-lite", "messages": [{"role": "user", "content": content}]}
        response = await client.post(f.v1 + "/chat/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "a pixel"
        assert f.sims["vllm"].engine.stats().requests == 0
        assert f.sims["anthropic"].engine.stats().requests == 1
        sent = (await f.last_body("anthropic"))["messages"][0]["content"]
        image = next(block for block in sent if block["type"] == "image")
        assert image["source"]["type"] == "base64"
        assert image["source"]["media_type"] == "image/png"


async def test_a_saturated_vllm_spills_to_the_cloud() -> None:
    async with (
        fleet(("vllm", "gemini"), vllm_inflight=1) as f,
        httpx.AsyncClient(timeout=10) as client,
        trio.open_nursery() as nursery,
    ):
        holding = trio.Event()

        async def hold_the_only_slot() -> None:
            long = chat(script({"text": "held"}, {"delay_s": 30}), stream=True)
            async with client.stream("POST", f.v1 + "/chat/completions", json=long) as r:
                async for _ in r.aiter_bytes():
                    holding.set()

        nursery.start_soon(hold_the_only_slot)
        await holding.wait()
        response = await client.post(
            f.v1 + "/chat/completions", json=chat(script({"text": "from the cloud"}))
        )
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "from the cloud"
        assert f.sims["gemini"].engine.stats().requests == 1
        nursery.cancel_scope.cancel()


TOOL_SCRIPT = script({"tool_call": {"name": "get_weather", "arguments": {"city": "Paris 巴黎"}}})


@pytest.mark.parametrize("vendor", ["vllm", "openai", "anthropic", "gemini"])
async def test_the_same_tool_call_arrives_assembled_the_same_from_every_vendor(
    vendor: str,
) -> None:
    async with fleet(only(vendor)) as f:
        client = openai.AsyncOpenAI(base_url=f.v1, api_key="unused", max_retries=0)
        whole = await client.chat.completions.create(
            model="agent-lite",
            messages=[{"role": "user", "content": "weather? " + TOOL_SCRIPT}],
            tools=[WEATHER],
        )
        choice = whole.choices[0]
        assert choice.finish_reason == "tool_calls"
        calls = choice.message.tool_calls or []
        assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [  # type: ignore[union-attr]
            ("get_weather", {"city": "Paris 巴黎"})
        ]
        assert calls[0].id
        stream = await client.chat.completions.create(
            model="agent-lite",
            messages=[{"role": "user", "content": "weather? " + TOOL_SCRIPT}],
            tools=[WEATHER],
            stream=True,
            stream_options={"include_usage": True},
        )
        ids: set[str] = set()
        arguments = ""
        finish = None
        usage = None
        async for chunk in stream:
            usage = chunk.usage or usage
            for c in chunk.choices:
                finish = c.finish_reason or finish
                for fragment in c.delta.tool_calls or []:
                    if fragment.id:
                        ids.add(fragment.id)
                    if fragment.function and fragment.function.arguments:
                        arguments += fragment.function.arguments
        assert finish == "tool_calls"
        assert len(ids) == 1
        assert json.loads(arguments) == {"city": "Paris 巴黎"}
        assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0


def reasoning_sent(vendor: str, body: dict[str, Any]) -> object:
    """What the vendor was told about thinking, in its own form."""
    if vendor == "vllm":
        return body.get("chat_template_kwargs", {}).get("enable_thinking")
    if vendor == "openai":
        return body.get("reasoning_effort")
    if vendor == "anthropic":
        return (body.get("thinking") or {}).get("type")
    config = body.get("generationConfig") or body.get("generation_config") or {}
    thinking = config.get("thinkingConfig") or {}
    return thinking.get("thinkingBudget")


@pytest.mark.parametrize(
    ("vendor", "on", "off"),
    [
        ("vllm", True, False),
        ("openai", "low", "none"),  # gpt-5.1 refuses "minimal"
        ("anthropic", "enabled", "disabled"),
        ("gemini", 2048, 0),
    ],
)
async def test_reasoning_on_and_off_reach_each_vendor_in_its_own_form(
    vendor: str, on: object, off: object
) -> None:
    thought = script({"reasoning": "let me think"}, {"text": "42"})
    async with fleet(only(vendor)) as f, httpx.AsyncClient(timeout=10) as client:
        answer = await client.post(
            f.v1 + "/chat/completions",
            json=chat(thought, reasoning_effort="low", stream=True),
        )
        assert answer.status_code == 200, answer.text
        assert reasoning_sent(vendor, await f.last_body(vendor)) == on
        deltas = [
            json.loads(line[6:])["choices"][0]["delta"]
            for line in answer.text.split("\n")
            if line.startswith("data: {") and '"choices":[{' in line
        ]
        content = "".join(d.get("content") or "" for d in deltas)
        reasoning = "".join(d.get("reasoning_content") or "" for d in deltas)
        # Thinking never arrives as content (vLLM's Qwen3 writes a blank line after it).
        assert content.strip() == "42"
        if vendor != "openai":  # OpenAI never shows reasoning text in chat completions
            assert reasoning == "let me think"
        answer = await client.post(f.v1 + "/chat/completions", json=chat(thought, reasoning=False))
        assert answer.status_code == 200, answer.text
        assert reasoning_sent(vendor, await f.last_body(vendor)) == off
        message = answer.json()["choices"][0]["message"]
        assert message["content"].strip() == "42"
        assert "reasoning_content" not in message


@pytest.mark.parametrize("vendor", ["openai", "anthropic", "gemini"])
async def test_a_client_that_leaves_closes_the_vendor_stream_at_once(vendor: str) -> None:
    async with fleet(only(vendor)) as f, httpx.AsyncClient(timeout=10) as client:
        long = chat(script({"text": "start"}, {"text_tokens": 100000}), stream=True)
        async with client.stream("POST", f.v1 + "/chat/completions", json=long) as response:
            assert response.status_code == 200
            async for _ in response.aiter_bytes():
                break
        sim = f.sims[vendor]
        with trio.fail_after(10):
            stats = await sim.engine.wait_until(lambda s: s.aborts == 1)
        assert stats.tokens_generated < 1000
        await wait_until(lambda: f.gateway.router.upstreams[vendor].statistics().in_flight == 0)


@pytest.mark.parametrize("vendor", ["openai", "anthropic", "gemini"])
async def test_no_vendor_credential_appears_in_any_answer_header_or_log(
    vendor: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = KEYS[vendor][:-6] + "WRONG!"
    async with fleet(only(vendor), keys={vendor: wrong}) as f, httpx.AsyncClient() as client:
        answers = [
            await client.post(f.v1 + "/chat/completions", json=chat(stream=stream))
            for stream in (False, True)
        ]
        scripted = script({"status": 401})
        async with fleet(only(vendor)) as g:
            answers.append(await client.post(g.v1 + "/chat/completions", json=chat(scripted)))
            answers.append(await client.get(g.gateway.base_url + "/metrics"))
            answers.append(await client.get(g.gateway.base_url + "/readyz"))
    for answer in answers[:3]:
        assert answer.status_code == 502, answer.text
        assert answer.json()["error"]["code"] == "upstream_auth_failed"
    for secret in (wrong, KEYS[vendor]):
        for answer in answers:
            assert secret not in answer.text
            assert all(secret not in value for value in answer.headers.values())
        assert all(secret not in record.getMessage() for record in caplog.records)
    assert "Secret" not in repr(f.gateway.router.upstreams[vendor].config)


def key_pair() -> tuple[str, str]:
    """A service account's RSA key made here (never a real one): private and public PEM."""
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ).decode()
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return private, public.decode()


@pytest.mark.parametrize(("lifetime_s", "grants"), [(3600, 1), (60, 3)])
async def test_vertex_signs_a_jwt_exchanges_it_and_refreshes_before_expiry(
    tmp_path: Path, lifetime_s: int, grants: int
) -> None:
    """A service account's token is fetched once and reused while it has more than the
    refresh margin (5 min) left; a 60 s token is refreshed on every use. The simulator checks
    the JWT's signature with the account's public key."""
    private, public = key_pair()
    config_sim = attrs.evolve(
        FAST_SIM,
        dialect="gemini",
        api_key=None,
        oauth_public_key_pem=public,
        oauth_token_lifetime_s=lifetime_s,
        vertex_require_token=True,
    )
    async with trio.open_nursery() as nursery:
        sim: SimHandle = await nursery.start(serve_sim, config_sim)
        path = tmp_path / "sa.json"
        account = {
            "type": "service_account",
            "client_email": "gateway@project.iam.gserviceaccount.com",
            "private_key_id": "k1",
            "private_key": private,
            "token_uri": sim.base_url + "/token",
        }
        path.write_text(json.dumps(account))
        text = f"""
[server]
listen = "127.0.0.1:0"
[aliases.agent-lite]
[[aliases.agent-lite.providers]]
name = "vertex"
type = "vertex"
base_url = "{sim.base_url}"
project = "my-project"
location = "europe-west4"
model = "qwen3-32b"
credentials_file = "{path}"
probe = false
"""
        config = parse_config(text, source="test.toml", environ={})
        async with running_gateway(config) as gateway, httpx.AsyncClient(timeout=10) as client:
            for i in range(3):
                response = await client.post(
                    gateway.base_url + "/v1/chat/completions",
                    json=chat(script({"text": f"answer {i}"})),
                )
                assert response.status_code == 200, response.text
                assert response.json()["choices"][0]["message"]["content"] == f"answer {i}"
        assert sim.engine.stats().token_grants == grants
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(("status", "error"), [(529, "overloaded_error"), (429, "billing_error")])
async def test_a_busy_or_exhausted_vendor_rests_and_the_next_one_answers(
    status: int, error: str
) -> None:
    """An overloaded Anthropic (529) rests for its Retry-After, one whose credit is gone for
    QUOTA_COOL_DOWN_S: neither counts against its health, and meanwhile the alias's next
    provider answers without the resting one being asked. (The script fails its first request
    at every simulator that reads it, so the first answer is an error that lists both.)"""
    async with fleet(("anthropic", "gemini")) as f, httpx.AsyncClient(timeout=10) as client:
        busy = script({"status": status, "retry_after": 30, "error": error})
        first = await client.post(f.v1 + "/chat/completions", json=chat(busy))
        codes = [a["code"] for a in first.json()["error"]["attempts"]]
        assert codes[0] == ("upstream_overloaded" if status == 529 else "quota_exhausted")
        now = trio.current_time()
        anthropic = f.gateway.router.health["anthropic"]
        assert anthropic.cooling_down(now + 29)
        assert anthropic.cooling_down(now + QUOTA_COOL_DOWN_S - 1) is (status == 429)
        assert anthropic.snapshot(now).consecutive_failures == 0
        if status == 429:
            return  # the Gemini simulator read the same script: it rests too (rate_limited)
        fine = script({"text": "hi"})
        second = await client.post(f.v1 + "/chat/completions", json=chat(fine))
        assert second.status_code == 200, second.text
        assert second.json()["choices"][0]["message"]["content"] == "hi"
        assert f.sims["anthropic"].engine.stats().requests == 1
        assert f.sims["gemini"].engine.stats().requests == 2
