"""Stored responses: ``store`` (the default) keeps a response for ``GET``/``DELETE
/v1/responses/{id}`` and ``previous_response_id``, per key, in SQLite next to the usage ledger
or in Redis; ``store: false`` keeps nothing; a tool loop continues by ``previous_response_id``
with the openai SDK, signed thinking included."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.e2e.harness import Stack, provider_toml, running_gateway, running_sim, script
from tests.e2e.test_limits import redis_toml
from tests.e2e.test_responses_tool_loop import WEATHER
from tests.e2e.test_thinking_tool_loop import QUESTION, replayed, vendor_fleet
from tests.e2e.test_usage_ledger import ledger_rows
from tests.redis_server import RedisServer, running_redis
from trio_gateway.accounting.response_store import RESPONSES_FILE
from trio_gateway.config.load import parse_config
from trio_gateway.core.keys import hash_key, new_key

TIMEOUT_S = 10


def keyed_toml(tmp_path: Path, sim_url: str, keys: dict[str, str], extra: str = "") -> str:
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(
        "".join(f'[keys.{n}]\nsha256 = "{hash_key(k)}"\n' for n, k in keys.items())
    )
    return (
        f'[server]\nlisten = "127.0.0.1:0"\n[auth]\nkeys_file = "{keys_file}"\n{extra}'
        f"[aliases.agent-lite]\n{provider_toml('sim-a', sim_url)}"
    )


def sdk(base: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=base + "/v1", api_key=key, max_retries=0)


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
async def test_a_stored_response_is_its_key_s_alone(tmp_path: Path, backend: str) -> None:
    async with AsyncExitStack() as stack:
        redis = await stack.enter_async_context(running_redis()) if backend == "redis" else None
        await key_s_alone(tmp_path, redis)


async def key_s_alone(tmp_path: Path, redis: RedisServer | None) -> None:
    keys = {"alice": new_key(), "bob": new_key()}
    ledger = tmp_path / "data" / "usage.sqlite3"
    async with running_sim() as sim:
        extra = f'[usage]\nledger = "{ledger}"\nflush_interval_s = 0.05\n'
        if redis is not None:
            extra += f'[redis]\nurl = "{redis.url}"\nkey_prefix = "t:"\n'
        text = keyed_toml(tmp_path, sim.base_url, keys, extra)
        config = parse_config(text, source="t.toml", environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as gateway:
            alice, bob = sdk(gateway.base_url, keys["alice"]), sdk(gateway.base_url, keys["bob"])
            made = await alice.responses.create(
                model="agent-lite", input=script({"text": "kept"}), metadata={"a": "1"}
            )
            got = await alice.responses.retrieve(made.id)
            assert (got.id, got.output_text, got.status) == (made.id, "kept", "completed")
            assert got.metadata == {"a": "1"}
            for attempt in (
                bob.responses.retrieve(made.id),
                bob.responses.delete(made.id),
                bob.responses.create(model="agent-lite", input="x", previous_response_id=made.id),
            ):
                with pytest.raises(openai.NotFoundError) as hidden:
                    await attempt
                assert hidden.value.code == "response_not_found"
            # The continuation reads alice's conversation.
            follow = await alice.responses.create(
                model="agent-lite", input=script({"text": "again"}), previous_response_id=made.id
            )
            assert follow.previous_response_id == made.id
            await alice.responses.delete(made.id)
            with pytest.raises(openai.NotFoundError):
                await alice.responses.retrieve(made.id)
            unstored = await alice.responses.create(model="agent-lite", input="x", store=False)
            with pytest.raises(openai.NotFoundError):
                await alice.responses.retrieve(unstored.id)
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as raw:
                nobody = await raw.get(gateway.base_url + f"/v1/responses/{follow.id}")
            assert nobody.status_code == 401
            await alice.close()
            await bob.close()
        sent = (await Stack(sim=sim, gateway=gateway).sim_stats())["last_request_body"]
    # The stored turn before the new input (the store=false request was the last one sent).
    assert sent["messages"] == [{"role": "user", "content": "x"}]
    assert (ledger.parent / RESPONSES_FILE).exists() == (redis is None)
    rows = ledger_rows(ledger)
    assert [r["endpoint"] for r in rows] == ["responses"] * 4
    assert [(r["key"], r["error_code"]) for r in rows] == [
        ("alice", None),
        ("bob", "response_not_found"),
        ("alice", None),
        ("alice", None),
    ]


async def test_previous_response_id_carries_the_conversation(stack: Stack) -> None:
    client = openai.AsyncOpenAI(base_url=stack.v1, api_key="unused", max_retries=0)
    first = await client.responses.create(
        model="agent-lite", input=script({"text": "one"}), instructions="first rules"
    )
    second = await client.responses.create(
        model="agent-lite",
        input=script({"text": "two"}),
        previous_response_id=first.id,
        instructions="new rules",
    )
    assert second.output_text == "two"
    sent = (await stack.sim_stats())["last_request_body"]
    # As at OpenAI: the earlier instructions are not carried over, the turns are.
    assert sent["messages"] == [
        {"role": "system", "content": "new rules"},
        {"role": "user", "content": script({"text": "one"})},
        {"role": "assistant", "content": "one"},
        {"role": "user", "content": script({"text": "two"})},
    ]
    await client.close()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_tool_loop_by_previous_response_id_keeps_anthropic_thinking(stream: bool) -> None:
    async with vendor_fleet("anthropic") as f:
        client = openai.AsyncOpenAI(base_url=f.v1, api_key="unused", max_retries=0)
        kwargs: Any = {"model": "agent-lite", "tools": [WEATHER], "reasoning": {"effort": "low"}}
        items: list[Any] = [{"role": "user", "content": QUESTION}]
        previous_id: str | None = None
        for step in range(3):
            if stream:
                async with client.responses.stream(
                    input=items, previous_response_id=previous_id, **kwargs
                ) as events:
                    response = await events.get_final_response()
            else:
                response = await client.responses.create(
                    input=items, previous_response_id=previous_id, **kwargs
                )
            assert response.status == "completed"
            sent = await f.last_body("anthropic")
            if step:
                # The signed thinking of the stored turn, back to Anthropic as it sent it.
                block = replayed("anthropic", sent)
                assert block["type"] == "thinking" and block["signature"]
                assert block["thinking"] == "I should look it up"
            call = next(item for item in response.output if item.type == "function_call")
            assert json.loads(call.arguments) == {"city": "Paris"}
            previous_id = response.id
            items = [{"type": "function_call_output", "call_id": call.call_id, "output": "18C"}]
        assert len(sent["messages"]) == 1 + 2 * 2
        await client.close()


async def test_responses_in_redis_are_every_gateway_s() -> None:
    async with running_redis() as redis, running_sim() as sim:
        text = (
            f'[server]\nlisten = "127.0.0.1:0"\n{redis_toml(redis)}'
            f"[aliases.agent-lite]\n{provider_toml('sim-a', sim.base_url)}"
        )
        config = parse_config(text, source="t.toml", environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as first, running_gateway(config) as second:
            one, other = sdk(first.base_url, "unused"), sdk(second.base_url, "unused")
            made = await one.responses.create(model="agent-lite", input=script({"text": "r"}))
            # At once, from another gateway: a whole answer is stored before it is sent.
            assert (await other.responses.retrieve(made.id)).output_text == "r"
            follow = await other.responses.create(
                model="agent-lite", input=script({"text": "s"}), previous_response_id=made.id
            )
            assert follow.output_text == "s"
            await other.responses.delete(made.id)
            with pytest.raises(openai.NotFoundError):
                await one.responses.retrieve(made.id)
            await one.close()
            await other.close()
