"""``/v1/completions`` and ``/v1/embeddings`` with the official openai SDK as the judge: a real
gateway on a real socket in front of simulators (vLLM generating, vLLM pooling, Anthropic)."""

from __future__ import annotations

import base64
import math
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import openai
import pytest
import trio
from openai import AsyncOpenAI

from tests.e2e.harness import (
    FAST_SIM,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from tests.e2e.test_usage_ledger import cli, ledger_rows
from trio_gateway.config.load import parse_config
from trio_gateway.core.keys import hash_key, new_key
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.sim import SimHandle

PRICES = "price_input_per_mtok = 1000.0\nprice_output_per_mtok = 1000.0\n"  # 1e-3 per token
# alice: a budget of 1.0 at 1e-3 a token covers a prompt and a completion's 16 default
# tokens, not the 4,096 a chat request without max_tokens may generate. bob: embeddings only.
BUDGET = "budget = 1.0"


@attrs.frozen
class Endpoints:
    gateway: GatewayHandle
    generate: SimHandle
    pooling: SimHandle
    anthropic: SimHandle
    ledger: Path
    keys: dict[str, str]

    @property
    def v1(self) -> str:
        return self.gateway.base_url + "/v1"

    def client(self, key: str = "alice") -> AsyncOpenAI:
        return AsyncOpenAI(base_url=self.v1, api_key=self.keys[key], max_retries=0)


def anthropic_toml(alias: str, sim: SimHandle, weight: int = 100) -> str:
    return f"""
[[aliases.{alias}.providers]]
name = "claude-{alias}"
type = "anthropic"
base_url = "{sim.base_url}"
model = "qwen3-32b"
api_key_env = "SIM_KEY"
weight = {weight}
probe = false
"""


@asynccontextmanager
async def endpoints_stack(tmp_path: Path, *, max_inflight: int = 8) -> AsyncIterator[Endpoints]:
    keys = {"alice": new_key(), "bob": new_key()}
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(
        f'[keys.alice]\nsha256 = "{hash_key(keys["alice"])}"\n{BUDGET}\n'
        f'[keys.bob]\nsha256 = "{hash_key(keys["bob"])}"\naliases = ["embed"]\n'
    )
    ledger = tmp_path / "usage.sqlite3"
    pooling_config = attrs.evolve(FAST_SIM, runner="pooling")
    anthropic_config = attrs.evolve(FAST_SIM, dialect="anthropic")
    async with (
        running_sim() as generate,
        running_sim(pooling_config) as pooling,
        running_sim(anthropic_config) as anthropic,
    ):
        roomy = PRICES + "queue_timeout_s = 0.0\n"
        vllm = provider_toml("vllm", generate.base_url, max_inflight=max_inflight, extra=roomy)
        embed = provider_toml("embed", pooling.base_url, alias="embed", extra=PRICES)
        fallback = provider_toml("vllm-b", generate.base_url, alias="mixed", weight=0)
        text = (
            # status = "open": the test reads /metrics with no key.
            f'[server]\nlisten = "127.0.0.1:0"\nstatus = "open"\n'
            f'[auth]\nkeys_file = "{keys_file}"\n'
            f'[usage]\nledger = "{ledger}"\nflush_interval_s = 0.05\n'
            f"[aliases.agent-lite]\n{vllm}[aliases.embed]\n{embed}"
            f"[aliases.claude]\n{anthropic_toml('claude', anthropic)}"
            f"[aliases.mixed]\n{anthropic_toml('mixed', anthropic)}{fallback}"
        )
        config = parse_config(text, source="test.toml", environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as gateway:
            yield Endpoints(gateway, generate, pooling, anthropic, ledger, keys)


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Endpoints]:
    async with endpoints_stack(tmp_path) as s:
        yield s


async def test_a_completion_not_streamed(stack: Endpoints) -> None:
    client = stack.client()
    completion = await client.completions.create(
        model="agent-lite", prompt="Say hi " + script({"text": "Hello 世界 🌍"}), max_tokens=50
    )
    assert completion.model == "agent-lite" and completion.object == "text_completion"
    assert completion.id.startswith("cmpl-")
    [choice] = completion.choices
    assert (choice.index, choice.text, choice.finish_reason) == (0, "Hello 世界 🌍", "stop")
    # "Hello", " 世", "界", " 🌍" and the end-of-sequence token.
    assert completion.usage is not None and completion.usage.completion_tokens == 5
    assert completion.usage.prompt_tokens > 0
    sent = stack.generate.engine.stats().last_request_body
    assert sent["model"] == "qwen3-32b" and sent["stream"] is True
    await client.close()


async def test_a_completion_streamed_with_and_without_usage(stack: Endpoints) -> None:
    client = stack.client()
    prompt = "Count " + script({"text": "one two three"})
    stream = await client.completions.create(
        model="agent-lite", prompt=prompt, stream=True, stream_options={"include_usage": True}
    )
    pieces, finish, usage = [], None, None
    async for chunk in stream:
        assert chunk.object == "text_completion" and chunk.model == "agent-lite"
        usage = chunk.usage or usage
        for choice in chunk.choices:
            pieces.append(choice.text)
            finish = choice.finish_reason or finish
    assert "".join(pieces) == "one two three" and len(pieces) >= 3
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens == 4
    plain = await client.completions.create(model="agent-lite", prompt=prompt, stream=True)
    chunks = [chunk async for chunk in plain]
    assert all(chunk.usage is None for chunk in chunks)
    assert "".join(c.text for chunk in chunks for c in chunk.choices) == "one two three"
    await client.close()


async def test_several_prompts_are_several_choices(stack: Endpoints) -> None:
    client = stack.client()
    completion = await client.completions.create(
        model="agent-lite",
        prompt=[script({"text": "first"}), script({"text": "second"})],
        max_tokens=10,
    )
    assert [(c.index, c.text) for c in completion.choices] == [(0, "first"), (1, "second")]
    stream = await client.completions.create(
        model="agent-lite", prompt=[[1, 2, 3], [4, 5]], max_tokens=3, stream=True
    )
    by_index: dict[int, str | None] = {}
    async for chunk in stream:
        for choice in chunk.choices:
            by_index[choice.index] = choice.finish_reason or by_index.get(choice.index)
    assert by_index == {0: "length", 1: "length"}
    await client.close()


async def test_embeddings_as_floats_and_as_base64(stack: Endpoints) -> None:
    client = stack.client()
    # The SDK asks for base64 on the wire unless told otherwise, and decodes it.
    packed = await client.embeddings.create(model="embed", input=["hello world", "bonjour"])
    floats = await client.embeddings.create(
        model="embed", input=["hello world", "bonjour"], encoding_format="float"
    )
    assert packed.model == floats.model == "embed"
    assert [d.index for d in floats.data] == [0, 1]
    assert [d.embedding for d in packed.data] == [d.embedding for d in floats.data]
    vector = floats.data[0].embedding
    assert len(vector) == 128 and math.isclose(math.fsum(v * v for v in vector), 1.0, abs_tol=1e-5)
    assert floats.data[0].embedding != floats.data[1].embedding
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == 3
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {stack.keys['bob']}"}) as raw:
        wire = await raw.post(
            stack.v1 + "/embeddings",
            json={"model": "embed", "input": "hello world", "encoding_format": "base64"},
        )
    text = wire.json()["data"][0]["embedding"]
    assert list(struct.unpack("<128f", base64.b64decode(text))) == vector
    await client.close()


async def test_unsupported_endpoints_are_refused_clearly(stack: Endpoints) -> None:
    client = stack.client()
    # Anthropic does not serve them: refused before any upstream call.
    with pytest.raises(openai.BadRequestError) as anthropic:
        await client.completions.create(model="claude", prompt="x")
    assert anthropic.value.code == "unsupported_endpoint"
    assert "claude-claude is anthropic" in anthropic.value.message
    with pytest.raises(openai.BadRequestError) as anthropic_embeds:
        await client.embeddings.create(model="claude", input="x")
    assert anthropic_embeds.value.code == "unsupported_endpoint"
    assert stack.anthropic.engine.stats().requests == 0
    # A vLLM serving a chat model has no /v1/embeddings (its 404): the same error, and the
    # provider is not marked down for it.
    with pytest.raises(openai.BadRequestError) as chat_model:
        await client.embeddings.create(model="agent-lite", input="x")
    assert chat_model.value.code == "unsupported_endpoint"
    assert stack.gateway.router.health["vllm"].state.value == "healthy"
    # An alias with Anthropic first: a completion goes to its vLLM fallback only.
    mixed = await client.completions.create(model="mixed", prompt=script({"text": "ok"}))
    assert mixed.choices[0].text == "ok"
    assert stack.anthropic.engine.stats().requests == 0
    await client.close()


async def test_bodies_are_checked_as_openai_checks_them(stack: Endpoints) -> None:
    headers = {"authorization": f"Bearer {stack.keys['alice']}"}
    cases: list[tuple[str, dict[str, Any], str, str | None]] = [
        ("/completions", {"model": "agent-lite"}, "invalid_request", "prompt"),
        ("/completions", {"model": "agent-lite", "prompt": 5}, "invalid_request", "prompt"),
        ("/completions", {"model": "agent-lite", "prompt": []}, "invalid_request", "prompt"),
        (
            "/completions",
            {"model": "agent-lite", "prompt": "x", "logprobs": 2},
            "unsupported_parameter",
            "logprobs",
        ),
        ("/embeddings", {"model": "embed", "input": ""}, "invalid_request", "input"),
        ("/embeddings", {"model": "embed", "input": ["a", 1]}, "invalid_request", "input[1]"),
        (
            "/embeddings",
            {"model": "embed", "input": "a", "encoding_format": "hex"},
            "invalid_request",
            "encoding_format",
        ),
        ("/embeddings", {"model": "nope", "input": "a"}, "model_not_found", "model"),
    ]
    async with httpx.AsyncClient(headers=headers) as client:
        for path, body, code, param in cases:
            response = await client.post(stack.v1 + path, json=body)
            error = response.json()["error"]
            assert (error["code"], error["param"]) == (code, param), (path, body, error)
            assert response.status_code == (404 if code == "model_not_found" else 400)
    assert stack.generate.engine.stats().requests == stack.pooling.engine.stats().requests == 0


async def test_keys_budgets_and_usage_records_name_the_endpoint(stack: Endpoints) -> None:
    alice, bob = stack.client("alice"), stack.client("bob")
    with pytest.raises(openai.PermissionDeniedError) as denied:
        await bob.completions.create(model="agent-lite", prompt="x")
    assert denied.value.code == "alias_not_allowed"
    # Within alice's budget only because a completion reserves 16 tokens, an embedding none.
    completion = await alice.completions.create(model="agent-lite", prompt=script({"text": "a"}))
    embedded = await alice.embeddings.create(model="embed", input="hello")
    with pytest.raises(openai.APIStatusError) as over:
        await alice.chat.completions.create(
            model="agent-lite", messages=[{"role": "user", "content": "hi"}]
        )
    assert over.value.status_code == 402
    with trio.fail_after(5):
        while len(rows := ledger_rows(stack.ledger)) < 4:  # noqa: ASYNC110 - batched writes
            await trio.sleep(0.02)
    seen = [(r["endpoint"], r["key"], r["outcome"], r["error_code"]) for r in rows]
    assert seen == [
        ("completions", "bob", "refused", "alias_not_allowed"),
        ("completions", "alice", "completed", None),
        ("embeddings", "alice", "completed", None),
        ("chat", "alice", "refused", "budget_exceeded"),
    ]
    assert completion.usage is not None
    assert (rows[1]["prompt_tokens"], rows[1]["completion_tokens"]) == (
        completion.usage.prompt_tokens,
        completion.usage.completion_tokens,
    )
    assert (rows[2]["prompt_tokens"], rows[2]["completion_tokens"]) == (
        embedded.usage.prompt_tokens,
        0,
    )
    table = await cli(["usage", "--ledger", str(stack.ledger), "--by", "endpoint"])
    assert [line.split()[:2] for line in table.splitlines()[1:4]] == [
        ["chat", "1"],
        ["completions", "2"],
        ["embeddings", "1"],
    ]
    await alice.close()
    await bob.close()


async def test_a_client_leaving_a_streamed_completion_aborts_the_upstream(
    stack: Endpoints,
) -> None:
    client = stack.client()
    prompt = script({"text": "a b"}, {"delay_s": 60}, {"text": "never"})
    stream = await client.completions.create(model="agent-lite", prompt=prompt, stream=True)
    async for chunk in stream:
        assert chunk.choices[0].text == "a"
        break
    await stream.close()
    with trio.fail_after(10):
        stats = await stack.generate.engine.wait_until(lambda s: s.aborts == 1)
    assert stats.running == 0
    await client.close()


async def test_completions_hold_a_slot_of_max_inflight(tmp_path: Path) -> None:
    async with endpoints_stack(tmp_path, max_inflight=1) as stack:
        client = stack.client()
        prompt = script({"text": "a"}, {"delay_s": 60}, {"text": "b"})
        stream = await client.completions.create(model="agent-lite", prompt=prompt, stream=True)
        async for _ in stream:
            break  # the first chunk: the slot is held
        with pytest.raises(openai.APIStatusError) as busy:
            await client.completions.create(model="agent-lite", prompt="x")
        assert (busy.value.status_code, busy.value.code) == (503, "overloaded")
        await stream.close()
        async with httpx.AsyncClient() as raw:
            metrics = (await raw.get(stack.gateway.base_url + "/metrics")).text
        assert 'gateway_http_requests_total{route="/v1/completions",status="200"} 1.0' in metrics
        await client.close()


async def test_an_embedding_model_is_probed_with_an_embedding() -> None:
    """A vLLM serving an embedding model has no chat: probed with one, it would be marked
    down; ``probe_endpoint = "embeddings"`` asks it what it serves."""
    probing = (
        "probe_interval_s = 0.05\nprobe_timeout_s = 2.0\nstartup_grace_s = 0.0\n"
        "unhealthy_after = 1\nhealthy_after = 1\n"
    )
    async with running_sim(attrs.evolve(FAST_SIM, runner="pooling")) as pooling:
        embeddings = probing + 'probe_endpoint = "embeddings"\n'
        good = provider_toml("embed", pooling.base_url, alias="embed", probe=True, extra=embeddings)
        chat = provider_toml("chat", pooling.base_url, alias="embed", probe=True, extra=probing)
        text = f'[server]\nlisten = "127.0.0.1:0"\n[aliases.embed]\n{good}{chat}'
        config = parse_config(text, source="test.toml", environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as gateway:
            health = gateway.router.health
            await wait_until(
                lambda: (
                    (health["embed"].state.value, health["chat"].state.value)
                    == ("healthy", "unhealthy")
                )
            )
