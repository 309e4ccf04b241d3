"""Budgets and rate limits end to end: real Redis, real gateways, the simulator."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import coredis
import httpx
import trio
import trio_websocket
from bench.processes import free_port
from coredis.response.types import StreamPending

from tests.e2e.harness import (
    FAST_SIM,
    chat,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)
from tests.e2e.test_auth import ws_round_trip
from tests.e2e.test_usage_ledger import PAUSE_AFTER_K, K, ledger_rows, read_k_content_chunks
from tests.redis_server import RedisServer, pause, resume, running_redis
from trio_gateway.accounting.limit_store import AdmitArgs, RedisStore
from trio_gateway.config.load import parse_config
from trio_gateway.core.keys import hash_key, new_key
from trio_gateway.process.serve import GatewayHandle
from trio_gateway.redis.client import open_redis

TIMEOUT_S = 20
CLI = [sys.executable, "-m", "trio_gateway"]
LIMITS = httpx.Limits(max_connections=50)
PRICES = "price_input_per_mtok = 1000.0\nprice_output_per_mtok = 1000.0\n"  # 1e-3 per token
# Every request of a burst gets a slot at once: a queue timeout on a loaded machine would turn
# an expected answer into a 503.
ROOMY = PRICES + "queue_timeout_s = 30.0\n"


def write_keys(tmp_path: Path, limits: str) -> tuple[Path, str]:
    key = new_key()
    path = tmp_path / "keys.toml"
    path.write_text(f'[keys.alice]\nsha256 = "{hash_key(key)}"\n{limits}\n')
    return path, key


@asynccontextmanager
async def gateway(sim_url: str, keys_file: Path, extra: str = "") -> AsyncIterator[GatewayHandle]:
    text = (
        # status = "open": tests read /metrics with no key.
        f'[server]\nlisten = "127.0.0.1:0"\nstatus = "open"\n'
        f'[auth]\nkeys_file = "{keys_file}"\n'
        f"{extra}\n"
        f"[aliases.agent-lite]\n{provider_toml('sim-a', sim_url, max_inflight=64, extra=ROOMY)}"
    )
    config = parse_config(text, source="test.toml", environ={"SIM_KEY": "sim-key"})
    async with running_gateway(config) as handle:
        yield handle


NO_LEDGER = '[usage]\nledger = "none"\n'


def redis_toml(server: RedisServer, on_error: str = "fail_open", prefix: str = "t:") -> str:
    return (
        f'[redis]\nurl = "{server.url}"\ntimeout_s = 0.5\non_error = "{on_error}"\n'
        f'key_prefix = "{prefix}"\n' + NO_LEDGER
    )


async def post(client: httpx.AsyncClient, base: str, key: str, **fields: Any) -> httpx.Response:
    return await client.post(
        base + "/v1/chat/completions",
        json=chat(**fields),
        headers={"authorization": f"Bearer {key}"},
    )


async def test_budget_refuses_with_402_in_process(tmp_path: Path) -> None:
    keys_file, key = write_keys(tmp_path, "budget = 0.05\nrpm = 100")
    ledger = tmp_path / "usage.sqlite3"
    usage = f'[usage]\nledger = "{ledger}"\n'
    async with (
        running_sim() as sim,
        gateway(sim.base_url, keys_file, usage) as gw,
        httpx.AsyncClient(timeout=TIMEOUT_S) as client,
    ):
        ok = await post(client, gw.base_url, key, max_tokens=10)
        assert ok.status_code == 200, ok.text
        # At 1e-3 per token, max_tokens 100 cannot be covered by what is left.
        refused = await post(client, gw.base_url, key, max_tokens=100)
        unknown = await post(client, gw.base_url, key, model="no-such-model")
    assert refused.status_code == 402, refused.text
    assert refused.json()["error"]["code"] == "budget_exceeded"
    # The key's rate headers ride on its refusals too (the refusal took no rate unit).
    assert refused.headers["x-ratelimit-limit-requests"] == "100"
    assert refused.headers["x-ratelimit-remaining-requests"] == "99"
    assert unknown.status_code == 404
    rows = ledger_rows(ledger)
    assert [(r["outcome"], r["error_code"], r["key"]) for r in rows] == [
        ("completed", None, "alice"),
        ("refused", "budget_exceeded", "alice"),
        ("refused", "model_not_found", "alice"),
    ]


async def test_rpm_refuses_with_429_and_headers(tmp_path: Path) -> None:
    keys_file, key = write_keys(tmp_path, "rpm = 2\ntpm = 100000")
    async with (
        running_sim() as sim,
        gateway(sim.base_url, keys_file) as gw,
        httpx.AsyncClient(timeout=TIMEOUT_S) as client,
    ):
        answers = [await post(client, gw.base_url, key, max_tokens=5) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].headers["x-ratelimit-limit-requests"] == "2"
    assert answers[0].headers["x-ratelimit-remaining-requests"] == "1"
    assert answers[1].headers["x-ratelimit-remaining-requests"] == "0"
    assert answers[0].headers["x-ratelimit-limit-tokens"] == "100000"
    assert "x-ratelimit-reset-tokens" in answers[0].headers
    refused = answers[2]
    assert refused.json()["error"]["code"] == "rate_limited"
    assert int(refused.headers["retry-after"]) >= 29
    assert refused.headers["x-ratelimit-remaining-requests"] == "0"


@asynccontextmanager
async def gateway_process(tmp_path: Path, name: str, body: str) -> AsyncIterator[str]:
    """A gateway in its own process (`trio-gateway serve`), serving ``body``; yields its base
    URL once /healthz answers."""
    port = free_port()
    config = tmp_path / f"{name}.toml"
    config.write_text(f'[server]\nlisten = "127.0.0.1:{port}"\n{body}')
    process = await trio.lowlevel.open_process(
        [*CLI, "serve", "--config", str(config)],
        env={**os.environ, "SIM_KEY": "sim-key"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
            with trio.fail_after(TIMEOUT_S):
                while True:
                    try:
                        if (await client.get(base + "/healthz")).status_code == 200:
                            break
                    except httpx.TransportError:
                        await trio.sleep(0.05)
        yield base
    finally:
        process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()


async def test_rpm_holds_across_two_gateway_processes_sharing_redis(tmp_path: Path) -> None:
    keys_file, key = write_keys(tmp_path, "rpm = 3")
    async with running_redis() as redis, running_sim() as sim:
        body = (
            f'[auth]\nkeys_file = "{keys_file}"\n{redis_toml(redis)}'
            f"[aliases.agent-lite]\n{provider_toml('sim-a', sim.base_url, extra=PRICES)}"
        )
        async with (  # noqa: SIM117 - the gateways need `body` first
            gateway_process(tmp_path, "a", body) as a,
            gateway_process(tmp_path, "b", body) as b,
        ):
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
                codes = [
                    (await post(client, base, key, max_tokens=5)).status_code
                    for base in (a, b, a, b, a)
                ]
    assert codes == [200, 200, 200, 429, 429]


async def test_concurrent_reserves_never_overspend_in_redis() -> None:
    async with running_redis() as redis, open_redis(redis.url) as client:
        store = RedisStore(client, "c:")
        admitted: list[str] = []

        async def reserve(i: int) -> None:
            args = AdmitArgs(
                key="k",
                rpm=None,
                tpm=None,
                tokens=1,
                budget=1000,
                hold=70,
                hold_id=f"h{i}",
                ttl_s=30,
            )
            result = await store.admit(args)
            if result.refused is None:
                admitted.append(args.hold_id)

        async with trio.open_nursery() as nursery:
            for i in range(50):
                nursery.start_soon(reserve, i)
        assert len(admitted) == 1000 // 70
        async with trio.open_nursery() as nursery:
            for hold_id in admitted:
                nursery.start_soon(store.settle, "k", hold_id, 60)
        assert await store.spent("k") == 60 * len(admitted)
        assert await store.live_holds("k") == 0


async def test_a_dead_replicas_hold_expires_at_its_ttl() -> None:
    async with running_redis() as redis, open_redis(redis.url) as client:
        store = RedisStore(client, "ttl:")
        args = AdmitArgs(
            key="k", rpm=None, tpm=None, tokens=1, budget=100, hold=80, hold_id="a", ttl_s=0.2
        )
        assert (await store.admit(args)).refused is None
        # The replica "dies": nobody settles. Until the TTL the hold counts...
        second = AdmitArgs(
            key="k", rpm=None, tpm=None, tokens=1, budget=100, hold=80, hold_id="b", ttl_s=0.2
        )
        assert (await store.admit(second)).refused == "budget"
        await trio.sleep(0.3)
        # ...after it, nothing is left of it.
        assert await store.live_holds("k") == 0
        assert (await store.admit(second)).refused is None


async def test_redis_killed_mid_run_follows_the_policy(tmp_path: Path) -> None:
    keys_file, key = write_keys(tmp_path, "rpm = 1000")
    async with running_redis() as redis, running_sim() as sim:  # noqa: SIM117 - nested need redis
        async with (
            gateway(sim.base_url, keys_file, redis_toml(redis, "fail_open", "o:")) as open_gw,
            gateway(sim.base_url, keys_file, redis_toml(redis, "fail_closed", "c:")) as closed_gw,
        ):
            async with httpx.AsyncClient(timeout=TIMEOUT_S) as client:
                for gw in (open_gw, closed_gw):
                    assert (await post(client, gw.base_url, key, max_tokens=5)).status_code == 200
                redis.kill()
                served = await post(client, open_gw.base_url, key, max_tokens=5)
                refused = await post(client, closed_gw.base_url, key, max_tokens=5)
                assert served.status_code == 200, served.text
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["code"] == "limits_unavailable"
                for gw in (open_gw, closed_gw):
                    metrics = (await client.get(gw.base_url + "/metrics")).text
                    assert 'gateway_limits_store_errors_total{call="admit"} 1.0' in metrics
                await redis.start()  # the same port: the gateways dial again by themselves
                again = await post(client, closed_gw.base_url, key, max_tokens=5)
                assert again.status_code == 200, again.text
                assert again.headers["x-ratelimit-limit-requests"] == "1000"


async def test_a_cancelled_stream_is_billed_the_tokens_received(tmp_path: Path) -> None:
    """The vLLM dialect's continuous usage: the client leaves after K content chunks, and the
    key's spent is exactly the cost of the prompt and the K tokens vLLM generated."""
    keys_file, key = write_keys(tmp_path, "budget = 1000.0")
    async with running_redis() as redis, running_sim() as sim:  # noqa: SIM117 - nested need redis
        async with gateway(sim.base_url, keys_file, redis_toml(redis, prefix="b:")) as gw:
            async with httpx.AsyncClient(
                timeout=TIMEOUT_S, headers={"authorization": f"Bearer {key}"}
            ) as client:
                _, seen = await read_k_content_chunks(
                    client,
                    gw.base_url + "/v1/chat/completions",
                    chat(PAUSE_AFTER_K, stream=True, max_tokens=1000),
                )
            with trio.fail_after(10):
                stats = await sim.engine.wait_until(lambda s: s.aborts == 1 and not s.running)
            async with open_redis(redis.url) as client:
                store = RedisStore(client, "b:")
                with trio.fail_after(5):
                    while await store.live_holds("alice"):  # noqa: ASYNC110 - no event to wait on
                        await trio.sleep(0.02)
                spent = await store.spent("alice")
    assert seen == K and stats.tokens_generated == K
    # 1e-3 per token = 1e6 nanos per token, input and output alike.
    assert spent == (stats.prompt_tokens + K) * 1_000_000


