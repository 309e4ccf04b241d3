"""``POST /v1/messages`` with the official ``anthropic`` SDK as the judge: sync (in a thread) and
async, whole and streamed (``messages.stream(...).get_final_message()``), errors in Anthropic's
shape with its statuses, keys as ``x-api-key`` or bearer, and the usage record's endpoint."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
import trio

from tests.e2e.harness import Stack, provider_toml, running_gateway, running_sim, script
from tests.e2e.test_usage_ledger import ledger_rows
from trio_gateway.config.load import parse_config
from trio_gateway.core.keys import hash_key, new_key

HELLO = script({"reasoning": "think 思考"}, {"text": "Hello 世界 🌍"})


def user(content: Any) -> list[Any]:
    return [{"role": "user", "content": content}]


def async_client(stack: Stack, key: str = "unused") -> anthropic.AsyncAnthropic:
    # The SDK appends /v1/messages to the base URL, as to https://api.anthropic.com.
    return anthropic.AsyncAnthropic(base_url=stack.gateway.base_url, api_key=key, max_retries=0)


def texts(message: Any) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


async def test_async_whole_answer_is_a_message(stack: Stack) -> None:
    client = async_client(stack)
    message = await client.messages.create(
        model="agent-lite", max_tokens=200, messages=user(HELLO), thinking={"type": "adaptive"}
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.model == "agent-lite"
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == "think 思考"  # type: ignore[union-attr]
    assert texts(message) == "Hello 世界 🌍"
    assert message.stop_reason == "end_turn" and message.stop_sequence is None
    assert message.usage.input_tokens > 0 and message.usage.output_tokens > 0
    sent = (await stack.sim_stats())["last_request_body"]
    assert sent["max_tokens"] == 200 and sent["stream"] is True
    await client.close()


async def test_async_stream_events_and_final_message(stack: Stack) -> None:
    client = async_client(stack)
    kinds: list[str] = []
    text = ""
    async with client.messages.stream(
        model="agent-lite", max_tokens=200, messages=user(HELLO), thinking={"type": "adaptive"}
    ) as stream:
        async for event in stream:
            kinds.append(event.type)
        async for chunk in stream.text_stream:
            text += chunk
        final = await stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-2:] == ["message_delta", "message_stop"]
    assert "thinking" in kinds and "text" in kinds  # the SDK's own derived events
    assert [block.type for block in final.content] == ["thinking", "text"]
    assert texts(final) == "Hello 世界 🌍"
    assert final.stop_reason == "end_turn"
    # message_delta's usage replaces message_start's estimate with the vendor's count.
    stats = await stack.sim_stats()
    assert final.usage.output_tokens == stats["tokens_generated"]
    assert final.usage.input_tokens > 0
    await client.close()


async def test_sync_sdk_whole_and_streamed(stack: Stack) -> None:
    def run() -> tuple[Any, Any]:
        client = anthropic.Anthropic(base_url=stack.gateway.base_url, api_key="x", max_retries=0)
        whole = client.messages.create(
            model="agent-lite",
            max_tokens=100,
            system="You are terse.",
            messages=user(script({"text": "one"})),
        )
        with client.messages.stream(
            model="agent-lite",
            max_tokens=100,
            system=[{"type": "text", "text": "Be terse.", "cache_control": {"type": "ephemeral"}}],
            messages=user(script({"text": "two"})),
        ) as stream:
            streamed = stream.get_final_message()
        client.close()
        return whole, streamed

    whole, streamed = await trio.to_thread.run_sync(run)
    assert texts(whole) == "one" and texts(streamed) == "two"
    body = (await stack.sim_stats())["last_request_body"]
    assert body["messages"][0] == {"role": "system", "content": "Be terse."}


async def test_multi_turn_and_sampling_fields_reach_the_provider(stack: Stack) -> None:
    client = async_client(stack)
    message = await client.messages.create(
        model="agent-lite",
        max_tokens=50,
        system=[{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
        messages=[
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "text", "text": "hello"}]},
            {"role": "user", "content": [{"type": "text", "text": script({"text": "ok"})}]},
        ],
        stop_sequences=["END"],
        metadata={"user_id": "u-1"},
        # The SDK 2.x no longer has the sampling fields; older clients send them.
        extra_body={"temperature": 0.2, "top_p": 0.9, "top_k": 20},
    )
    assert texts(message) == "ok"
    sent = (await stack.sim_stats())["last_request_body"]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "user"]
    assert sent["messages"][0]["content"] == "a\n\nb"
    assert sent["messages"][2]["content"] == "hello"
    assert (sent["temperature"], sent["top_p"], sent["top_k"]) == (0.2, 0.9, 20)
    assert sent["stop"] == ["END"] and sent["max_tokens"] == 50
    await client.close()


async def test_max_tokens_ends_as_max_tokens(stack: Stack) -> None:
    client = async_client(stack)
    message = await client.messages.create(
        model="agent-lite", max_tokens=3, messages=user(script({"text_tokens": 50}))
    )
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == 3
    async with client.messages.stream(
        model="agent-lite", max_tokens=3, messages=user(script({"text_tokens": 50}))
    ) as stream:
        final = await stream.get_final_message()
    assert final.stop_reason == "max_tokens"
    await client.close()


async def test_errors_have_anthropics_shape_and_status(stack: Stack) -> None:
    client = async_client(stack)
    with pytest.raises(anthropic.NotFoundError) as missing:
        await client.messages.create(model="nope", max_tokens=5, messages=user("x"))
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    async with httpx.AsyncClient(timeout=10) as raw:
        url = stack.gateway.base_url + "/v1/messages"
        cases: list[tuple[Any, int, str]] = [
            ({"model": "agent-lite", "messages": user("x")}, 400, "max_tokens: Field required"),
            ({"model": "agent-lite", "max_tokens": 5}, 400, "messages: Field required"),
            (
                {"model": "agent-lite", "max_tokens": 5, "messages": [{"role": "tool"}]},
                400,
                "messages.0.role",
            ),
            ({"model": "agent-lite", "max_tokens": 0, "messages": user("x")}, 400, "max_tokens"),
        ]
        for body, status, says in cases:
            response = await raw.post(url, json=body)
            assert response.status_code == status, response.text
            error = response.json()
            assert error["type"] == "error"
            assert error["error"]["type"] == "invalid_request_error"
            assert says in error["error"]["message"]
        bad_json = await raw.post(url, content=b"{nope", headers={"content-type": "x"})
        assert bad_json.status_code == 400
        assert bad_json.json()["error"]["type"] == "invalid_request_error"
        # A path under the front that does not exist: Anthropic's shape too.
        unknown = await raw.post(url + "/batches", json={})
        assert unknown.status_code == 404
        assert unknown.json()["error"]["type"] == "not_found_error"
        too_long = await raw.post(
            url, json={"model": "agent-lite", "max_tokens": 5, "messages": user("w " * 5000)}
        )
        assert too_long.status_code == 400
        assert too_long.json()["error"]["type"] == "invalid_request_error"
    assert (await stack.sim_stats())["requests"] == 1  # only the prompt too long went up
    await client.close()


async def test_an_overloaded_gateway_answers_529(stack: Stack) -> None:
    from trio_gateway.core.errors import AllProvidersFailed, Overloaded
    from trio_gateway.fronts.messages.events import anthropic_error

    for error in (Overloaded("busy"), AllProvidersFailed([])):
        status, body = anthropic_error(error)
        assert (status, body["error"]["type"]) == (529, "overloaded_error")


@asynccontextmanager
async def keyed_ledger_stack(tmp_path: Path) -> AsyncIterator[tuple[Stack, dict[str, str], Path]]:
    keys = {"alice": new_key(), "bob": new_key()}
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(
        f'[keys.alice]\nsha256 = "{hash_key(keys["alice"])}"\n'
        f'[keys.bob]\nsha256 = "{hash_key(keys["bob"])}"\naliases = ["other"]\n'
    )
    ledger = tmp_path / "usage.sqlite3"
    async with running_sim() as sim:
        text = (
            f'[server]\nlisten = "127.0.0.1:0"\n[auth]\nkeys_file = "{keys_file}"\n'
            f'[usage]\nledger = "{ledger}"\nflush_interval_s = 0.05\n'
            f"[aliases.agent-lite]\n{provider_toml('sim-a', sim.base_url)}"
            f"[aliases.other]\n{provider_toml('sim-b', sim.base_url, alias='other')}"
        )
        config = parse_config(text, source="test.toml", environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as gateway:
            yield Stack(sim=sim, gateway=gateway), keys, ledger


async def test_keys_as_x_api_key_or_bearer_and_the_usage_record(tmp_path: Path) -> None:
    async with keyed_ledger_stack(tmp_path) as (stack, keys, ledger):
        with pytest.raises(anthropic.AuthenticationError) as bad:
            await async_client(stack, "tgw-wrong").messages.create(
                model="agent-lite", max_tokens=5, messages=user("x")
            )
        assert bad.value.body["error"]["type"] == "authentication_error"  # type: ignore[index]
        with pytest.raises(anthropic.PermissionDeniedError) as denied:
            await async_client(stack, keys["bob"]).messages.create(
                model="agent-lite", max_tokens=5, messages=user("x")
            )
        assert denied.value.body["error"]["type"] == "permission_error"  # type: ignore[index]
        # x-api-key, as the SDK sends api_key
        ok = await async_client(stack, keys["alice"]).messages.create(
            model="agent-lite", max_tokens=20, messages=user(script({"text": "hi"}))
        )
        # Authorization: Bearer, as Claude Code sends ANTHROPIC_AUTH_TOKEN
        bearer = anthropic.AsyncAnthropic(
            base_url=stack.gateway.base_url, auth_token=keys["alice"], max_retries=0
        )
        async with bearer.messages.stream(
            model="agent-lite", max_tokens=20, messages=user(script({"text": "yo"}))
        ) as stream:
            streamed = await stream.get_final_message()
        assert texts(ok) == "hi" and texts(streamed) == "yo"
        with trio.fail_after(5):
            while len(rows := ledger_rows(ledger)) < 4:  # noqa: ASYNC110 - batched writes
                await trio.sleep(0.02)
    seen = [(r["endpoint"], r["key"], r["outcome"], r["error_code"]) for r in rows]
    assert seen == [
        ("messages", None, "refused", "invalid_api_key"),
        ("messages", "bob", "refused", "alias_not_allowed"),
        ("messages", "alice", "completed", None),
        ("messages", "alice", "completed", None),
    ]
    assert (rows[2]["prompt_tokens"], rows[2]["completion_tokens"]) == (
        ok.usage.input_tokens + (ok.usage.cache_read_input_tokens or 0),
        ok.usage.output_tokens,
    )


async def test_upstream_errors_before_and_after_the_stream_began(stack: Stack) -> None:
    client = async_client(stack)
    limited = user(script({"status": 429, "retry_after": 2}))
    with pytest.raises(anthropic.RateLimitError) as refused:
        await client.messages.create(model="agent-lite", max_tokens=50, messages=limited)
    assert refused.value.response.headers["retry-after"] == "2"
    assert refused.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    # Once the stream began: an error event, which the SDK raises, and nothing after it.
    cut = user(script({"text": "partial"}, {"status": 529, "in_stream": True}))
    seen = ""
    with pytest.raises(anthropic.APIStatusError) as in_band:
        async with client.messages.stream(model="agent-lite", max_tokens=50, messages=cut) as s:
            async for text in s.text_stream:
                seen += text
    assert seen == "partial"
    assert in_band.value.body["error"]["type"] == "api_error"  # type: ignore[index]
    async with httpx.AsyncClient(timeout=10) as raw:
        response = await raw.post(
            stack.gateway.base_url + "/v1/messages",
            json={"model": "agent-lite", "max_tokens": 50, "stream": True, "messages": cut},
        )
    assert response.status_code == 200
    assert response.text.endswith('"message":"sim-a failed mid-stream: simulated HTTP 529"}}\n\n')
    assert "message_stop" not in response.text
    await client.close()
