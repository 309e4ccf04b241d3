"""Priority classes end to end: keys of two classes behind one busy slot, the alias queue
serving the paid one first, vLLM's `priority` field on the wire, and x-priority through the
OpenAI SDK."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anthropic
import attrs
import httpx
import openai
import pytest
import trio
import trio_websocket

from tests.e2e.harness import (
    Stack,
    chat,
    provider_toml,
    running_gateway,
    running_sim,
    script,
    wait_until,
)
from trio_gateway.config.load import parse_config
from trio_gateway.core.events_codec import TERMINAL_TYPES
from trio_gateway.core.keys import hash_key, new_key
from trio_gateway.core.usage import UsageRecord

TIMEOUT_S = 20
LONG = script({"text_tokens": 5000})  # held until cancelled


@asynccontextmanager
async def classes(
    tmp_path: Path, max_inflight: int = 1, extra: str = ""
) -> AsyncIterator[tuple[Stack, dict[str, str]]]:
    """paid (priority 0) and free (priority 1) keys; one slot, queued, priority_scheduling."""
    keys = {"paid": new_key(), "free": new_key()}
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(
        "".join(
            f'[keys.{name}]\nsha256 = "{hash_key(key)}"\npriority = {i}\n'
            for i, (name, key) in enumerate(keys.items())
        )
    )
    async with running_sim() as sim:
        provider = provider_toml(
            "sim-a",
            sim.base_url,
            max_inflight=max_inflight,
            extra="priority_scheduling = true\n" + extra,
        )
        text = (
            f'[server]\nlisten = "127.0.0.1:0"\n[auth]\nkeys_file = "{keys_file}"\n'
            f'[aliases.agent-lite]\non_saturated = "queue"\n{provider}'
        )
        config = parse_config(text, source="test.toml", environ={"SIM_KEY": "sim-key"})
        async with running_gateway(config) as gateway:
            yield Stack(sim=sim, gateway=gateway), keys


def bearer(key: str, **more: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}", **more}


async def test_the_alias_queue_serves_the_paid_class_first(tmp_path: Path) -> None:
    async with classes(tmp_path) as (stack, keys), httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        url = stack.v1 + "/chat/completions"
        upstream = stack.gateway.router.upstreams["sim-a"]
        answers: dict[str, int] = {}

        async def ask(name: str, key: str) -> None:
            response = await client.post(url, json=chat(name, max_tokens=4), headers=bearer(key))
            answers[name] = response.status_code

        hold = trio.CancelScope()

        async def held() -> None:
            with hold:
                body = chat(LONG, stream=True)
                async with client.stream(
                    "POST", url, json=body, headers=bearer(keys["free"])
                ) as streamed:
                    async for _ in streamed.aiter_bytes():
                        pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(held)
            await wait_until(lambda: upstream.statistics().in_flight == 1)
            # The free request queues first, the paid one after it.
            nursery.start_soon(ask, "free-first", keys["free"])
            await wait_until(lambda: upstream.statistics().waiting == 1)
            nursery.start_soon(ask, "paid-second", keys["paid"])
            await wait_until(lambda: upstream.statistics().waiting == 2)
            hold.cancel()
        stats = await stack.sim_stats()
    assert answers == {"free-first": 200, "paid-second": 200}
    served = [
        (b["messages"][0]["content"], b["priority"])
        for b in stats["last_request_bodies"]
        if b["messages"][0]["content"] != LONG
    ]
    assert served == [("paid-second", 0), ("free-first", 1)]


async def test_a_reserved_slot_serves_the_paid_class_while_the_free_one_waits(
    tmp_path: Path,
) -> None:
    """2 slots, 1 reserved for priority 0: a free stream runs, a second free request queues
    although a slot is free, and a paid one is answered at once, without waiting for them."""
    reserved = "reserved_slots = 1\nreserved_for_priority_at_most = 0\n"
    async with (
        classes(tmp_path, max_inflight=2, extra=reserved) as (stack, keys),
        httpx.AsyncClient(timeout=TIMEOUT_S) as client,
    ):
        url = stack.v1 + "/chat/completions"
        upstream = stack.gateway.router.upstreams["sim-a"]
        answers: dict[str, int] = {}

        async def held(name: str) -> None:
            body = chat(LONG, stream=True)
            async with client.stream(
                "POST", url, json=body, headers=bearer(keys["free"])
            ) as streamed:
                answers[name] = streamed.status_code
                async for _ in streamed.aiter_bytes():
                    pass

        async with trio.open_nursery() as nursery:
            nursery.start_soon(held, "free-running")
            await wait_until(lambda: upstream.statistics().in_flight == 1)
            nursery.start_soon(held, "free-waiting")
            await wait_until(lambda: upstream.statistics().waiting == 1)
            with trio.fail_after(TIMEOUT_S):
                paid = await client.post(
                    url, json=chat("paid", max_tokens=4), headers=bearer(keys["paid"])
                )
            assert paid.status_code == 200
            stats = upstream.statistics()
            assert (stats.in_flight, stats.waiting) == (1, 1)  # the paid one came and went
            nursery.cancel_scope.cancel()
    assert answers == {"free-running": 200}


async def test_x_priority_through_the_sdk_may_only_lower_a_keys_priority(
    tmp_path: Path,
) -> None:
    async with classes(tmp_path) as (stack, keys):

        def run(key: str, **options: Any) -> str:
            client = openai.OpenAI(base_url=stack.v1, api_key=key, max_retries=0, timeout=TIMEOUT_S)
            completion = client.chat.completions.create(
                model="agent-lite",
                messages=[{"role": "user", "content": "hello"}],
                max_tokens=4,
                **options,
            )
            return completion.choices[0].message.content or ""

        await trio.to_thread.run_sync(lambda: run(keys["paid"], extra_headers={"x-priority": "7"}))
        assert (await stack.sim_stats())["last_request_body"]["priority"] == 7
        await trio.to_thread.run_sync(lambda: run(keys["free"], extra_body={"priority": 3}))
        assert (await stack.sim_stats())["last_request_body"]["priority"] == 3
        with pytest.raises(openai.BadRequestError) as refused:
            await trio.to_thread.run_sync(
                lambda: run(keys["free"], extra_headers={"x-priority": "0"})
            )
        with pytest.raises(openai.BadRequestError) as malformed:
            await trio.to_thread.run_sync(
                lambda: run(keys["paid"], extra_headers={"x-priority": "urgent"})
            )
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "invalid_request"
    assert error["param"] == "x-priority"
    assert error["message"] == (
        "x-priority 0 would put this request before its own priority 1 (key 'free'): "
        "a request may only lower its priority, to a larger number"
    )
    assert isinstance(malformed.value.body, dict)
    assert malformed.value.body["param"] == "x-priority"


async def test_the_websocket_front_reads_the_bodys_priority(tmp_path: Path) -> None:
    async with classes(tmp_path) as (stack, keys):
        url = stack.gateway.base_url.replace("http://", "ws://") + "/v1/ws"
        headers = [(b"authorization", f"Bearer {keys['free']}".encode())]
        with trio.fail_after(TIMEOUT_S):
            async with trio_websocket.open_websocket_url(url, extra_headers=headers) as ws:

                async def ask(id: str, priority: int) -> dict[str, Any]:
                    body = chat("hello", max_tokens=2, priority=priority)
                    await ws.send_message(json.dumps({"type": "request", "id": id, "body": body}))
                    while True:
                        event: dict[str, Any] = json.loads(await ws.get_message())
                        if event.get("id") == id and event["type"] in TERMINAL_TYPES:
                            return event

                refused = await ask("too-high", 0)
                served = await ask("lowered", 4)
        sent = (await stack.sim_stats())["last_request_body"]
    assert sent["priority"] == 4
    assert (refused["type"], refused["code"]) == ("error", "invalid_request")
    assert "priority 0 would put this request before its own priority 1" in refused["message"]
    assert served["type"] != "error", served


@attrs.define
class Records:
    records: list[UsageRecord] = attrs.field(factory=list)

    def offer(self, record: UsageRecord) -> bool:
        self.records.append(record)
        return True


async def test_the_usage_record_and_the_metric_carry_the_class(tmp_path: Path) -> None:
    """Each record notes the class the request was served with; the metric counts requests per
    class, a class beyond 9 counted as 10+ (bounded series whatever x-priority says)."""
    async with classes(tmp_path) as (stack, keys), httpx.AsyncClient(timeout=TIMEOUT_S) as client:
        records = Records()
        stack.gateway.router.usage = records
        url = stack.v1 + "/chat/completions"
        for key, lowered in [("paid", None), ("free", None), ("free", "250"), ("paid", "12")]:
            headers = bearer(keys[key], **({"x-priority": lowered} if lowered else {}))
            response = await client.post(url, json=chat("hi", max_tokens=2), headers=headers)
            assert response.status_code == 200, response.text
        metrics = stack.gateway.router.metrics.registry

        def counted(label: str) -> float:
            value = metrics.get_sample_value(
                "gateway_requests_by_priority_total",
                {"alias": "agent-lite", "priority": label, "outcome": "ok"},
            )
            return float(value or 0.0)

        assert [counted(label) for label in ("0", "1", "10+", "12", "250")] == [1, 1, 2, 0, 0]
    assert [r.priority for r in records.records] == [0, 1, 250, 12]


async def test_the_agent_fronts_take_the_keys_priority_and_x_priority(tmp_path: Path) -> None:
    async with classes(tmp_path) as (stack, keys):

        def messages(key: str, **options: Any) -> None:
            client = anthropic.Anthropic(
                base_url=stack.v1.removesuffix("/v1"), api_key=key, max_retries=0
            )
            client.messages.create(
                model="agent-lite",
                max_tokens=4,
                messages=[{"role": "user", "content": "hello"}],
                **options,
            )

        def responses(key: str, **options: Any) -> None:
            client = openai.OpenAI(base_url=stack.v1, api_key=key, max_retries=0, timeout=TIMEOUT_S)
            client.responses.create(
                model="agent-lite", input="hello", max_output_tokens=16, **options
            )

        await trio.to_thread.run_sync(lambda: messages(keys["free"]))
        assert (await stack.sim_stats())["last_request_body"]["priority"] == 1
        await trio.to_thread.run_sync(
            lambda: messages(keys["paid"], extra_headers={"x-priority": "4"})
        )
        assert (await stack.sim_stats())["last_request_body"]["priority"] == 4
        await trio.to_thread.run_sync(
            lambda: responses(keys["paid"], extra_headers={"x-priority": "5"})
        )
        assert (await stack.sim_stats())["last_request_body"]["priority"] == 5
        with pytest.raises(anthropic.BadRequestError) as refused:
            await trio.to_thread.run_sync(
                lambda: messages(keys["free"], extra_headers={"x-priority": "0"})
            )
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "may only lower its priority" in body["error"]["message"]