async def test_usage_records_go_to_a_redis_stream_read_by_a_consumer_group(
    tmp_path: Path,
) -> None:
    keys_file, key = write_keys(tmp_path, "rpm = 2")
    async with (
        running_redis() as redis,
        running_sim() as sim,
        coredis.Redis.from_url(redis.url) as billing,
    ):
        # The billing system's group exists before the gateway writes (MKSTREAM creates it).
        assert await billing.xgroup_create("u", "billing", "$", mkstream=True)
        usage = (
            f'[redis]\nurl = "{redis.url}"\n[usage]\nsink = "redis_stream"\nstream = "u"\n'
            "stream_maxlen = 1000\nflush_interval_s = 0.05\n"
        )
        async with (
            gateway(sim.base_url, keys_file, usage) as gw,
            httpx.AsyncClient(timeout=TIMEOUT_S) as http,
        ):
            codes = [(await post(http, gw.base_url, key, max_tokens=5)).status_code for _ in "abc"]
        # The gateway stopped: its queue was written out.
        reply = await billing.xreadgroup("billing", "worker-1", {"u": ">"}, count=10)
        assert reply is not None
        [(stream, entries)] = reply.items()
        records = []
        for entry in entries:
            records.append(dict(entry.field_values))
            assert await billing.xack("u", "billing", [entry.identifier]) == 1
        pending = await billing.xpending("u", "billing")
    assert stream == b"u" and codes == [200, 200, 429]
    assert [(r[b"outcome"], r[b"key"], r[b"error_code"]) for r in records] == [
        (b"completed", b"alice", b""),
        (b"completed", b"alice", b""),
        (b"refused", b"alice", b"rate_limited"),
    ]
    assert int(records[0][b"completion_tokens"]) > 0 and records[0][b"estimated"] == b"0"
    assert isinstance(pending, StreamPending) and pending.pending == 0


