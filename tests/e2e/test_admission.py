"""Admission control over real sockets: gates, spill, the alias queue, cool-down, /metrics."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import attrs
import httpx
import trio

from tests.e2e.harness import (
    FAST_SIM,
    chat,
    gateway_config,
    provider_toml,
    running_gateway,
    running_sim,
    script,
)

SLOW = attrs.evolve(FAST_SIM, max_num_seqs=32, decode_step_s=0.005, decode_step_s_per_seq=0.0)
ANSWER = script({"text_tokens": 60})  # ~0.3 s per stream at 5 ms a step


async def fan_out(url: str, count: int, **fields: Any) -> list[httpx.Response]:
    responses: list[httpx.Response] = []
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(limits=limits, timeout=30) as client, trio.open_nursery() as n:

        async def one() -> None:
            responses.append(
                await client.post(url + "/v1/chat/completions", json=chat(ANSWER, **fields))
            )

        for _ in range(count):
            n.start_soon(one)
    return responses


def metric(text: str, name: str, **labels: str) -> float:
    """The value of one sample in a Prometheus text page (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split(" ")[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def requests_total(page: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("gateway_requests_total{")
    )


async def scrape_when(base_url: str, ready: Callable[[str], bool]) -> str:
    """/metrics once it shows what the test waits for: a request is recorded just after its
    last byte went out, so a scrape right after a response may be a moment early."""
    page = ""
    async with httpx.AsyncClient() as client:

        async def fetch() -> bool:
            nonlocal page
            page = (await client.get(base_url + "/metrics")).text
            return ready(page)

        with trio.fail_after(5):
            while not await fetch():  # noqa: ASYNC110 - the page is the only witness
                await trio.sleep(0.01)
    return page


async def test_gate_holds_upstream_concurrency_and_the_rest_spills_to_the_fallback() -> None:
    async with running_sim(SLOW) as primary, running_sim(SLOW) as fallback:
        providers = provider_toml(
            "primary", primary.base_url, max_inflight=4, extra="queue_timeout_s = 0.05"
        ) + provider_toml("fallback", fallback.base_url, weight=0, max_inflight=32)
        async with running_gateway(gateway_config(providers)) as gateway:
            responses = await fan_out(gateway.base_url, 20, stream=True)
            page = await scrape_when(gateway.base_url, lambda p: requests_total(p) == 20)
        assert [r.status_code for r in responses] == [200] * 20
        p = primary.engine.stats()
        assert p.max_running_seen <= 4
        assert p.max_waiting_seen == 0  # the engine never queued: the gateway did
        f = fallback.engine.stats()
        assert p.requests + f.requests == 20
        assert f.requests >= 10
        spilled = metric(
            page,
            "gateway_spills_total",
            alias="agent-lite",
            from_provider="primary",
            to_provider="fallback",
        )
        assert spilled == f.requests
        ok = metric(page, "gateway_requests_total", provider="primary", outcome="ok")
        assert ok == p.requests
        assert metric(page, "gateway_provider_in_flight", provider="primary") == 0
        assert metric(page, "gateway_provider_max_inflight", provider="primary") == 4


async def test_without_a_fallback_saturation_is_503_overloaded_with_retry_after() -> None:
    async with running_sim(SLOW) as sim:
        providers = provider_toml(
            "only", sim.base_url, max_inflight=4, extra="queue_timeout_s = 0.05"
        )
        async with running_gateway(gateway_config(providers)) as gateway:
            responses = await fan_out(gateway.base_url, 20)
            page = await scrape_when(gateway.base_url, lambda p: requests_total(p) == 20)
        refused = [r for r in responses if r.status_code == 503]
        assert len(refused) >= 10
        assert all(r.json()["error"]["code"] == "overloaded" for r in refused)
        assert all(int(r.headers["retry-after"]) >= 1 for r in refused)
        stats = sim.engine.stats()
        assert stats.max_running_seen <= 4 and stats.max_waiting_seen == 0
        # A refused request sent nothing upstream.
        assert stats.requests == 20 - len(refused)
        assert metric(page, "gateway_refusals_total", reason="saturated") == len(refused)


async def test_queue_policy_waits_in_a_bounded_queue() -> None:
    async with running_sim(SLOW) as primary, running_sim(SLOW) as fallback:
        providers = provider_toml("primary", primary.base_url, max_inflight=4) + provider_toml(
            "fallback", fallback.base_url, weight=0
        )
        text = gateway_config(providers)
        alias = attrs.evolve(
            text.aliases["agent-lite"], on_saturated="queue", max_queued=10, max_queue_wait_s=20
        )
        config = attrs.evolve(text, aliases={"agent-lite": alias})
        async with running_gateway(config) as gateway:
            responses = await fan_out(gateway.base_url, 20)
        codes = sorted(r.status_code for r in responses)
        # 4 run at once, 10 wait their turn, 6 find the queue full; none spill.
        assert codes == [200] * 14 + [503] * 6
        full = [r for r in responses if r.status_code == 503]
        assert all("queue full" in r.json()["error"]["message"] for r in full)
        assert all("retry-after" in r.headers for r in full)
        assert primary.engine.stats().max_running_seen <= 4
        assert fallback.engine.stats().requests == 0


async def test_two_aliases_sharing_a_provider_share_its_gate() -> None:
    async with running_sim(SLOW) as sim:
        providers = provider_toml(
            "shared", sim.base_url, max_inflight=3, extra="queue_timeout_s = 10"
        )
        config = gateway_config(providers + providers.replace("agent-lite", "other"))
        async with running_gateway(config) as gateway:
            url = gateway.base_url + "/v1/chat/completions"
            codes: list[int] = []
            async with httpx.AsyncClient(timeout=30) as client, trio.open_nursery() as nursery:

                async def one(alias: str) -> None:
                    response = await client.post(url, json={**chat(ANSWER), "model": alias})
                    codes.append(response.status_code)

                for i in range(10):
                    nursery.start_soon(one, "agent-lite" if i % 2 else "other")
        assert codes == [200] * 10
        assert sim.engine.stats().max_running_seen <= 3
        assert sim.engine.stats().max_waiting_seen == 0


async def test_429_retry_after_cools_the_provider_down() -> None:
    async with running_sim() as a, running_sim() as b:
        providers = provider_toml("a", a.base_url, weight=1000) + provider_toml(
            "b", b.base_url, weight=1
        )
        async with running_gateway(gateway_config(providers)) as gateway:
            url = gateway.base_url + "/v1/chat/completions"
            busy = script({"status": 429, "retry_after": 30, "times": 1})
            async with httpx.AsyncClient() as client:
                # b answers this script with a 429 once too: spend that on b directly.
                direct = await client.post(
                    b.base_url + "/v1/chat/completions",
                    json={**chat(busy), "model": "qwen3-32b"},
                    headers={"authorization": "Bearer sim-key"},
                )
                assert direct.status_code == 429
                b_before = b.engine.stats().requests
                first = await client.post(url, json=chat(busy))
                # Answered by b after a's 429, before anything reached the client.
                assert first.status_code == 200
                assert a.engine.stats().requests == 1
                for _ in range(5):
                    assert (await client.post(url, json=chat())).status_code == 200
            page = await scrape_when(gateway.base_url, lambda p: requests_total(p) == 6)
        # a rests for its 30 s: everything went to b although a weighs 1000 times more.
        assert a.engine.stats().requests == 1
        assert b.engine.stats().requests - b_before == 6
        assert metric(page, "gateway_provider_cooling_down", provider="a") == 1
        assert metric(page, "gateway_failovers_total", from_provider="a", to_provider="b") == 1