async def test_websocket_requests_over_the_rpm_get_an_error_event(tmp_path: Path) -> None:
    keys_file, key = write_keys(tmp_path, "rpm = 1")
    async with running_sim() as sim, gateway(sim.base_url, keys_file, NO_LEDGER) as gw:
        url = gw.base_url.replace("http://", "ws://") + f"/v1/ws?access_token={key}"
        with trio.fail_after(TIMEOUT_S):
            async with trio_websocket.open_websocket_url(url) as ws:
                first = await ws_round_trip(ws, "a", "agent-lite")
                second = await ws_round_trip(ws, "b", "agent-lite")
    assert first[-1]["type"] == "response.done"
    assert second[-1]["type"] == "error" and second[-1]["code"] == "rate_limited"
    assert second[-1]["retryable"] is True and second[-1]["retry_after_s"] > 50


async def test_a_redis_that_does_not_answer_costs_a_request_one_deadline(tmp_path: Path) -> None:
    keys_file, key = write_keys(tmp_path, "rpm = 1000\nbudget = 10.0")
    async with (
        running_redis() as redis,
        running_sim() as sim,
        gateway(sim.base_url, keys_file, redis_toml(redis, "fail_closed", "s:")) as gw,
        httpx.AsyncClient(timeout=TIMEOUT_S) as client,
    ):
        assert (await post(client, gw.base_url, key, max_tokens=5)).status_code == 200
        pause(redis)
        started = trio.current_time()
        refused = await post(client, gw.base_url, key, max_tokens=5)
        waited = trio.current_time() - started
        resume(redis)
        again = await post(client, gw.base_url, key, max_tokens=5)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "limits_unavailable"
    assert waited < 0.5 + 1.0  # timeout_s = 0.5, plus the answer's own time
    assert again.status_code == 200, again.text


async def test_a_killed_gateway_leaves_no_hold_past_its_ttl(tmp_path: Path) -> None:
    """A real replica process, SIGKILLed mid-stream: its hold counts until hold_ttl_s, then
    nothing of it is left in Redis."""
    keys_file, key = write_keys(tmp_path, "budget = 1000.0")
    async with running_redis() as redis, running_sim() as sim, open_redis(redis.url) as shared:
        port = free_port()
        config = tmp_path / "gateway.toml"
        config.write_text(
            f'[server]\nlisten = "127.0.0.1:{port}"\n[auth]\nkeys_file = "{keys_file}"\n'
            f"{redis_toml(redis, prefix='k:')}[limits]\nhold_ttl_s = 1.0\n"
            f"[aliases.agent-lite]\n{provider_toml('sim-a', sim.base_url, extra=PRICES)}"
        )
        process = await trio.lowlevel.open_process(
            [*CLI, "serve", "--config", str(config)],
            env={**os.environ, "SIM_KEY": "sim-key"},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        store = RedisStore(shared, "k:")
        base = f"http://127.0.0.1:{port}"
        try:
            async with httpx.AsyncClient(
                timeout=TIMEOUT_S, headers={"authorization": f"Bearer {key}"}
            ) as client:
                with trio.fail_after(TIMEOUT_S):
                    while True:
                        try:
                            if (await client.get(base + "/healthz")).status_code == 200:
                                break
                        except httpx.TransportError:
                            await trio.sleep(0.05)
                    seen = 0
                    async with client.stream(
                        "POST",
                        base + "/v1/chat/completions",
                        json=chat(PAUSE_AFTER_K, stream=True, max_tokens=100),
                    ) as response:
                        async for line in response.aiter_lines():
                            seen += line.startswith("data: {") and '"content":"' in line
                            if seen == K:
                                # Killed while the stream is open: no cleanup of any kind runs.
                                process.kill()
                                await process.wait()
                                break
        finally:
            process.kill()
        assert seen == K
        assert await store.live_holds("alice") == 1  # nobody settled it
        with trio.fail_after(5):
            while await store.live_holds("alice"):  # noqa: ASYNC110 - Redis expires it
                await trio.sleep(0.05)
        assert await store.spent("alice") == 0


async def test_a_keyed_burst_leaves_one_record_per_request_and_no_hold(tmp_path: Path) -> None:
    """36 concurrent requests from four keys on a shared Redis: completed, cancelled, failed,
    and refused by each gate (no key, a wrong key, an alias not allowed, the rpm, the budget).
    The ledger holds exactly one record per request, with its key and outcome; every hold is
    settled; only the completed and cancelled ones were billed."""
    names = {name: new_key() for name in ("alice", "bob", "carol", "dave")}
    entries = {
        "alice": "budget = 1000.0",
        "bob": "rpm = 3",
        "carol": 'aliases = ["other"]',
        "dave": "budget = 0.001",  # 1 token at 1e-3: nothing fits
    }
    keys_file = tmp_path / "keys.toml"
    keys_file.write_text(
        "".join(f'[keys.{n}]\nsha256 = "{hash_key(k)}"\n{entries[n]}\n' for n, k in names.items())
    )
    ledger = tmp_path / "usage.sqlite3"
    request_ids: list[str] = []
    expected: Counter[tuple[str, str | None, str | None]] = Counter()
    async with running_redis() as redis, running_sim(FAST_SIM) as sim:
        extra = (
            f'[redis]\nurl = "{redis.url}"\ntimeout_s = 2.0\non_error = "fail_closed"\n'
            f'[usage]\nledger = "{ledger}"\n'
            f"[aliases.other]\n{provider_toml('sim-b', sim.base_url, alias='other')}"
        )
        async with gateway(sim.base_url, keys_file, extra) as gw:
            url = gw.base_url + "/v1/chat/completions"

            async def send(who: str | None, body: dict[str, Any], status: int) -> None:
                headers = {"authorization": f"Bearer {names.get(who or '', 'sk-wrong')}"}
                if who is None:
                    headers = {}
                response = await client.post(url, json=body, headers=headers)
                assert response.status_code == status, response.text
                request_ids.append(response.headers["x-request-id"])

            async def cancelled() -> None:
                auth = {"authorization": f"Bearer {names['alice']}"}
                async with httpx.AsyncClient(timeout=TIMEOUT_S, headers=auth) as own:
                    request_id, _ = await read_k_content_chunks(
                        own, url, chat(PAUSE_AFTER_K, stream=True, max_tokens=100)
                    )
                request_ids.append(request_id)

            completed = chat(script({"text_tokens": 4}), max_tokens=10)
            failed = chat(script({"status": 500}), max_tokens=10)
            plan: list[tuple[tuple[str, str | None, str | None], Any]] = []
            for _ in range(8):
                plan.append((("completed", "alice", None), partial(send, "alice", completed, 200)))
            for _ in range(6):
                plan.append((("cancelled", "alice", "client_gone"), cancelled))
            for _ in range(4):
                plan.append(
                    (("failed", "alice", "upstream_error"), partial(send, "alice", failed, 502))
                )
            for _ in range(3):
                plan.append(
                    (("refused", None, "invalid_api_key"), partial(send, None, completed, 401))
                )
                plan.append(
                    (("refused", None, "invalid_api_key"), partial(send, "nobody", completed, 401))
                )
                plan.append(
                    (
                        ("refused", "carol", "alias_not_allowed"),
                        partial(send, "carol", completed, 403),
                    )
                )
                plan.append(
                    (("refused", "dave", "budget_exceeded"), partial(send, "dave", completed, 402))
                )
            # bob's rpm lets exactly 3 of his 6 concurrent requests in, whichever they are.
            statuses: list[int] = []

            async def bob() -> None:
                auth = {"authorization": f"Bearer {names['bob']}"}
                response = await client.post(url, json=completed, headers=auth)
                statuses.append(response.status_code)
                request_ids.append(response.headers["x-request-id"])

            async with (
                httpx.AsyncClient(
                    timeout=TIMEOUT_S, limits=httpx.Limits(max_connections=50)
                ) as client,
                trio.open_nursery() as nursery,
            ):
                for outcome, run in plan:
                    expected[outcome] += 1
                    nursery.start_soon(run)
                for _ in range(6):
                    nursery.start_soon(bob)
            expected[("completed", "bob", None)] += 3
            expected[("refused", "bob", "rate_limited")] += 3
            with trio.fail_after(10):
                await sim.engine.wait_until(lambda s: s.aborts == 6 and not s.running)
            async with open_redis(redis.url) as shared:
                store = RedisStore(shared, "tgw:")
                with trio.fail_after(5):
                    while await store.live_holds("alice"):  # noqa: ASYNC110 - settles in flight
                        await trio.sleep(0.02)
                spent = {n: await store.spent(n) for n in ("alice", "dave")}
        rows = ledger_rows(ledger)
    assert sorted(statuses) == [200, 200, 200, 429, 429, 429]
    assert len(rows) == len(request_ids) == 36
    assert sorted(r["request_id"] for r in rows) == sorted(request_ids)
    assert Counter((r["outcome"], r["key"], r["error_code"]) for r in rows) == expected
    billed = [r for r in rows if r["key"] == "alice" and r["outcome"] != "failed"]
    tokens = sum(r["prompt_tokens"] + r["completion_tokens"] for r in billed)
    assert spent == {"alice": tokens * 1_000_000, "dave": 0}
